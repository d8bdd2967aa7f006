"""Replay benchmark: a tiny timed trace with known queueing, the qos mapping, the fleet share."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_pool.errors import SpecError
from gpu_pool.sim.replay import ReplayConfig, fleet_share, replay_summary, run_replay
from gpu_pool.sim.trace import Trace, TraceNode, TraceTask, load_trace

DATA = Path(__file__).resolve().parents[1] / "data"


def timed(name: str, gpus: int, at: int, runs: int, qos: str = "LS") -> TraceTask:
    return TraceTask(name, 1000, 1024, gpus, 1000 if gpus else 0, frozenset(), qos, "Running",
                     at, at + runs, at)


def two_gpu_trace() -> Trace:
    # One node of 2 GPUs. a (2 GPUs) holds it for 1000 s; b (2 GPUs) must wait for it; c
    # (1 GPU, critical) arrives after b. FIFO keeps c behind b; the others let c wait too,
    # since nothing is free until a ends; after that b and c cannot both run.
    tasks = (timed("a", 2, 0, 1000), timed("b", 2, 60, 500, "BE"),
             timed("c", 1, 120, 100, "Guaranteed"))
    return Trace((TraceNode("n", 8000, 65536, 2, "T4"),), tasks, "nodes", "pods")


def delays(policy: str) -> dict[str, float | None]:
    result = run_replay(two_gpu_trace(), policy, ReplayConfig(heartbeat_s=60))
    return {j.task.name: (None if s is None else s - j.arrival)
            for j, s in zip(result.jobs, result.start, strict=True)}


def test_fifo_serves_in_arrival_order() -> None:
    # a ends at 1000, released at the 1020 cycle: b starts then, c after b (1020 + 500).
    assert delays("fifo") == {"a": 0, "b": 960, "c": 1500 - 120 + 60}


def test_engine_starts_the_critical_task_first() -> None:
    got = delays("engine")
    assert got["a"] == 0 and got["c"] == 1020 - 120  # c is critical, b (BE -> low) waits
    assert got["b"] == 1140 - 60  # c ends at 1120, released at the 1140 cycle


def test_summary_reports_every_class_and_allocation() -> None:
    summary = replay_summary(run_replay(two_gpu_trace(), "bestfit", ReplayConfig()))
    assert summary["never_started"] == 0
    assert set(summary["queueing_delay_s"]) == {"critical", "high", "low"}
    assert 0 < summary["gpu_allocation_pct"]["mean"] <= 100
    assert summary["qos_to_priority"]["BE"] == "low"


def test_replay_of_the_excerpt_on_a_fleet_share() -> None:
    trace = load_trace(DATA / "openb_nodes_excerpt.csv", DATA / "openb_pods_excerpt.csv")
    share = fleet_share(trace, 0.1, 42)
    assert {n.model for n in share.nodes} == {n.model for n in trace.nodes}
    assert len(share.nodes) < len(trace.nodes)
    for policy in ("engine", "fifo", "bestfit"):
        summary = replay_summary(run_replay(trace, policy, ReplayConfig(fleet_fraction=0.1)))
        assert summary["tasks"] == 400 and summary["cycles"] > 0


def test_untimed_task_lists_are_refused() -> None:
    untimed = Trace((TraceNode("n", 8000, 65536, 2, "T4"),),
                    (TraceTask("a", 1000, 1024, 1, 1000),), "nodes", "pods.csv")
    with pytest.raises(SpecError, match="creation_time"):
        run_replay(untimed, "fifo")


def test_engine_reservation_ends_the_starvation_of_a_big_task() -> None:
    # One 2-GPU node; 1-GPU tasks of 600 s arrive every 300 s, so one GPU frees every 300 s
    # and is taken at once; the 2-GPU task b needs the node empty. Without the guard it
    # waits for the stream to end; with it, it reserves the node at the first cycle after
    # 600 s of waiting (900: s1 ends, s3 arrives and waits) and starts when s2 ends (1200).
    tasks = (timed("b", 2, 30, 100), *[timed(f"s{k}", 1, 300 * k, 600) for k in range(30)])
    trace = Trace((TraceNode("n", 8000, 65536, 2, "T4"),), tasks, "nodes", "pods")

    def delay_of_b(**guard: float) -> float | None:
        # No declared limits: backfill (the next test) stays out of it. With over-asked
        # limits, s3 may backfill until s2's *limit*, and b then starts when s3 ends.
        result = run_replay(trace, "engine", ReplayConfig(heartbeat_s=60,
                                                          time_limit_factor=None, **guard))
        (s,) = [s for j, s in zip(result.jobs, result.start, strict=True) if j.task.name == "b"]
        return None if s is None else s - 30

    assert delay_of_b(reserve_after_s=0) >= 8700  # after the whole stream
    assert delay_of_b(reserve_after_s=600) == 1200 - 30


def test_engine_backfills_short_work_before_the_reserved_start() -> None:
    # As above, plus t: one GPU for 100 s, arriving at 930 while b holds the node. With
    # declared limits equal to the runs, b's expected start is 1200 (s2's limit) and t,
    # done by 1060, starts at once on the GPU s1 freed; s3 (limit 600, to 1500) may not.
    # Without declared limits nothing may start on the reserved node: t waits for b.
    tasks = (timed("b", 2, 30, 100), *[timed(f"s{k}", 1, 300 * k, 600) for k in range(30)],
             timed("t", 1, 930, 100))
    trace = Trace((TraceNode("n", 8000, 65536, 2, "T4"),), tasks, "nodes", "pods")

    def delays_of(factor: tuple[float, float] | None) -> dict[str, float | None]:
        result = run_replay(trace, "engine", ReplayConfig(
            heartbeat_s=60, reserve_after_s=600, time_limit_factor=factor))
        return {j.task.name: None if s is None else s - j.arrival
                for j, s in zip(result.jobs, result.start, strict=True)}

    exact = delays_of((1.0, 1.0))
    assert exact["b"] == 1200 - 30 and exact["t"] == 960 - 930
    blind = delays_of(None)
    assert blind["b"] == 1200 - 30 and blind["t"] >= 1300 - 930


def test_declared_limits_are_seeded_and_never_below_the_run() -> None:
    from gpu_pool.sim.replay import jobs_of

    trace = load_trace(DATA / "openb_nodes_excerpt.csv", DATA / "openb_pods_excerpt.csv")
    first = jobs_of(trace, ReplayConfig(seed=7))
    assert [j.time_limit for j in first] == [j.time_limit for j in jobs_of(
        trace, ReplayConfig(seed=7))]
    assert all(j.duration <= j.time_limit <= 4 * j.duration + 1 for j in first)
    ratios = sorted(j.time_limit / j.duration for j in first if j.duration > 100)
    assert 1.6 < ratios[len(ratios) // 2] < 2.4  # log-uniform on [1, 4]: median 2
    assert all(j.time_limit is None for j in jobs_of(trace, ReplayConfig(
        time_limit_factor=None)))
    with pytest.raises(SpecError, match="time_limit_factor"):
        jobs_of(trace, ReplayConfig(time_limit_factor=(0.5, 2.0)))
