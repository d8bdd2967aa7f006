"""The node probe chore over real OpenSSH nodes with a fake nvidia-smi (tests/sshd)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from tests.sshd.fleet import start_fleet

from gpu_pool.model import NodeState
from gpu_pool.ops.airflow_adapters import probe_over_ssh
from gpu_pool.ops.records import OpsRecords
from gpu_pool.ops.runs import run_probe
from gpu_pool.ops.storeviews import gpu_samples
from gpu_pool.simnode.gpus import SimProcess, write_node_dir

pytestmark = [pytest.mark.slow, pytest.mark.airflow]
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def ssh_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    with start_fleet(tmp_path_factory.mktemp("sshd"), [("pa", "A100", 2), ("pb", "T4", 1)]) as f:
        saved = {k: os.environ.get(k) for k in f.airflow_env()}
        os.environ.update(f.airflow_env())
        yield f
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def test_probe_records_samples_states_and_foreign_processes(ssh_nodes, fleet, store) -> None:
    pa = ssh_nodes["pa"]
    fleet.team("vision")
    fleet.node("pa", gpus=2, ssh_conn_id=pa.conn_id)
    fleet.node("pb", gpus=1, model="T4", memory_mib=16 * 1024, ssh_conn_id="gpu_node_nowhere")
    store.set_node_state("pb", NodeState.DRAINING, "test", "keep the task on pa")
    (held,) = fleet.run("trainer", "vision", 1, NOW - timedelta(hours=1))
    assert held.node == "pa"
    store.set_node_state("pa", NodeState.DOWN, "test", "was down")
    ours, theirs = pa.gpus[held.gpu_indices[0]], pa.gpus[1 - held.gpu_indices[0]]
    write_node_dir(pa.node_dir, pa.gpus, (SimProcess(ours.uuid, 100, 30000),
                                          SimProcess(theirs.uuid, 4242, 5000)))
    result = run_probe(store, probe_over_ssh, NOW)
    assert sorted(result.probed) == ["pa", "pb"] and result.down == ("pb",)
    states = {n.name: n.state for n in store.list_nodes()}
    assert states == {"pa": NodeState.UP, "pb": NodeState.DOWN}  # back up; unreachable
    assert [(p.node, p.gpu_index, p.pid) for p in result.foreign] == [
        ("pa", 1 - held.gpu_indices[0], 4242)]
    samples = gpu_samples(store.engine, NOW - timedelta(minutes=1), NOW + timedelta(minutes=1))
    assert sorted((s.node, s.gpu_index) for s in samples) == [("pa", 0), ("pa", 1)]
    (rec,) = OpsRecords(store.engine).reclaims()
    assert rec.action == "foreign_process" and "4242" in rec.reason
    again = run_probe(store, probe_over_ssh, NOW + timedelta(minutes=1))
    assert again.records == ()  # reported once, not every minute
