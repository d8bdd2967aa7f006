"""The node probe: parsing real nvidia-smi output, and probing real sshd nodes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from tests.sshd.fleet import Fleet

from gpu_pool.model import NodeState
from gpu_pool.probe import (
    ComputeProcess,
    GpuReading,
    NodeProbe,
    ProbeError,
    model_of,
    parse_compute_apps_csv,
    parse_gpu_csv,
    probe_node,
    record_probe,
)
from gpu_pool.simnode.gpus import REPORTED_MODELS, sim_gpus

AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(("name", "memory", "model"), [
    # Names and memory.total as real cards report them (public nvidia-smi outputs).
    ("NVIDIA A100-SXM4-80GB", 81920, "A100"),
    ("NVIDIA A100 80GB PCIe", 81920, "A100"),
    ("NVIDIA A100-SXM4-40GB", 40960, "A100-40G"),
    ("NVIDIA A100-PCIE-40GB", 40536, "A100-40G"),
    ("NVIDIA H100 80GB HBM3", 81559, "H100"),
    ("NVIDIA H100 PCIe", 81559, "H100"),
    ("NVIDIA H200", 143771, "H200"),
    ("Tesla T4", 15360, "T4"),
    ("Tesla P100-PCIE-16GB", 16384, "P100"),
    ("Tesla V100-SXM2-16GB", 16160, "V100M16"),
    ("Tesla V100-PCIE-32GB", 32768, "V100M32"),
    ("NVIDIA A10", 23028, "A10"),
    ("NVIDIA A10G", 23028, "A10"),
    ("NVIDIA L4", 23034, "L4"),
    ("NVIDIA L40S", 46068, "L40S"),
    ("NVIDIA A30", 24576, "A30"),
    ("NVIDIA GeForce RTX 3090", 24576, None),
    ("NVIDIA GeForce RTX 4090", 24564, None),
])
def test_model_names(name: str, memory: int, model: str | None) -> None:
    assert model_of(name, memory) == model


def test_every_simulated_card_maps_back_to_its_model() -> None:
    for model, (name, memory) in REPORTED_MODELS.items():
        assert model_of(name, memory) == model


def test_parse_noheader_nounits() -> None:
    text = ("0, NVIDIA A100-SXM4-80GB, 81920, 75899, 99, 82, GPU-b0354a1a-37c2-086d-f6fe-953b6fac5c3e\n"
            "1, NVIDIA A100-SXM4-80GB, 81920, 512, 0, 41, GPU-0f2c\n")
    assert parse_gpu_csv(text) == (
        GpuReading(0, "NVIDIA A100-SXM4-80GB", "A100", 81920, 75899, 99.0, 82.0,
                   "GPU-b0354a1a-37c2-086d-f6fe-953b6fac5c3e"),
        GpuReading(1, "NVIDIA A100-SXM4-80GB", "A100", 81920, 512, 0.0, 41.0, "GPU-0f2c"),
    )


def test_parse_with_header_and_units() -> None:
    text = ("index, name, memory.total [MiB], memory.used [MiB], utilization.gpu [%], "
            "temperature.gpu, uuid\n"
            "0, Tesla T4, 15360 MiB, 0 MiB, 0 %, 34, GPU-1\n"
            "1, Tesla T4, 15360 MiB, 1203 MiB, 37 %, 61, GPU-2\n")
    readings = parse_gpu_csv(text)
    assert [(r.model, r.memory_used_mib, r.utilization_pct) for r in readings] == [
        ("T4", 0, 0.0), ("T4", 1203, 37.0)]


def test_unhealthy_and_unknown_values() -> None:
    text = ("0, NVIDIA H100 80GB HBM3, 81559, [GPU requires reset], [GPU requires reset], 40, GPU-a\n"
            "1, NVIDIA H100 80GB HBM3, 81559, 100, [N/A], [N/A], GPU-b\n"
            "2, NVIDIA H100 80GB HBM3, ERR!, ERR!, ERR!, ERR!, GPU-c\n")
    a, b, c = parse_gpu_csv(text)
    assert (a.healthy, a.problem, a.memory_used_mib) == (False, "[GPU requires reset]", None)
    assert (b.healthy, b.utilization_pct, b.temperature_c) == (True, None, None)
    assert (c.healthy, c.memory_total_mib, c.to_gpu().memory_mib) == (False, None, 0)
    assert a.to_gpu().healthy is False


@pytest.mark.parametrize(("text", "fragment"), [
    ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
     "Make sure that the latest NVIDIA driver is installed and running.\n", "expected 7 fields"),
    ("0, Tesla T4, 15360, 0, 0\n", "got 5"),
    ("x, Tesla T4, 15360, 0, 0, 30, GPU-1\n", "index 'x'"),
    ("0, Tesla T4, lots, 0, 0, 30, GPU-1\n", "memory.total 'lots'"),
    ("0, Tesla T4, 15360, 0, 0, 30, GPU-1\n0, Tesla T4, 15360, 0, 0, 30, GPU-2\n", "index 0 twice"),
])
def test_malformed_output_is_a_clear_error(text: str, fragment: str) -> None:
    with pytest.raises(ProbeError, match="line") as info:
        parse_gpu_csv(text)
    assert fragment in str(info.value)


def test_parse_compute_apps() -> None:
    assert parse_compute_apps_csv("GPU-1, 4242, 1203\nGPU-2, 77, [N/A]\n") == (
        ComputeProcess("GPU-1", 4242, 1203), ComputeProcess("GPU-2", 77, None))
    with pytest.raises(ProbeError):
        parse_compute_apps_csv("GPU-1, pid, 3\n")


class RecordingStore:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def record_gpu_readings(self, node, readings, at):  # type: ignore[no-untyped-def]
        self.calls.append(("readings", node, len(readings), at))

    def set_node_state(self, name, state, actor, reason):  # type: ignore[no-untyped-def]
        self.calls.append(("state", name, state, actor, reason))


@pytest.mark.slow
def test_probe_over_ssh_reads_the_node(sshd_fleet: Fleet) -> None:
    node = sshd_fleet["node-a"]
    probe = probe_node("node-a", node.conn_id, at=AT)
    assert probe.state is NodeState.UP and probe.error is None
    assert [(r.index, r.model, r.memory_total_mib, r.uuid) for r in probe.readings] == [
        (g.index, "A100", 81920, g.uuid) for g in node.gpus]
    assert [g.model for g in probe.gpus] == ["A100"] * 4
    store = RecordingStore()
    record_probe(store, probe, current=NodeState.UP)
    assert store.calls == [("readings", "node-a", 4, AT)]


@pytest.mark.slow
def test_probe_of_a_broken_driver_marks_the_node_down(sshd_fleet: Fleet) -> None:
    node = sshd_fleet["node-b"]
    node.write_gpus(node.gpus, raw_output="Unable to determine the device handle for GPU "
                    "0000:3B:00.0: Unknown Error\n")
    try:
        probe = probe_node("node-b", node.conn_id, at=AT)
    finally:
        node.write_gpus(node.gpus)
    assert probe.reachable and probe.state is NodeState.DOWN
    assert "expected 7 fields" in (probe.error or "")
    store = RecordingStore()
    record_probe(store, probe, current=NodeState.UP)
    assert store.calls == [("state", "node-b", NodeState.DOWN, "probe", probe.error)]


@pytest.mark.slow
def test_probe_sees_changed_readings(sshd_fleet: Fleet) -> None:
    node = sshd_fleet["node-b"]
    busy = tuple(g.__class__(**{**g.__dict__, "memory_used_mib": 9000, "utilization_pct": 88})
                 for g in sim_gpus("T4", 2, seed="node-b"))
    node.write_gpus(busy)
    try:
        probe = probe_node("node-b", node.conn_id, at=AT)
    finally:
        node.write_gpus(node.gpus)
    assert [(r.memory_used_mib, r.utilization_pct) for r in probe.readings] == [(9000, 88.0)] * 2


@pytest.mark.slow
def test_unreachable_node_is_down(sshd_fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    node = sshd_fleet["node-a"]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_NODE_GONE", node.conn_uri.replace(f":{node.port}/", ":1/"))
    probe = probe_node("gone", "gpu_node_gone", at=AT, conn_timeout=2)
    assert (probe.reachable, probe.state) == (False, NodeState.DOWN)
    assert "unreachable" in (probe.error or "")
    store = RecordingStore()
    record_probe(store, probe, current=NodeState.DOWN)
    assert store.calls == []  # already down: nothing to change
    record_probe(store, NodeProbe("gone", AT, True, readings=probe.readings, error=None),
                 current=NodeState.DOWN)
    assert store.calls == [("state", "gone", NodeState.UP, "probe", "probe answered")]


@pytest.mark.slow
def test_probe_readings_and_down_state_land_in_the_store(sshd_fleet: Fleet, tmp_path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_pool.spec import parse_node
    from gpu_pool.store import Store

    store = Store.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    node = sshd_fleet["node-b"]
    store.import_nodes([parse_node({"name": "node-b", "gpu_model": "T4", "gpus": 2,
                                    "ssh_conn_id": node.conn_id}),
                        parse_node({"name": "node-gone", "gpu_model": "T4", "gpus": 1,
                                    "ssh_conn_id": "gpu_node_gone"})], "test")
    monkeypatch.setenv("AIRFLOW_CONN_GPU_NODE_GONE", node.conn_uri.replace(f":{node.port}/", ":1/"))
    busy = tuple(g.__class__(**{**g.__dict__, "utilization_pct": 64, "memory_used_mib": 4096})
                 for g in node.gpus)
    node.write_gpus(busy)
    try:
        for stored in store.list_nodes():
            record_probe(store, probe_node(stored.name, stored.ssh_conn_id or "", at=AT,
                                           conn_timeout=2), current=stored.state)
    finally:
        node.write_gpus(node.gpus)
    nodes = {n.name: n for n in store.list_nodes()}
    assert nodes["node-b"].state is NodeState.UP
    assert [g.utilization_pct for g in nodes["node-b"].gpus] == [64.0, 64.0]
    assert nodes["node-gone"].state is NodeState.DOWN
    store.close()
