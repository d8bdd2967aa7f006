"""Preemption with grace, end to end over real sshd: the executor's detached kill, the
training's SIGTERM checkpoint, the operator's reschedule, the resume from the checkpoint.

The pieces are the real ones — a SQLite store, the engine's plan (a critical request
preempts a batch one), the executor's preemption step (its thread pool and SSH kill), the
operator in its non-deferrable loop (the trigger's loop, in-process) — only the Airflow
scheduler is left out: its part (UP_FOR_RESCHEDULE keeps the try) is checked at the
database level in ``tests/airflow/test_reschedule_keeps_try.py``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowRescheduleException
from tests.sshd.fleet import Fleet

from gpu_pool.executor_support.cycle import PlacementCycle
from gpu_pool.model import AllocationState, RequestState, Team
from gpu_pool.operators import GpuSSHOperator
from gpu_pool.operators.gpu_ssh import _preemption_reason
from gpu_pool.remote.allocation import RemoteAllocation
from gpu_pool.remote.runner import RemoteJobRunner
from gpu_pool.spec import parse_node, parse_request
from gpu_pool.store import Store

pytestmark = pytest.mark.slow

# A training that counts steps, checkpoints on SIGTERM (taking a second to do it, as a
# real save does) and resumes from its checkpoint; a resumed run finishes 5 steps later.
TRAINING = r"""
ck="$GPU_POOL_CHECKPOINT_DIR/step"
step=0; stop=100000
if [ -s "$ck" ]; then step=$(cat "$ck"); stop=$((step + 5)); echo "resumed from step $step"; fi
echo "preempted before: $GPU_POOL_PREEMPTED"
trap 'echo "SIGTERM at step $step"; sleep 1; echo "$step" > "$ck"; echo "checkpoint written"; exit 143' TERM
while [ "$step" -lt "$stop" ]; do step=$((step + 1)); echo "step $step"; sleep 0.1 & wait $!; done
echo "finished at step $step"
"""


class TI:
    dag_id = "d"
    run_id = "run1"
    map_index = -1
    try_number = 1

    def __init__(self) -> None:
        self.xcom: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcom[key] = value


@pytest.fixture
def store(tmp_path: Path, sshd_fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> Iterator[Store]:
    s = Store.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    s.migrate()
    s.upsert_team(Team("nlp"), actor="t")
    s.import_nodes([parse_node({"name": "node-a", "gpu_model": "A100", "gpus": 2, "cpu": 8,
                                "memory": "64GiB",
                                "ssh_conn_id": sshd_fleet["node-a"].conn_id})], actor="t")
    monkeypatch.setenv("AIRFLOW__GPU_POOL__STORE_URL", s.url)
    yield s
    s.close()


@pytest.fixture
def executor(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "test-secret")
    from gpu_pool.executor import GpuPoolExecutor

    # A training seconds old may be preempted here (the default waits 10 minutes).
    store.set_policy("min_runtime_before_preemption: 0\n", actor="test")
    ex = GpuPoolExecutor(parallelism=8)
    ex.start()
    ex.cycle.idle_replan_s = 0.0
    yield ex
    ex.end()


def _allocate(store: Store, cycle: PlacementCycle, name: str,
              monkeypatch: pytest.MonkeyPatch) -> RemoteAllocation:
    """What the executor's start step puts in the task process's environment."""
    (binding,) = cycle.run({name}).bindings
    preempted = sum(1 for a in store.allocations_of(name)
                    if a.state is AllocationState.PREEMPTED)
    conn_ids = {n.name: n.ssh_conn_id for n in store.list_nodes()}
    allocation = RemoteAllocation.from_model(name, binding.allocations, conn_ids, preempted)
    for key, value in allocation.to_env().items():
        monkeypatch.setenv(key, value)
    return allocation


def _run(op: GpuSSHOperator, ti: TI) -> dict[str, BaseException | None]:
    outcome: dict[str, BaseException | None] = {"error": None}

    def target() -> None:
        try:
            op.execute({"ti": ti})
        except BaseException as error:  # noqa: BLE001 - handed to the test thread
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    outcome["thread"] = thread  # type: ignore[assignment]
    return outcome


def _log(store: Store, sshd_fleet: Fleet, ti: TI) -> str:
    jobs = ti.xcom["gpu_pool_jobs"]["jobs"]
    with RemoteJobRunner(sshd_fleet["node-a"].conn_id) as runner:
        return "".join(runner.exec(f"cat {spec['base_dir']}/{spec['job_id']}/log")[1]
                       for spec in jobs)


def test_a_preempted_training_checkpoints_requeues_and_resumes(
        sshd_fleet: Fleet, store: Store, executor: Any, base_dir: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"d.train.1@run-{uuid.uuid4().hex[:6]}"
    cycle = executor.cycle
    cycle.admit(parse_request({"name": name, "team": "nlp", "gpus": 2, "priority": "batch",
                               "grace": 5}), {})
    submitted_at = store.get_request(name).submitted_at
    _allocate(store, cycle, name, monkeypatch)
    ti = TI()
    op = GpuSSHOperator(task_id="train", command=TRAINING, team="nlp", gpus=2,
                        priority="batch", preemption_grace=5, deferrable=False,
                        poll_interval=0.2, remote_base_dir=base_dir)
    first = _run(op, ti)
    (job,) = _wait_for(lambda: store.jobs_of(name), "the operator records its job")
    assert job.grace_s == 5.0 and job.stop_reason is None
    _wait_for(lambda: "step 5\n" in _log(store, sshd_fleet, ti), "the training runs")

    # A critical request arrives: the plan preempts the batch training for its GPUs.
    cycle.admit(parse_request({"name": "urgent", "team": "nlp", "gpus": 2,
                               "priority": "critical"}), {})
    report = cycle.run({"urgent", name})
    assert len(report.preempted) == 1 and [b.request_name for b in report.bindings] == ["urgent"]
    assert store.request_state(name) is RequestState.PENDING
    cycle.run({name})  # planned again while the critical work holds the GPUs
    code, message = store.request_reason(name)
    assert code != "preempted" and "it was preempted for critical request urgent" in message  # who, still
    executor._send_stops(now_due=True)  # what the heartbeat does after such a cycle
    executor._wait_stops(timeout=30)
    assert [j.job_id for j in store.stops_due()] == []  # sent, marked in the store

    first["thread"].join(60)  # type: ignore[union-attr]
    error = first["error"]
    assert isinstance(error, AirflowRescheduleException), error  # requeued, not failed
    log = _log(store, sshd_fleet, ti)
    assert "SIGTERM at step" in log and "checkpoint written" in log  # within the grace
    saved = int(log.split("SIGTERM at step ")[1].split()[0])
    assert saved >= 5
    assert "preempted for critical request urgent" in (_preemption_reason(name) or "")
    with RemoteJobRunner(sshd_fleet["node-a"].conn_id) as runner:
        status = runner.poll(_remote(job))
    assert status.killed_reason == "preempted" and status.exit_code == 143  # not SIGKILLed

    # The critical work ends; the training is placed again under the same name, in its
    # old place in line, told it was preempted once, and resumes from its checkpoint.
    store.release_request("urgent", "success", actor="t", reason="done")
    assert store.get_request(name).submitted_at == submitted_at
    allocation = _allocate(store, cycle, name, monkeypatch)
    assert allocation.preemptions == 1
    ti2 = TI()  # the same try: the scheduler kept try_number on UP_FOR_RESCHEDULE
    again = _run(GpuSSHOperator(task_id="train", command=TRAINING, team="nlp", gpus=2,
                                priority="batch", preemption_grace=5, deferrable=False,
                                poll_interval=0.2, remote_base_dir=base_dir), ti2)
    again["thread"].join(60)  # type: ignore[union-attr]
    assert again["error"] is None
    log2 = _log(store, sshd_fleet, ti2)
    assert f"resumed from step {saved}" in log2 and "preempted before: 1" in log2
    assert f"finished at step {saved + 5}" in log2


def test_a_training_that_ignores_sigterm_is_killed_after_the_grace(
        sshd_fleet: Fleet, store: Store, executor: Any, base_dir: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The grace is a bound: SIGKILL follows it, and the task still requeues."""
    import time

    name = f"d.stubborn.1@run-{uuid.uuid4().hex[:6]}"
    cycle = executor.cycle
    cycle.admit(parse_request({"name": name, "team": "nlp", "gpus": 2, "priority": "batch"}),
                {})
    _allocate(store, cycle, name, monkeypatch)
    ti = TI()
    op = GpuSSHOperator(task_id="stubborn", command="trap '' TERM; while :; do sleep 0.1; done",
                        team="nlp", gpus=2, priority="batch", preemption_grace=2,
                        deferrable=False, poll_interval=0.2, remote_base_dir=base_dir)
    run = _run(op, ti)
    (job,) = _wait_for(lambda: store.jobs_of(name), "the operator records its job")
    cycle.admit(parse_request({"name": "urgent2", "team": "nlp", "gpus": 2,
                               "priority": "critical"}), {})
    assert len(cycle.run({"urgent2", name}).preempted) == 1
    sent = time.monotonic()
    executor._send_stops(now_due=True)
    executor._wait_stops(timeout=30)
    run["thread"].join(60)  # type: ignore[union-attr]
    assert isinstance(run["error"], AirflowRescheduleException)
    assert time.monotonic() - sent >= 2.0  # it had its grace
    with RemoteJobRunner(sshd_fleet["node-a"].conn_id) as runner:
        status = runner.poll(_remote(job))
    assert status.killed_reason == "preempted" and status.exit_code == 137  # SIGKILL


def _remote(job: Any) -> Any:
    from gpu_pool.remote.job import RemoteJob

    return RemoteJob(job.job_id, job.base_dir)


def _wait_for(probe: Any, what: str, timeout: float = 30.0) -> Any:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting until {what}")



def test_the_winner_starts_only_once_the_preempted_job_has_left_its_gpus(
        sshd_fleet: Fleet, store: Store, executor: Any, base_dir: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The store gives the critical request the GPUs the moment the plan is applied; its
    operator starts its command only once the preempted training has checkpointed and
    exited (the kill is sent after the winner's operator started waiting)."""
    name = f"d.victim.1@run-{uuid.uuid4().hex[:6]}"
    cycle = executor.cycle
    cycle.admit(parse_request({"name": name, "team": "nlp", "gpus": 2, "priority": "batch",
                               "grace": 5}), {})
    _allocate(store, cycle, name, monkeypatch)
    ti = TI()
    victim = _run(GpuSSHOperator(task_id="train", command=TRAINING, team="nlp", gpus=2,
                                 priority="batch", preemption_grace=5, deferrable=False,
                                 poll_interval=0.2, remote_base_dir=base_dir), ti)
    (job,) = _wait_for(lambda: store.jobs_of(name), "the operator records its job")
    _wait_for(lambda: "step 3\n" in _log(store, sshd_fleet, ti), "the training runs")

    cycle.admit(parse_request({"name": "urgent3", "team": "nlp", "gpus": 2,
                               "priority": "critical"}), {})
    report = cycle.run({"urgent3", name})
    assert len(report.preempted) == 1
    (binding,) = [b for b in report.bindings if b.request_name == "urgent3"]
    conn_ids = {n.name: n.ssh_conn_id for n in store.list_nodes()}
    for key, value in RemoteAllocation.from_model("urgent3", binding.allocations, conn_ids,
                                                  0).to_env().items():
        monkeypatch.setenv(key, value)
    assert [j.job_id for j in store.jobs_stopping_on("node-a", [0, 1])] == [job.job_id]
    assert store.jobs_stopping_on("node-a", [2]) == []  # another GPU: nothing to wait for
    victim_dir = f"{job.base_dir}/{job.job_id}"
    ti2 = TI()
    winner = _run(GpuSSHOperator(
        task_id="urgent", command=f"test -e {victim_dir}/exit && echo victim-gone "
                                  f"|| echo victim-still-running", team="nlp", gpus=2,
        priority="critical", deferrable=False, poll_interval=0.2, remote_base_dir=base_dir),
        ti2)
    import time

    time.sleep(1.5)  # the winner's operator is waiting: it has started nothing
    assert not store.jobs_of("urgent3") and "gpu_pool_jobs" not in ti2.xcom
    executor._send_stops(now_due=True)
    executor._wait_stops(timeout=30)
    victim["thread"].join(60)  # type: ignore[union-attr]
    assert isinstance(victim["error"], AirflowRescheduleException)
    winner["thread"].join(60)  # type: ignore[union-attr]
    assert winner["error"] is None
    assert "victim-gone" in _log(store, sshd_fleet, ti2)
    assert "checkpoint written" in _log(store, sshd_fleet, ti)
