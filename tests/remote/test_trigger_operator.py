"""GpuRemoteJobTrigger and GpuSSHOperator at run time, against real sshd nodes."""

from __future__ import annotations

import asyncio
import importlib
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import BaseNotifier, task
from airflow.sdk.exceptions import TaskDeferred
from tests.sshd.fleet import Fleet, SshNode

from gpu_pool.operators import GpuRemoteJobFailed, GpuSSHOperator
from gpu_pool.remote.allocation import NodeSlot, RemoteAllocation
from gpu_pool.remote.job import METRICS_FILE, RemoteJob, make_job_id
from gpu_pool.remote.runner import RemoteJobRunner
from gpu_pool.triggers.remote_job import GpuRemoteJobTrigger

pytestmark = pytest.mark.slow


def live_group(node: SshNode, pgid: int) -> list[str]:
    out = node.sh(f"ps -eo pgid=,stat=,args= | awk '$1 == {pgid} && $2 !~ /^Z/'").stdout
    return [line for line in out.splitlines() if line.strip()]


def first_event(trigger: GpuRemoteJobTrigger, timeout: float = 90) -> dict[str, Any]:
    async def first() -> dict[str, Any]:
        async for event in trigger.run():
            return dict(event.payload)
        raise AssertionError("no event")

    return asyncio.run(asyncio.wait_for(first(), timeout))


def start(fleet: Fleet, node: str, command: str, base_dir: str,
          metrics: bool = False) -> tuple[dict[str, str], int]:
    job = RemoteJob(make_job_id("trig", node), base_dir)
    env = {"GPU_POOL_METRICS_FILE": job.path(METRICS_FILE)} if metrics else {}
    with RemoteJobRunner(fleet[node].conn_id) as runner:
        pgid = runner.start(command, job, env)
    return {"node": node, "ssh_conn_id": fleet[node].conn_id, **job.to_dict()}, pgid


class FakeTI:
    try_number = 1

    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


class RecordingNotifier(BaseNotifier):
    """A real Airflow notifier that keeps what it was asked to send."""

    template_fields = ()
    sent: list[dict[str, Any]] = []

    def notify(self, context: Any) -> None:
        RecordingNotifier.sent.append(dict(context["gpu_pool_warning"]))


@pytest.fixture
def allocated(sshd_fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> RemoteAllocation:
    """The task process's environment as the executor sets it: node-a, GPUs 2 and 3."""
    allocation = RemoteAllocation("dag.train.1@run", (
        NodeSlot("node-a", sshd_fleet["node-a"].conn_id, (2, 3), 1000, "alloc-1"),))
    for key, value in allocation.to_env().items():
        monkeypatch.setenv(key, value)
    return allocation


def test_serialize_round_trip() -> None:
    trigger = GpuRemoteJobTrigger(
        jobs=[{"node": "n", "ssh_conn_id": "c", "job_id": "j", "base_dir": "/tmp/x"}],
        started_at=1700000000.5, time_limit_s=60, warn_at_s=48, warned=True, kill_grace_s=3,
        poll_interval=2, log_offsets={"j": 10}, log_chunk_size=100, command_timeout=5,
        max_reconnect_attempts=2)
    classpath, kwargs = trigger.serialize()
    module, name = classpath.rsplit(".", 1)
    rebuilt = getattr(importlib.import_module(module), name)(**kwargs)
    assert isinstance(rebuilt, GpuRemoteJobTrigger)
    assert rebuilt.serialize() == (classpath, kwargs)
    assert kwargs["log_offsets"] == {"j": 10} and kwargs["warned"] is True


def test_trigger_reports_success_and_streams_the_log(sshd_fleet: Fleet, base_dir: str,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    spec, _ = start(sshd_fleet, "node-a", "echo hello from $(hostname -s); echo bye", base_dir)
    capfd.readouterr()
    event = first_event(GpuRemoteJobTrigger(jobs=[spec], started_at=time.time(),
                                            poll_interval=0.2))
    assert event["status"] == "done" and event["outcome"] == "success"
    assert event["results"][spec["job_id"]]["exit_code"] == 0
    assert "[node-a] bye" in "".join(capfd.readouterr())  # Airflow's structlog output
    assert event["log_offsets"][spec["job_id"]] > 0


def test_trigger_time_limit_kills_the_group(sshd_fleet: Fleet, base_dir: str) -> None:
    spec, pgid = start(sshd_fleet, "node-b", "trap '' TERM; sleep 300 & sleep 300", base_dir)
    trigger = GpuRemoteJobTrigger(jobs=[spec], started_at=time.time(), time_limit_s=1,
                                  kill_grace_s=0.5, poll_interval=0.2)
    event = first_event(trigger)
    assert (event["status"], event["outcome"]) == ("done", "timed_out")
    assert event["results"][spec["job_id"]]["killed"] == "time_limit"
    assert live_group(sshd_fleet["node-b"], pgid) == []


def test_trigger_warns_once_then_finishes(sshd_fleet: Fleet, base_dir: str) -> None:
    spec, _ = start(sshd_fleet, "node-a", "sleep 4", base_dir)
    started = time.time()
    event = first_event(GpuRemoteJobTrigger(jobs=[spec], started_at=started, time_limit_s=30,
                                            warn_at_s=0.5, poll_interval=0.2))
    assert event["status"] == "warning" and event["elapsed_s"] >= 0.5
    event = first_event(GpuRemoteJobTrigger(jobs=[spec], started_at=started, time_limit_s=30,
                                            warn_at_s=0.5, warned=True, poll_interval=0.2))
    assert (event["status"], event["outcome"]) == ("done", "success")


def test_trigger_on_kill_kills_the_group(sshd_fleet: Fleet, base_dir: str) -> None:
    spec, pgid = start(sshd_fleet, "node-a", "sleep 300", base_dir)
    trigger = GpuRemoteJobTrigger(jobs=[spec], started_at=time.time(), kill_grace_s=1)
    asyncio.run(trigger.on_kill())
    deadline = time.monotonic() + 30
    while live_group(sshd_fleet["node-a"], pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert live_group(sshd_fleet["node-a"], pgid) == []


def test_a_failed_gang_member_gets_the_others_killed(sshd_fleet: Fleet, base_dir: str) -> None:
    a, pgid_a = start(sshd_fleet, "node-a", "sleep 300", base_dir)
    b, _ = start(sshd_fleet, "node-b", "sleep 0.3; exit 5", base_dir)
    event = first_event(GpuRemoteJobTrigger(jobs=[a, b], started_at=time.time(),
                                            kill_grace_s=1, poll_interval=0.2))
    assert (event["status"], event["outcome"]) == ("done", "failed")
    assert event["results"][a["job_id"]]["killed"] == "gang_failed"
    assert event["results"][b["job_id"]]["exit_code"] == 5
    assert live_group(sshd_fleet["node-a"], pgid_a) == []


def test_trigger_gives_up_on_an_unreachable_node(sshd_fleet: Fleet,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    node = sshd_fleet["node-a"]
    monkeypatch.setenv("AIRFLOW_CONN_GPU_NODE_GONE", node.conn_uri.replace(f":{node.port}/", ":1/"))
    spec = {"node": "gone", "ssh_conn_id": "gpu_node_gone", "job_id": "j", "base_dir": "/tmp/x"}
    event = first_event(GpuRemoteJobTrigger(jobs=[spec], started_at=time.time(),
                                            max_reconnect_attempts=0))
    assert event["status"] == "error" and "lost the nodes" in event["message"]


def test_operator_runs_on_its_allocation_and_defers(allocated: RemoteAllocation,
                                                    sshd_fleet: Fleet) -> None:
    op = GpuSSHOperator(task_id="train", command='test "$CUDA_VISIBLE_DEVICES" = 2,3',
                        gpus=2, team="nlp", poll_interval=0.2)
    ti = FakeTI()
    with pytest.raises(TaskDeferred) as deferred:
        op.execute({"ti": ti})
    trigger = deferred.value.trigger
    assert isinstance(trigger, GpuRemoteJobTrigger)
    assert deferred.value.method_name == "execute_complete"
    assert ti.xcom["gpu_pool_jobs"]["jobs"] == trigger.jobs
    assert trigger.jobs[0]["job_id"].startswith("dag.train.1-run_node-a_try1_")
    event = first_event(trigger)
    op.execute_complete({"ti": ti}, event)  # success: no exception


def test_operator_fails_on_a_nonzero_exit(allocated: RemoteAllocation) -> None:
    op = GpuSSHOperator(task_id="train", command="exit 9", gpus=2, team="nlp",
                        poll_interval=0.2, deferrable=False)
    with pytest.raises(GpuRemoteJobFailed, match="remote job failed: node-a: exit 9"):
        op.execute({"ti": FakeTI()})


def test_operator_warns_through_a_notifier_then_times_out(allocated: RemoteAllocation,
                                                          sshd_fleet: Fleet) -> None:
    RecordingNotifier.sent.clear()
    op = GpuSSHOperator(task_id="train", command="sleep 300", gpus=2, team="nlp",
                        time_limit=8, warn_at=0.25, kill_grace=0.5, poll_interval=0.2,
                        deferrable=False, on_time_limit_warning=RecordingNotifier())
    started = time.monotonic()
    with pytest.raises(GpuRemoteJobFailed, match=r"timed_out: node-a: exit 1\d\d \(time_limit\)"):
        op.execute({"ti": FakeTI()})
    assert 8 <= time.monotonic() - started < 60  # generous: shared, loaded CI machines
    (warning,) = RecordingNotifier.sent
    assert warning["time_limit_s"] == 8 and 2 <= warning["elapsed_s"] < 8
    assert live_group(sshd_fleet["node-a"], int(_pgid_of(sshd_fleet, op))) == []


def _pgid_of(fleet: Fleet, op: GpuSSHOperator) -> str:
    job = RemoteJob.from_dict(op._jobs[0])
    return fleet["node-a"].sh(f"cat {job.path('pid')}").stdout.strip()


def test_operator_on_kill_kills_the_remote_group(allocated: RemoteAllocation,
                                                 sshd_fleet: Fleet) -> None:
    op = GpuSSHOperator(task_id="train", command="sleep 300", gpus=2, team="nlp",
                        kill_grace=1)
    with pytest.raises(TaskDeferred):
        op.execute({"ti": FakeTI()})
    pgid = int(_pgid_of(sshd_fleet, op))
    assert live_group(sshd_fleet["node-a"], pgid)
    op.on_kill()
    assert live_group(sshd_fleet["node-a"], pgid) == []


def test_without_an_allocation_the_task_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("GPU_POOL_TASK_ALLOCATION", "GPU_POOL_NODE"):
        monkeypatch.delenv(key, raising=False)
    op = GpuSSHOperator(task_id="train", command="true", gpus=1, team="nlp")
    with pytest.raises(GpuRemoteJobFailed, match="no GPU allocation.*'GpuPool' executor"):
        op.execute({"ti": FakeTI()})


def test_the_decorated_function_supplies_the_command(allocated: RemoteAllocation,
                                                     capfd: pytest.CaptureFixture[str]) -> None:
    @task.gpu(gpus=2, team="nlp", poll_interval=0.2, deferrable=False)
    def train(epochs: int) -> str:
        return f"echo epochs={epochs} gpus=$GPU_POOL_GPUS"

    from airflow.sdk import DAG

    with DAG("d", schedule=None):
        op = train(3).operator
    capfd.readouterr()
    op.execute({"ti": FakeTI()})
    assert "[node-a] epochs=3 gpus=2,3" in "".join(capfd.readouterr())


def test_connection_secrets_never_reach_the_logs(sshd_fleet: Fleet, base_dir: str,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capfd: pytest.CaptureFixture[str]) -> None:
    node = sshd_fleet["node-b"]
    secret = "pw-9f3c1e77-never-log"
    uri = node.conn_uri.replace(f"{node.user}@", f"{node.user}:{secret}@")
    monkeypatch.setenv("AIRFLOW_CONN_GPU_NODE_WITH_PASSWORD", uri)
    allocation = RemoteAllocation("r", (NodeSlot("node-b", "gpu_node_with_password", (0,)),))
    for key, value in allocation.to_env().items():
        monkeypatch.setenv(key, value)
    op = GpuSSHOperator(task_id="t", command="echo ran", gpus=1, team="nlp", poll_interval=0.2,
                        deferrable=False, remote_base_dir=base_dir)
    capfd.readouterr()
    op.execute({"ti": FakeTI()})
    out = "".join(capfd.readouterr())
    assert "[node-b] ran" in out
    assert secret not in out


def test_metrics_the_command_writes_are_pushed_and_bad_ones_said(
        allocated: RemoteAllocation, capfd: pytest.CaptureFixture[str]) -> None:
    op = GpuSSHOperator(
        task_id="train", gpus=2, team="nlp", poll_interval=0.2, deferrable=False,
        command='printf \'{"val_loss": 0.25, "gpu_mem_peak_mib": 30500, "note": "x"}\' '
                '> "$GPU_POOL_METRICS_FILE"')
    ti = FakeTI()
    op.execute({"ti": ti})
    assert ti.xcom["gpu_pool_metrics"] == {"val_loss": 0.25, "gpu_mem_peak_mib": 30500.0}
    assert "'note': got 'x'; expected a finite number" in "".join(capfd.readouterr())


def test_no_metrics_file_pushes_nothing(allocated: RemoteAllocation) -> None:
    op = GpuSSHOperator(task_id="train", command="true", gpus=2, team="nlp",
                        poll_interval=0.2, deferrable=False)
    ti = FakeTI()
    op.execute({"ti": ti})
    assert "gpu_pool_metrics" not in ti.xcom


def test_the_gpus_go_back_within_a_second_of_the_jobs_end_billed_to_it(
        sshd_fleet: Fleet, base_dir: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger polls every 5 s here, yet sees the end at once (the poll waits on the
    node) and releases in the store, the ledger billing up to the node's own end time."""
    import threading

    from gpu_pool.engine import plan
    from gpu_pool.model import Policy, Team
    from gpu_pool.spec import parse_node, parse_request
    from gpu_pool.store import Store

    url = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("AIRFLOW__GPU_POOL__STORE_URL", url)
    store = Store.from_url(url)
    store.migrate()
    store.upsert_team(Team("nlp"), actor="t")
    store.import_nodes([parse_node({"name": "node-a", "gpu_model": "A100", "gpus": 4,
                                    "cpu": 8, "memory": "64GiB"})], actor="t")
    name = "dag.train.1@run"
    store.submit_request(parse_request({"name": name, "team": "nlp", "gpus": 2}), actor="t")
    store.apply_plan(plan(store.load_snapshot(Policy(), datetime.now(UTC))),
                     datetime.now(UTC), "t")
    assert [a.request_name for a in store.active_allocations()] == [name]
    gone_at: list[float] = []

    def watch() -> None:  # when the store stops showing the allocation, by this clock
        while not gone_at:
            if not store.active_allocations():
                gone_at.append(time.time())
            time.sleep(0.02)

    watcher = threading.Thread(target=watch, daemon=True)
    spec, _ = start(sshd_fleet, "node-a",
                    "sleep 2; echo '{\"val_loss\": 0.5}' > \"$GPU_POOL_METRICS_FILE\"",
                    base_dir, metrics=True)
    watcher.start()
    event = first_event(GpuRemoteJobTrigger(jobs=[spec], started_at=time.time(),
                                            poll_interval=5, request=name))
    fired = time.time()
    watcher.join(5)
    ended = float(sshd_fleet["node-a"].sh(f"cat {spec['base_dir']}/{spec['job_id']}/ended")
                  .stdout)
    assert (event["outcome"], event["released"], event["metrics"]) == (
        "success", True, {"val_loss": 0.5})
    assert event["ended_at"] == pytest.approx(ended, abs=1e-6)
    released_after = gone_at[0] - ended
    assert 0 <= released_after <= 1.0, released_after
    assert fired - ended <= 1.5
    (entry,) = store.ledger()
    assert entry.ended_at.timestamp() == pytest.approx(ended, abs=1e-5)  # billed to the end
    assert entry.outcome.value == "success" and dict(entry.metrics) == {"val_loss": 0.5}
    print(f"released {released_after * 1000:.0f} ms after the job ended on the node")
    store.close()


def test_a_templates_setup_runs_first_in_the_same_shell_on_the_node(
        allocated: RemoteAllocation, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor passes the template's setup and time limit; the command sees what the
    setup exported, and the limit applies though the task set none."""
    monkeypatch.setenv("GPU_POOL_SETUP", "export FROM_SETUP=yes\ncd /tmp")
    monkeypatch.setenv("GPU_POOL_TIME_LIMIT_S", "120")
    op = GpuSSHOperator(task_id="train", gpus=2, team="nlp", poll_interval=0.2,
                        deferrable=False,
                        command='test "$FROM_SETUP" = yes && test "$PWD" = /tmp')
    op.execute({"ti": FakeTI()})  # success: the setup's export and cd reached the command
    assert op.time_limit_s == 120


def test_a_failing_setup_fails_the_task_before_its_command(
        allocated: RemoteAllocation, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    monkeypatch.setenv("GPU_POOL_SETUP", "false")
    op = GpuSSHOperator(task_id="train", gpus=2, team="nlp", poll_interval=0.2,
                        deferrable=False, command=f"touch {marker}")
    with pytest.raises(GpuRemoteJobFailed, match="exit 1"):
        op.execute({"ti": FakeTI()})
    assert not marker.exists()
