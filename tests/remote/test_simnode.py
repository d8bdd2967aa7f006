"""The simulated node (embedded asyncssh server) is an ordinary SSH node to our code."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_pool.model import NodeState, Outcome
from gpu_pool.probe import probe_node
from gpu_pool.remote.job import JobPlacement, RemoteJob, job_environment, make_job_id
from gpu_pool.remote.runner import RemoteJobRunner
from gpu_pool.simnode.server import SimNode, airflow_env, sim_fleet
from gpu_pool.triggers.remote_job import GpuRemoteJobTrigger

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sim_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SimNode]]:
    with sim_fleet(tmp_path_factory.mktemp("sim"), [("sim-a", "H100", 8),
                                                    ("sim-b", "L4", 1)]) as nodes:
        saved = {k: os.environ.get(k) for k in airflow_env(nodes)}
        os.environ.update(airflow_env(nodes))
        yield nodes
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def live_group(pgid: int) -> str:
    return subprocess.run(f"ps -eo pgid=,stat= | awk '$1 == {pgid} && $2 !~ /^Z/'",
                          shell=True, capture_output=True, text=True, check=True).stdout.strip()


def test_runner_on_a_simulated_node(sim_nodes: dict[str, SimNode], base_dir: str) -> None:
    job = RemoteJob(make_job_id("sim"), base_dir)
    env = job_environment(JobPlacement("sim-a", (5, 6), "r"), job)
    lines: list[str] = []
    with RemoteJobRunner(sim_nodes["sim-a"].conn_id) as runner:
        result = runner.run("echo $GPU_POOL_SIM_NODE $CUDA_VISIBLE_DEVICES; nvidia-smi -L | wc -l;"
                            " exit 4", job, env, on_output=lines.append, poll_interval=0.2)
    assert (result.outcome, result.exit_code) == (Outcome.FAILED, 4)
    assert lines == ["sim-a 5,6", "8"]


def test_kill_and_time_limit_on_a_simulated_node(sim_nodes: dict[str, SimNode],
                                                 base_dir: str) -> None:
    with RemoteJobRunner(sim_nodes["sim-b"].conn_id) as runner:
        job = RemoteJob(make_job_id("kill"), base_dir)
        pgid = runner.start("trap '' TERM; sleep 300 & sleep 300", job, {})
        assert live_group(pgid)
        assert runner.kill(job, grace_s=0.3) == "killed"
        assert live_group(pgid) == ""
        job = RemoteJob(make_job_id("limit"), base_dir)
        result = runner.run("sleep 300", job, {}, time_limit_s=1, kill_grace_s=0.5,
                            poll_interval=0.2)
        assert (result.outcome, result.killed_reason) == (Outcome.TIMED_OUT, "time_limit")


def test_probe_and_trigger_on_a_simulated_node(sim_nodes: dict[str, SimNode],
                                               base_dir: str) -> None:
    probe = probe_node("sim-a", sim_nodes["sim-a"].conn_id)
    assert probe.state is NodeState.UP
    assert [r.model for r in probe.readings] == ["H100"] * 8
    job = RemoteJob(make_job_id("trig"), base_dir)
    with RemoteJobRunner(sim_nodes["sim-b"].conn_id) as runner:
        runner.start("echo hi", job, {})
    trigger = GpuRemoteJobTrigger(jobs=[{"node": "sim-b", "ssh_conn_id": sim_nodes["sim-b"].conn_id,
                                         **job.to_dict()}], started_at=time.time(),
                                  poll_interval=0.2)

    async def first() -> dict:
        async for event in trigger.run():
            return dict(event.payload)
        return {}

    assert asyncio.run(asyncio.wait_for(first(), 90))["outcome"] == "success"


def test_a_wrong_client_key_is_refused(sim_nodes: dict[str, SimNode], tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    node = sim_nodes["sim-a"]
    other = SimNode("other", tmp_path, ())  # never started: only its client key is used
    monkeypatch.setenv("AIRFLOW_CONN_GPU_NODE_INTRUDER",
                       node.conn_uri.replace(str(node.client_key_file).replace("/", "%2F"),
                                             str(other.client_key_file).replace("/", "%2F")))
    probe = probe_node("sim-a", "gpu_node_intruder", conn_timeout=3)
    assert probe.state is NodeState.DOWN and "Authentication" in (probe.error or "")


def test_the_command_line_serves_a_fleet(tmp_path: Path) -> None:
    out = tmp_path / "fleet.json"
    proc = subprocess.Popen([sys.executable, "-m", "gpu_pool.simnode.server", "--root",
                             str(tmp_path / "root"), "--write-json", str(out), "cli-a:T4:2"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.startswith("AIRFLOW_CONN_GPU_NODE_CLI_A=ssh://")
        deadline = time.monotonic() + 10
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        conn = json.loads(out.read_text())["cli-a"]
        os.environ[f"AIRFLOW_CONN_{conn['conn_id'].upper()}"] = conn["uri"]
        probe = probe_node("cli-a", conn["conn_id"])
        assert [r.model for r in probe.readings] == ["T4", "T4"]
    finally:
        os.environ.pop("AIRFLOW_CONN_GPU_NODE_CLI_A", None)
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0


def _free_pair() -> int:
    import socket
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            with socket.socket() as b:
                try:
                    b.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port
    raise AssertionError("no two consecutive free ports")


def _serve(root: Path, port: int, out: Path) -> subprocess.Popen[str]:
    out.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpu_pool.simnode.server", "--root", str(root), "--listen",
         "127.0.0.1", "--port", str(port), "--advertise", "localhost", "--client-key",
         str(root / "keys" / "client_ed25519"), "--write-json", str(out),
         "node-1:A100:2", "node-2:T4:1"], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not out.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "sim fleet did not start"
        time.sleep(0.1)
    return proc


def test_container_mode_fixed_ports_shared_client_key_and_a_stable_host_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As docker-compose.yaml runs it: fixed ports, the service name in the URI and
    known_hosts, one client key for every node, a host key that survives a restart."""
    port, root, out = _free_pair(), tmp_path / "fleet", tmp_path / "nodes.json"
    proc = _serve(root, port, out)
    try:
        nodes = json.loads(out.read_text())
        assert [n["uri"].split("@")[1].split("/")[0] for n in nodes.values()] == [
            f"localhost:{port}", f"localhost:{port + 1}"]
        assert len({n["uri"].split("key_file=")[1].split("&")[0] for n in nodes.values()}) == 1
        for node in nodes.values():
            monkeypatch.setenv(f"AIRFLOW_CONN_{node['conn_id'].upper()}", node["uri"])
        with RemoteJobRunner(nodes["node-2"]["conn_id"]) as runner:
            assert runner.exec("nvidia-smi -L | wc -l; echo $GPU_POOL_SIM_NODE")[1].split() == [
                "1", "node-2"]
        host_key = (root / "node-1" / "host_ed25519").read_bytes()
    finally:
        proc.terminate()
        proc.wait(10)
    proc = _serve(root, port, out)  # restarted: the old URI (pinned host key) still works
    try:
        assert (root / "node-1" / "host_ed25519").read_bytes() == host_key
        with RemoteJobRunner(nodes["node-1"]["conn_id"]) as runner:
            assert runner.exec("nvidia-smi -L | wc -l")[1].strip() == "2"
    finally:
        proc.terminate()
        proc.wait(10)
