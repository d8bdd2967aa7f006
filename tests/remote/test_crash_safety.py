"""Crash safety: a scheduler SIGKILLed in the middle of a placement or a preemption.

A batch training runs as a real remote job (sshd on loopback) on 2 of node-a's 4 GPUs; a
critical 4-GPU task arrives, so the executor's heartbeat must preempt the training and
place the critical task. The heartbeat runs in a real process (``crash_worker.py``) over a
real store and is SIGKILLed at each dangerous point. Then:

* before the commit (inside the apply transaction, after the preemption's or the
  placement's writes): nothing happened — the training still holds its GPUs and runs
  untouched, the critical task still waits, no stop is due: apply is one transaction;
* after the commit, before the SSH kill: the preemption stands and its stop is due in the
  store (written in that same transaction); the training still runs untouched.

In every case no GPU is held by nobody (every active allocation belongs to a RUNNING
request, and each GPU's held milli is exactly its active allocations'). A restarted
heartbeat then finishes the work: the critical task is placed and the training is stopped
*with grace* — SIGTERM, its checkpoint written, never a bare SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text
from tests.remote.test_preemption_sshd import TRAINING, _wait_for
from tests.sshd.fleet import Fleet
from tests.store.conftest import pg_database, store_url  # noqa: F401 - fixtures

from gpu_pool.model import AllocationState, RequestState, Team
from gpu_pool.remote.allocation import RemoteAllocation
from gpu_pool.remote.job import (
    JobStatus,
    RemoteJob,
    build_poll_command,
    checkpoint_dir,
    job_environment,
    make_job_id,
    parse_poll_output,
)
from gpu_pool.remote.runner import RemoteJobRunner
from gpu_pool.spec import parse_node, parse_request
from gpu_pool.store import Store

pytestmark = pytest.mark.slow
WORKER = Path(__file__).with_name("crash_worker.py")
REPO = Path(__file__).resolve().parents[2]


def _no_gpu_held_by_nobody(store: Store) -> None:
    for allocation in store.active_allocations():
        assert store.request_state(allocation.request_name) is RequestState.RUNNING
    with store.engine.connect() as conn:
        held = dict(conn.execute(text(
            "SELECT node || '/' || idx, allocated_milli FROM gpus")).all())
    expected = {key: 0 for key in held}
    for allocation in store.active_allocations():
        for index in allocation.gpu_indices:
            expected[f"{allocation.node}/{index}"] += allocation.gpu_milli
    assert held == expected


def _poll(job: RemoteJob) -> JobStatus:
    """The job's status, read on this machine (the loopback nodes share its filesystem)."""
    done = subprocess.run(["bash", "-c", build_poll_command(job)], capture_output=True,
                          text=True, timeout=30, check=True)
    return parse_poll_output(done.stdout)


def _worker(point: str, marker: Path, ti_id: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(WORKER), point, str(marker), ti_id], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


@pytest.mark.parametrize("point", ["in_preempt", "in_place", "before_kill"])
def test_a_scheduler_killed_mid_heartbeat_kills_no_training_and_leaks_no_gpu(
        point: str, sshd_fleet: Fleet, tmp_path: Path, base_dir: str,
        store_url: str) -> None:  # noqa: F811 - SQLite and PostgreSQL
    store = Store.from_url(store_url)
    store.migrate()
    store.upsert_team(Team("nlp"), actor="t")
    # The heartbeats below (executors) follow the store's policy: the same as store_policy().
    store.set_policy("min_runtime_before_preemption: 0\n", actor="t")
    conn_id = sshd_fleet["node-a"].conn_id
    store.import_nodes([parse_node({"name": "node-a", "gpu_model": "A100", "gpus": 4,
                                    "cpu": 8, "memory": "64GiB", "ssh_conn_id": conn_id})],
                       actor="t")
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path / "home"),
           "AIRFLOW__API_AUTH__JWT_SECRET": "test-secret",
           "AIRFLOW__GPU_POOL__STORE_URL": store.url,
           "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO)])}

    # The batch training: placed by the engine, started on node-a, its job recorded.
    from gpu_pool.engine import plan
    from gpu_pool.executor_support.cycle import PlacementCycle

    cycle = PlacementCycle(store=store, policy=store_policy(), planner=plan, actor="t",
                           idle_replan_s=0)
    victim = "d.train.1@r"
    cycle.admit(parse_request({"name": victim, "team": "nlp", "gpus": 2,
                               "priority": "batch", "grace": 5}), {})
    (binding,) = cycle.run({victim}).bindings
    (placement,) = RemoteAllocation.from_model(victim, binding.allocations,
                                               {"node-a": conn_id}).placements()
    job = RemoteJob(make_job_id(victim, "node-a"), base_dir)
    ck = checkpoint_dir(base_dir, "d", "train", "r")
    from dataclasses import replace

    jobenv = job_environment(replace(placement, checkpoint_dir=ck), job)
    with RemoteJobRunner(conn_id) as runner:
        runner.start(TRAINING, job, jobenv)
    store.record_jobs(victim, [{"node": "node-a", "ssh_conn_id": conn_id, **job.to_dict()}],
                      grace_s=5.0)
    log = Path(job.path("log"))
    _wait_for(lambda: "step 3\n" in log.read_text(), "the training runs")

    # The heartbeat, SIGKILLed at the pause point.
    marker = tmp_path / "paused"
    ti_id = str(uuid.uuid4())
    worker = _worker(point, marker, ti_id, env)
    try:
        _wait_for(marker.exists, f"the worker reaches {point}", timeout=120)
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
    time.sleep(1.0)  # a kill, had one been sent, would have shown by now

    store.close()
    store = Store.from_url(store.url)  # a fresh connection, as the restarted one makes
    urgent = "d.urgent.1@r"
    assert "SIGTERM" not in log.read_text()  # the training was not touched
    assert _poll(job).state.value == "running"
    _no_gpu_held_by_nobody(store)
    if point == "before_kill":  # committed: preempted, its stop due, the GPUs moved
        assert store.request_state(victim) is RequestState.PENDING
        assert store.request_state(urgent) is RequestState.RUNNING
        assert [j.job_id for j in store.stops_due()] == [job.job_id]
    else:  # rolled back whole: as if the heartbeat never ran the plan
        assert store.request_state(victim) is RequestState.RUNNING
        assert [a.state for a in store.allocations_of(victim)] == [AllocationState.ACTIVE]
        assert store.request_state(urgent) is RequestState.PENDING
        assert store.allocations_of(urgent) == [] and store.stops_due() == []

    # The restarted scheduler finishes the work, with grace.
    restarted = _worker("none", marker, ti_id, env)
    out, _ = restarted.communicate(timeout=180)
    assert restarted.returncode == 0, out[-3000:]
    assert store.request_state(urgent) is RequestState.RUNNING
    assert store.request_state(victim) is RequestState.PENDING
    assert store.stops_due() == []
    _no_gpu_held_by_nobody(store)
    status = _wait_for(lambda: (s := _poll(job)).done and s, "the training stops")
    assert (status.killed_reason, status.exit_code) == ("preempted", 143)  # not SIGKILLed
    assert "checkpoint written" in log.read_text()
    assert Path(ck, "step").read_text().strip().isdigit()
    store.close()


def store_policy():  # noqa: ANN201 - the default policy but for the minimum runtime
    from datetime import timedelta

    from gpu_pool.model import Policy

    # A training seconds old may be preempted here (the default waits 10 minutes).
    return Policy(min_runtime_before_preemption=timedelta(0))
