"""The reclaim sweep's pure planner: which holds are dead, idle, or foreign."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpu_pool.model import Allocation, PriorityClass, Purpose
from gpu_pool.ops.config import OpsConfig
from gpu_pool.ops.reclaim import GpuProcess, GpuSample, plan_sweep

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CFG = OpsConfig(idle_minutes=60, idle_util_pct=5.0, reclaim_grace_minutes=10)


def alloc(name: str, node: str = "n1", gpus: tuple[int, ...] = (0,),
          age: timedelta = timedelta(hours=3)) -> Allocation:
    return Allocation(name, node, gpus, 1000, 0, 0, "vision", Purpose.TRAINING,
                      PriorityClass.NORMAL, "A100", NOW - age)


def samples(node: str, index: int, util: float, minutes: int = 60,
            every: int = 5) -> list[GpuSample]:
    return [GpuSample(node, index, NOW - timedelta(minutes=m), util)
            for m in range(0, minutes + 1, every)]


@pytest.mark.parametrize(("state", "released"), [
    ("success", True), ("failed", True), ("upstream_failed", True), ("skipped", True),
    ("removed", True), ("up_for_retry", True),
    ("running", False), ("queued", False), ("deferred", False), ("scheduled", False),
    ("restarting", False), ("up_for_reschedule", False), (None, False), ("weird", False),
])
def test_only_dead_states_release(state: str | None, released: bool) -> None:
    plan = plan_sweep([alloc("r")], {"r": state}, [], [], CFG, NOW)
    assert bool(plan.dead) is released
    assert ("r" in plan.kept) is not released


def test_grace_protects_fresh_allocations() -> None:
    young = alloc("r", age=timedelta(minutes=3))
    assert plan_sweep([young], {"r": "removed"}, [], [], CFG, NOW).dead == ()


def test_gang_is_released_as_one() -> None:
    gang = [alloc("g", "n1", (0, 1)), alloc("g", "n2", (0, 1))]
    (hold,) = plan_sweep(gang, {"g": "failed"}, [], [], CFG, NOW).dead
    assert [a.node for a in hold.allocations] == ["n1", "n2"]


def test_idle_needs_every_gpu_idle_over_the_whole_window() -> None:
    two = [alloc("r", gpus=(0, 1))]
    idle = samples("n1", 0, 1.0) + samples("n1", 1, 0.0)
    (hold,) = plan_sweep(two, {"r": "running"}, idle, [], CFG, NOW).idle
    assert hold.request_name == "r" and hold.max_utilization_pct == 1.0
    one_busy = samples("n1", 0, 1.0) + samples("n1", 1, 0.0)[:-1] + [
        GpuSample("n1", 1, NOW - timedelta(minutes=60), 50.0)]
    assert plan_sweep(two, {"r": "running"}, one_busy, [], CFG, NOW).idle == ()
    short = samples("n1", 0, 1.0, minutes=30) + samples("n1", 1, 0.0, minutes=30)
    assert plan_sweep(two, {"r": "running"}, short, [], CFG, NOW).idle == ()
    missing = samples("n1", 0, 1.0)
    assert plan_sweep(two, {"r": "running"}, missing, [], CFG, NOW).idle == ()
    recent = [alloc("r", gpus=(0,), age=timedelta(minutes=30))]
    assert plan_sweep(recent, {"r": "running"}, missing, [], CFG, NOW).idle == ()


def test_foreign_processes_are_those_on_unheld_gpus() -> None:
    procs = [GpuProcess("n1", 0, 100, "python"), GpuProcess("n1", 3, 200, "bitcoin"),
             GpuProcess("n2", 0, 300, "jupyter")]
    plan = plan_sweep([alloc("r", "n1", (0, 1))], {"r": "running"}, [], procs, CFG, NOW)
    assert [(p.node, p.pid) for p in plan.foreign] == [("n1", 200), ("n2", 300)]
