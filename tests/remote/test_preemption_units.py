"""Preemption pieces without a node: the job environment, outcomes, the operator's requeue."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk.exceptions import AirflowRescheduleException

from gpu_pool.errors import SpecError
from gpu_pool.model import Outcome
from gpu_pool.operators import GpuRemoteJobFailed, GpuSSHOperator
from gpu_pool.remote.allocation import NodeSlot, RemoteAllocation
from gpu_pool.remote.job import (
    JobPlacement,
    JobState,
    JobStatus,
    RemoteJob,
    build_start_command,
    checkpoint_dir,
    job_environment,
)
from gpu_pool.remote.runner import outcome_of
from gpu_pool.triggers.remote_job import combined_outcome


def test_the_checkpoint_dir_is_stable_per_task_instance_and_safe() -> None:
    one = checkpoint_dir("/srv/jobs", "dag", "train", "manual__2026-12-01T12:00:00+00:00", 3)
    assert one == checkpoint_dir("/srv/jobs", "dag", "train",
                                 "manual__2026-12-01T12:00:00+00:00", 3)
    assert one.startswith("/srv/jobs/checkpoints/dag/train/manual__2026-12-01T12_00_00_00_00-")
    assert one.endswith("/3")
    # Runs whose names differ only in unsafe characters keep apart; so do map indices.
    assert one != checkpoint_dir("/srv/jobs", "dag", "train",
                                 "manual__2026-12-01T12_00_00+00:00", 3)
    assert one != checkpoint_dir("/srv/jobs", "dag", "train",
                                 "manual__2026-12-01T12:00:00+00:00", -1)
    assert ".." not in checkpoint_dir("/srv/jobs", "..", "..", "../..", -1)


def test_the_job_environment_says_where_to_checkpoint_and_how_often_preempted(
        tmp_path: Path) -> None:
    ck = checkpoint_dir(str(tmp_path / "jobs"), "d", "t", "r")
    job = RemoteJob("j1", str(tmp_path / "jobs"))
    env = job_environment(JobPlacement("node-a", (0,), "r1", checkpoint_dir=ck,
                                       preemptions=2), job)
    assert (env["GPU_POOL_CHECKPOINT_DIR"], env["GPU_POOL_PREEMPTED"]) == (ck, "2")
    assert "GPU_POOL_CHECKPOINT_DIR" not in job_environment(JobPlacement("n", (0,), "r"), job)
    # The start command creates the directory on the node before the command runs.
    start = subprocess.run(["bash", "-c", build_start_command(
        'test -d "$GPU_POOL_CHECKPOINT_DIR" && echo ok', job, env)], capture_output=True,
        text=True, timeout=30)
    assert start.returncode == 0, start.stderr
    assert Path(ck).is_dir()
    with pytest.raises(SpecError):
        JobPlacement("n", (0,), "r", checkpoint_dir="relative/dir")
    with pytest.raises(SpecError):
        JobPlacement("n", (0,), "r", preemptions=-1)


def test_the_preemption_count_travels_in_the_task_environment() -> None:
    allocation = RemoteAllocation("r", (NodeSlot("n", "c", (0, 1)),), preemptions=3)
    env = allocation.to_env()
    assert env["GPU_POOL_PREEMPTED"] == "3"
    assert RemoteAllocation.from_env(env) == allocation
    assert [p.preemptions for p in allocation.placements()] == [3]
    flat = {k: v for k, v in env.items() if k != "GPU_POOL_TASK_ALLOCATION"}
    assert RemoteAllocation.from_env(flat).preemptions == 3
    with pytest.raises(SpecError):
        RemoteAllocation.from_env({**env, "GPU_POOL_PREEMPTED": "x"})


def test_a_preempted_job_is_preempted_not_cancelled_and_a_real_failure_wins() -> None:
    preempted = JobStatus(JobState.EXITED, 143, killed_reason="preempted")
    assert outcome_of(preempted) is Outcome.PREEMPTED
    assert outcome_of(JobStatus(JobState.EXITED, 143, killed_reason="cancelled")) \
        is Outcome.CANCELLED
    assert combined_outcome([Outcome.PREEMPTED, Outcome.PREEMPTED]) is Outcome.PREEMPTED
    assert combined_outcome([Outcome.PREEMPTED, Outcome.FAILED]) is Outcome.FAILED
    assert combined_outcome([Outcome.SUCCESS, Outcome.PREEMPTED]) is Outcome.PREEMPTED


class _TI:
    try_number = 2


def _event(outcome: str, killed: str | None) -> dict[str, Any]:
    return {"status": "done", "jobs": [], "outcome": outcome, "request": None,
            "results": {"j": {"node": "n", "exit_code": 143, "killed": killed}}}


def test_the_operator_requeues_a_preempted_task_instead_of_failing_it() -> None:
    op = GpuSSHOperator(task_id="t", command="true", team="nlp", preemption_grace="90s")
    assert op.spec["grace"] == 90.0 and op.preemption_grace_s == 90.0
    with pytest.raises(AirflowRescheduleException) as caught:
        op._handle({"ti": _TI()}, _event("preempted", "preempted"), 0.0)
    assert caught.value.reschedule_date is not None
    with pytest.raises(GpuRemoteJobFailed, match="cancelled"):  # a user's kill still fails
        op._handle({"ti": _TI()}, _event("cancelled", "cancelled"), 0.0)


def test_a_bad_preemption_grace_is_a_parse_error_naming_the_task() -> None:
    with pytest.raises(SpecError, match="task 't'.*grace"):
        GpuSSHOperator(task_id="t", command="true", team="nlp", preemption_grace="3h")


def test_a_preempted_jobs_end_never_releases_the_requests_next_allocation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Preempted with a long grace, the request is placed again elsewhere before its old job
    ends: the watcher of the old job must not give the new GPUs back."""
    import asyncio

    from gpu_pool.engine import plan
    from gpu_pool.executor_support.cycle import PlacementCycle
    from gpu_pool.model import Policy, Team
    from gpu_pool.spec import parse_node, parse_request
    from gpu_pool.store import Store
    from gpu_pool.triggers.remote_job import GpuRemoteJobTrigger

    store = Store.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    store.migrate()
    store.upsert_team(Team("nlp"), actor="t")
    store.import_nodes([parse_node({"name": "n", "gpu_model": "A100", "gpus": 2})], actor="t")
    monkeypatch.setenv("AIRFLOW__GPU_POOL__STORE_URL", store.url)
    cycle = PlacementCycle(store=store, policy=Policy(), planner=plan, actor="t",
                           idle_replan_s=0)
    cycle.admit(parse_request({"name": "r", "team": "nlp", "gpus": 1}), {})
    (binding,) = cycle.run({"r"}).bindings  # its next run's allocation, active
    trigger = GpuRemoteJobTrigger(jobs=[], started_at=0.0, request="r")
    assert asyncio.run(trigger._release(Outcome.PREEMPTED, None, {})) is False
    assert [a.id for a in store.active_allocations()] == [binding.allocations[0].id]
    assert asyncio.run(trigger._release(Outcome.SUCCESS, None, {})) is True  # the control
    assert store.active_allocations() == []
    store.close()


class _Victims:
    """A store naming one stopping job, and a runner whose job never stops (or whose
    store is down)."""

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.polls = 0

    def store(self, create: bool = False) -> Any:
        if self.down:
            raise ConnectionError("store down")
        from gpu_pool.store.jobs import JobRecord

        job = JobRecord("v1", "victim", "node-a", "conn", "/tmp/jobs", 2.0, "preempted", 0.3)
        return type("S", (), {"jobs_stopping_on": lambda s, node, gpus: [job],
                              "close": lambda s: None})()

    def runner(self, conn_id: str) -> Any:
        outer = self

        class Runner:
            def __enter__(self) -> Any:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

            def poll(self, job: RemoteJob) -> JobStatus:
                outer.polls += 1
                return JobStatus(JobState.RUNNING, group_alive=True)
        return Runner()


@pytest.mark.parametrize("down", [False, True])
def test_the_wait_for_a_stopping_victim_is_bounded_by_its_grace(
        monkeypatch: pytest.MonkeyPatch, down: bool) -> None:
    # A victim that outlives its grace plus the margin, or a store that cannot be asked,
    # does not keep the winner from starting: it starts, warning.
    import time

    from gpu_pool.executor_support import release
    from gpu_pool.operators import gpu_ssh

    fake = _Victims(down)
    monkeypatch.setattr(release, "store_from_airflow", fake.store)
    monkeypatch.setattr(gpu_ssh, "RemoteJobRunner", fake.runner)
    monkeypatch.setattr(gpu_ssh, "STOP_MARGIN_S", 0.2)
    op = GpuSSHOperator(task_id="t", command="true", team="nlp", poll_interval=0.05)
    warned: list[str] = []
    monkeypatch.setattr(op.log, "warning", lambda msg, *args: warned.append(msg % args))
    began = time.monotonic()
    op.wait_for_stopping("node-a", [0, 1])
    took = time.monotonic() - began
    if down:
        assert fake.polls == 0 and "Could not ask the gpu-pool store" in " ".join(warned)
    else:
        assert 0.5 <= took < 5 and fake.polls >= 5  # stop grace 0.3 s + margin 0.2 s
        assert "past its grace; starting anyway" in " ".join(warned)
