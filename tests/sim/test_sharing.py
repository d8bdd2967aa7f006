"""Teams mode of the replay: the team rules, the guarantees, the accounting of preemptions,
and hand-built scenarios where a guarantee is lent out and taken back."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from gpu_pool.errors import SpecError
from gpu_pool.model import PriorityClass, Purpose
from gpu_pool.sim.replay import ReplayConfig, jobs_of, replay_summary, run_replay
from gpu_pool.sim.sharing import assign_owners, sharing_off
from gpu_pool.sim.teams import (
    TEAM_NAMES,
    burst_hours,
    concurrent_demand,
    guarantees,
    owner_of,
    parse_teams,
)
from gpu_pool.sim.trace import Trace, TraceNode, TraceTask, load_trace

DATA = Path(__file__).resolve().parents[1] / "data"
HOUR = 3600


def excerpt() -> Trace:
    return load_trace(DATA / "openb_nodes_excerpt.csv", DATA / "openb_pods_excerpt.csv")


@pytest.mark.parametrize(("qos", "duration", "arrival", "burst", "want", "gpus"), [
    ("Guaranteed", 10 * HOUR, 3 * HOUR, False, ("inference", PriorityClass.CRITICAL, False),
     8),
    ("LS", HOUR, 3 * HOUR, True, ("inference", PriorityClass.HIGH, False), 1),
    ("LS", HOUR, 3 * HOUR, True, ("inference", PriorityClass.HIGH, False), 0.3),
    ("LS", HOUR, 3 * HOUR, False, ("train", PriorityClass.NORMAL, True), 8),
    ("LS", HOUR, 3 * HOUR, True, ("research", PriorityClass.LOW, True), 2),
    ("LS", 5 * HOUR, 9 * HOUR, False, ("train", PriorityClass.NORMAL, True), 1),
    ("BE", 4 * HOUR, 20 * HOUR, True, ("pretrain", PriorityClass.BATCH, True), 1),
    ("BE", 4 * HOUR, 31 * HOUR + 5, False, ("pretrain", PriorityClass.BATCH, True), 1),
    ("BE", 600, 13 * HOUR, True, ("research", PriorityClass.LOW, True), 1),
    ("Burstable", 600, 13 * HOUR, False, ("train", PriorityClass.NORMAL, True), 1),
    (None, 60, 2 * HOUR, False, ("train", PriorityClass.NORMAL, True), 0),
])
def test_team_rules(qos, duration, arrival, burst, want, gpus) -> None:
    bursts = frozenset({arrival // HOUR}) if burst else frozenset()
    o = owner_of(qos, duration, arrival, gpus, bursts)
    assert (o.team, o.priority, o.preemptible) == want
    assert o.purpose == {"inference": Purpose.INFERENCE, "train": Purpose.TRAINING,
                         "pretrain": Purpose.PRETRAINING, "research": Purpose.TRAINING}[o.team]


def test_assignment_is_deterministic_and_covers_the_excerpt() -> None:
    trace = excerpt()
    jobs = jobs_of(trace, ReplayConfig())
    first = [(j.team, j.priority, j.preemptible) for j in assign_owners(trace, jobs)]
    again = [(j.team, j.priority, j.preemptible) for j in assign_owners(trace, jobs)]
    assert first == again
    teams = [t for t, _, _ in first]
    assert set(teams) == set(TEAM_NAMES)  # every team gets work, every task a team
    assert len(teams) == len(jobs) == 400
    # Inference is never preemptible; everything else is.
    assert all(p is False for t, _, p in first if t == "inference")
    assert all(p is True for t, _, p in first if t != "inference")


def test_burst_hours_are_the_busiest_tenth() -> None:
    arrivals = [0] * 10 + [HOUR] * 2 + [2 * HOUR] * 3 + [3 * HOUR]
    assert burst_hours(arrivals) == frozenset({0})


def test_concurrent_demand_by_hand() -> None:
    # a: 2 GPUs on [0, 1200); b: 1 GPU on [600, 700); c: 0.5 on [1200, 2400).
    level = concurrent_demand(np.array([0, 600, 1200.0]), np.array([1200, 100, 1200.0]),
                              np.array([2, 1, 0.5]), 0, 2400)
    # Samples at 0, 600 (b starts: counted), 1200 (a ends: gone; c starts), 1800.
    assert list(level) == [2.0, 3.0, 0.5, 0.5]


def test_guarantees_add_up_to_the_fleet() -> None:
    got = guarantees({"a": 7.0, "b": 21.0, "c": 28.0, "d": 1.0}, 69)
    assert sum(got.values()) == 69 and min(got.values()) >= 1
    assert got["c"] > got["b"] > got["a"] > got["d"]
    assert guarantees({"a": 0.0, "b": 0.0}, 5) in ({"a": 3, "b": 2}, {"a": 2, "b": 3})
    with pytest.raises(SpecError, match="fleet GPUs"):
        guarantees({"a": 1.0, "b": 1.0, "c": 1.0}, 2)


def test_teams_flag_values() -> None:
    assert parse_teams("4") == 4 and parse_teams("0") == 0
    with pytest.raises(SpecError, match="teams"):
        parse_teams("3")
    with pytest.raises(SpecError, match="engine"):
        run_replay(excerpt(), "fifo", ReplayConfig(teams=4))


def check_accounting(result) -> None:
    """The invariants every teams-mode run keeps (see gpu_pool.sim.sharing)."""
    rec = result.sharing
    assert max(result.allocated) <= 1 + 1e-9
    for job, s, f, held, lost, n in zip(result.jobs, result.start, rec.finished,
                                        rec.held_gpu_s, rec.lost_gpu_s, rec.preempted,
                                        strict=True):
        if s is None:
            continue
        assert f is not None, f"{job.task.name} started and never ended"
        assert held == pytest.approx(job.gpus * job.duration + lost, abs=1e-6)
        assert lost >= -1e-9
        stops = [e for e in rec.preemptions if e.victim == job.index and not e.moot]
        assert n == len(stops)
        if n == 0:
            assert lost == pytest.approx(0, abs=1e-9)
    stops = [e for e in rec.preemptions if not e.moot]
    assert sum(rec.lost_gpu_s) == pytest.approx(sum(e.lost_gpu_s for e in stops))
    summary = replay_summary(result)["sharing"]
    assert summary["gpu_hours_held"] == pytest.approx(
        summary["useful_gpu_hours"] + summary["gpu_hours_lost"])


@pytest.mark.parametrize("sharing", [True, False])
def test_excerpt_replay_with_teams_is_consistent(sharing: bool) -> None:
    config = ReplayConfig(fleet_fraction=0.05, teams=4,
                          policy=None if sharing else sharing_off())
    result = run_replay(excerpt(), "engine", config)
    check_accounting(result)
    summary = replay_summary(result)
    sh = summary["sharing"]
    assert summary["never_started"] == 0 and sh["unfinished"] == 0
    assert sum(t["tasks"] for t in sh["teams"].values()) == 400
    assert sum(t["guarantee_gpus"] for t in sh["teams"].values()) == sh["fleet_gpus"]
    assert sh["policy"]["borrowing"] is sharing
    # GPU-hours conserved: what the trace asks, plus what preemption lost.
    asked = sum(j.gpus * j.duration for j in result.jobs) / 3600
    assert sh["gpu_hours_held"] == pytest.approx(asked + sh["gpu_hours_lost"])


def node4() -> TraceNode:
    return TraceNode("n", 64000, 262144, 4, "T4")


def task(name: str, qos: str, at: int, runs: int, gpus: int = 1, cpu: int = 1000
         ) -> TraceTask:
    return TraceTask(name, cpu, 1024, gpus, 1000 if gpus else 0, frozenset(), qos, "Running",
                     at, at + runs, at)


def scenario(*late: TraceTask) -> Trace:
    # Four 10-hour train tasks (BE, arriving 09:00: rule 3) fill the node; ``late`` come after.
    early = tuple(task(f"t{k}", "BE", 9 * HOUR, 10 * HOUR) for k in range(4))
    return Trace((node4(),), early + late, "nodes", "pods")


def by_name(result) -> dict[str, tuple]:
    rec = result.sharing
    return {j.task.name: (j, s, f, n) for j, s, f, n in
            zip(result.jobs, result.start, rec.finished, rec.preempted, strict=True)}


GUARANTEES = (("inference", 2), ("train", 2))


def test_critical_work_preempts_and_the_victim_resumes_and_completes() -> None:
    arrive = 9 * HOUR + 1800
    trace = scenario(task("c", "Guaranteed", arrive, HOUR))
    config = ReplayConfig(heartbeat_s=60, teams=4, guarantees=GUARANTEES)
    result = run_replay(trace, "engine", config)
    check_accounting(result)
    got = by_name(result)
    job, start, _, _ = got["c"]
    grace = max((e.grace_s for e in result.sharing.preemptions), default=math.inf)
    assert start is not None and start - arrive <= 60 + grace
    victims = [name for name, (_, _, _, n) in got.items() if n]
    assert victims and "c" not in victims  # only the preemptible train tasks are stopped
    for name in victims:
        vjob, vstart, vend, n = got[name]
        assert vjob.preemptible and vend is not None
        lost = result.sharing.lost_gpu_s[vjob.index]
        assert lost == pytest.approx(n * (grace + config.restart_overhead_s))
        # It resumed with the work it had left at the SIGTERM and finished all of it.
        assert vend >= vstart + vjob.duration + n * (grace + config.restart_overhead_s) - 1e-6


def test_a_lent_guarantee_is_reclaimed_within_heartbeat_plus_grace() -> None:
    # Train (guarantee 2) borrows inference's 2 idle GPUs; two inference tasks (LS, high,
    # within inference's guarantee) arrive 30 min later and take them back.
    arrive = 9 * HOUR + 1800
    trace = scenario(task("i0", "LS", arrive, HOUR), task("i1", "LS", arrive, HOUR))
    config = ReplayConfig(heartbeat_s=60, teams=4, guarantees=GUARANTEES)
    result = run_replay(trace, "engine", config)
    check_accounting(result)
    got = by_name(result)
    assert result.sharing.borrowed_starts >= 2
    grace = config.policy.preemption_grace.total_seconds() if config.policy else 120.0
    for name in ("i0", "i1"):
        _, start, _, _ = got[name]
        assert start is not None and start - arrive <= 60 + grace
    kinds = {e.kind for e in result.sharing.preemptions}
    assert kinds == {"reclaim"}
    assert sorted(n for _, _, _, n in got.values()) == [0, 0, 0, 0, 1, 1]
    summary = replay_summary(result)["sharing"]
    inference = summary["teams"]["inference"]
    assert inference["longest_below_guarantee_with_work_s"] <= 60 + grace
    # The arrival's own cycle reclaimed: no stretch in which reclaim could have and had not.
    assert inference["longest_below_guarantee_restorable_s"] == 0


def test_below_guarantee_counts_as_restorable_only_where_the_task_fits_after_reclaim() -> None:
    # As above, but the inference task asks for more CPU than the node has: it waits below
    # its guarantee while train holds beyond its own, and no preemption could start it.
    arrive = 9 * HOUR + 1800
    big = TraceTask("i0", 96000, 1024, 1, 1000, frozenset(), "LS", "Running", arrive,
                    arrive + HOUR, arrive)
    result = run_replay(scenario(big), "engine",
                        ReplayConfig(heartbeat_s=60, teams=4, guarantees=GUARANTEES))
    check_accounting(result)
    assert by_name(result)["i0"][1] is None and result.sharing.preemptions == ()
    inference = replay_summary(result)["sharing"]["teams"]["inference"]
    assert inference["longest_below_guarantee_with_work_s"] > 9 * HOUR
    assert inference["longest_below_guarantee_while_others_borrow_s"] > 9 * HOUR
    assert inference["longest_below_guarantee_restorable_s"] == 0



def test_a_reclaim_under_way_counts_as_restoring_until_the_grace_ends() -> None:
    # i0 and i1 reclaim two of train's GPUs at once and wait out the victims' grace; i2,
    # asking more CPU than the node has, waits too. Inference holds nothing meanwhile and
    # has a queued task within its guarantee: below it, and being restored, for the grace.
    arrive = 9 * HOUR + 1800
    big = TraceTask("i2", 96000, 1024, 1, 1000, frozenset(), "LS", "Running", arrive,
                    arrive + HOUR, arrive)
    config = ReplayConfig(heartbeat_s=60, teams=4, guarantees=GUARANTEES)
    result = run_replay(scenario(task("i0", "LS", arrive, HOUR), task("i1", "LS", arrive, HOUR),
                                 big), "engine", config)
    check_accounting(result)
    got = by_name(result)
    assert got["i0"][1] == got["i1"][1] == arrive + 120 and got["i2"][1] is None
    inference = replay_summary(result)["sharing"]["teams"]["inference"]
    assert inference["longest_below_guarantee_restorable_s"] == 120
    # Once i0 and i1 end, i2 leaves inference below its guarantee again, where no
    # preemption can place it: below, not restorable.
    assert inference["longest_below_guarantee_with_work_s"] > 9 * HOUR


def test_teams_mode_declares_time_limits_to_the_engine(monkeypatch) -> None:
    # As in every engine replay, each task declares its run times a seeded factor: the
    # engine sees it as the request's limit and as the running work's ends_by (taken
    # from each run's own start, a restart's too).
    from gpu_pool.sim import sharing

    seen: list[tuple] = []
    real = sharing.plan_on_state

    def spy(state, requests, **kw):
        seen.append((kw["now"], list(requests), list(kw["allocations_usage"])))
        return real(state, requests, **kw)

    monkeypatch.setattr(sharing, "plan_on_state", spy)
    arrive = 9 * HOUR + 1800
    config = ReplayConfig(heartbeat_s=60, teams=4, guarantees=GUARANTEES)
    result = run_replay(scenario(task("i0", "LS", arrive, HOUR)), "engine", config)
    limits = {f"j{j.index}": j.time_limit for j in result.jobs}
    assert all(lim is not None and lim >= j.duration for j, lim in
               zip(result.jobs, limits.values(), strict=True))
    requests = [r for _, rs, _ in seen for r in rs]
    allocations = [a for _, _, al in seen for a in al]
    assert requests and allocations
    for r in requests:
        assert r.time_limit.total_seconds() == limits[r.name]
    for a in allocations:
        assert (a.ends_by - a.started_at).total_seconds() == limits[a.request_name]

def test_a_cycle_that_places_work_is_followed_by_one_at_the_next_heartbeat() -> None:
    # Five 10-hour train tasks at 09:00 on a 4-GPU node: the 09:00 cycle starts four and
    # the fifth waits. Nothing arrives or ends until 19:00, but the executor plans every
    # heartbeat, and what a cycle placed may let the next one do more (reclaim what was
    # just lent): the replay plans again at 09:01.
    extra = task("t4", "BE", 9 * HOUR, 10 * HOUR)
    result = run_replay(scenario(extra), "engine",
                        ReplayConfig(heartbeat_s=60, teams=4, guarantees=GUARANTEES))
    check_accounting(result)
    # (10:00 is a cycle of its own: t4 has waited reserve_after, an hour.)
    assert [t for t in result.times if t < 10 * HOUR] == [9 * HOUR, 9 * HOUR + 60]


def test_without_sharing_a_team_stays_within_its_guarantee() -> None:
    arrive = 9 * HOUR + 1800
    trace = scenario(task("i0", "LS", arrive, HOUR))
    result = run_replay(trace, "engine", ReplayConfig(heartbeat_s=60, teams=4,
                                                      guarantees=GUARANTEES,
                                                      policy=sharing_off()))
    check_accounting(result)
    got = by_name(result)
    starts = sorted(s for name, (_, s, _, _) in got.items() if name.startswith("t"))
    assert starts[:2] == [9 * HOUR, 9 * HOUR]
    assert starts[2] >= 19 * HOUR  # the other two wait for the first two to end
    assert got["i0"][1] - arrive <= 60  # inference's guarantee was never lent
    assert result.sharing.preemptions == ()


def test_compress_divides_arrivals_and_keeps_durations() -> None:
    trace = excerpt()
    plain = jobs_of(trace, ReplayConfig())
    fast = jobs_of(trace, ReplayConfig(compress=2))
    assert [j.task.name for j in plain] == [j.task.name for j in fast]
    assert [j.duration for j in plain] == [j.duration for j in fast]
    assert [j.arrival for j in fast] == [int(j.task.creation_time / 2) for j in plain]


def test_cli_replay_with_teams(capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_pool.cli import main

    base = ["simulate", "replay", "--nodes", str(DATA / "openb_nodes_excerpt.csv"), "--pods",
            str(DATA / "openb_pods_excerpt.csv"), "--policy", "engine", "--fleet-fraction",
            "0.05", "--teams", "4"]
    assert main(base) == 0
    out = capsys.readouterr().out
    assert "borrowing on, reclaim on, off-peak lending on" in out
    for team in TEAM_NAMES:
        assert f"\n{team:>10} " in out
    assert "GPU-hours lost" in out
    assert main([*base, "--no-sharing", "--json"]) == 0
    import json

    summary = json.loads(capsys.readouterr().out)
    assert summary["sharing"]["policy"]["borrowing"] is False
    assert summary["sharing"]["policy"]["lend_idle_off_peak"] is False


@pytest.mark.parametrize(("extra", "message"), [
    (["--policy", "fifo", "--teams", "4"], "teams: got '4'; expected teams only with "
     "--policy engine"),
    (["--policy", "engine", "--teams", "2"], "teams: got '2'; expected 4"),
    (["--policy", "engine", "--no-sharing"], "no-sharing: got 'without --teams'; expected "
     "--teams 4 with it"),
    (["--policy", "engine", "--teams", "4", "--restart-overhead", "-1"],
     "restart-overhead: got '-1'"),
    (["--policy", "engine", "--compress", "0"], "compress: got '0'"),
])
def test_cli_bad_team_flags_exit_2(extra: list[str], message: str,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_pool.cli import main

    argv = ["simulate", "replay", "--nodes", str(DATA / "openb_nodes_excerpt.csv"), "--pods",
            str(DATA / "openb_pods_excerpt.csv"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_peak_preemption_without_a_winner_stops_and_requeues(monkeypatch) -> None:
    # The engine here has no peak reclaim (the offpeak branch adds it): a stand-in engine
    # places the one task, then, at the first cycle at or after 08:00, preempts it as the
    # peak would (no request wins it); it must stop after grace, requeue and finish.
    from gpu_pool.engine.types import Plan, Preemption
    from gpu_pool.sim import sharing

    real = sharing.plan_on_state
    calls = {"peak": 0}

    def engine(state, requests, *, allocations_usage, now, **kw):
        if now.hour >= 8 and allocations_usage and not calls["peak"]:
            calls["peak"] += 1
            (a,) = allocations_usage
            return Plan((), (), (Preemption(a.id, a.request_name, "", "the peak", 120.0,
                                            "peak"),))
        return real(state, requests, allocations_usage=allocations_usage, now=now, **kw)

    monkeypatch.setattr(sharing, "plan_on_state", engine)
    # A 10-hour pretrain task arriving at 02:00 (rule 4), and a short research task at
    # 08:00 so that a cycle runs at the peak.
    trace = Trace((node4(),), (task("p", "BE", 2 * HOUR, 10 * HOUR),
                               task("r", "BE", 8 * HOUR, 60)), "nodes", "pods")
    result = run_replay(trace, "engine", ReplayConfig(heartbeat_s=60, teams=4,
                                                      guarantees=(("pretrain", 4),
                                                                  ("train", 1))))
    check_accounting(result)
    (event,) = result.sharing.preemptions
    assert (event.kind, event.for_request, event.moot) == ("peak", "", False)
    p = result.jobs[0]
    assert result.sharing.preempted[p.index] == 1
    # Stopped at 08:00 + 120 s, restarted at once (nothing else wants the node), finished.
    assert result.sharing.requeue_waits == (0.0,)
    assert result.sharing.finished[p.index] == pytest.approx(
        2 * HOUR + 10 * HOUR + 120 + 60)


def _measure(free_gpus: int, ask_cpu: int, reserved: frozenset[int]) -> bool:
    """Whether inference (held 0 of 2) counts as restorable with one queued 1-GPU task asking
    ``ask_cpu``, on one 4-GPU, 64-core node where train (guarantee 2) runs
    ``4 - free_gpus`` preemptible 1-GPU, 1-core tasks."""
    from types import SimpleNamespace

    from gpu_pool.model import Allocation, Policy
    from gpu_pool.sim.engine_policy import SIM_EPOCH
    from gpu_pool.sim.fleet import SimFleet
    from gpu_pool.sim.replay import Job
    from gpu_pool.sim.sharing import _Attempt, _Shared

    fleet = SimFleet([node4()])
    attempts = {}
    for k in range(4 - free_gpus):
        t = task(f"t{k}", "BE", 0, HOUR)
        fleet.take(t, 0, (k,))
        job = Job(k, t, 0, HOUR, PriorityClass.NORMAL, team="train", preemptible=True)
        alloc = Allocation(f"j{k}", "n", (k,), 1000, t.cpu_milli, t.memory_mib, "train",
                           Purpose.TRAINING, PriorityClass.NORMAL, "T4", SIM_EPOCH,
                           preemptible=True)
        attempts[k] = _Attempt(job, 1, 0.0, HOUR, 0.0, 0, (k,), alloc)
    ask = TraceTask("i", ask_cpu, 1024, 1, 1000, frozenset(), "LS", "Running", 0, HOUR, 0)
    waiting = Job(9, ask, 0, HOUR, PriorityClass.HIGH, team="inference")
    shared = SimpleNamespace(policy=Policy(), attempts=attempts, handovers={},
                             guarantee={"inference": 2, "train": 2}, count=[0] * 10,
                             runner=SimpleNamespace(fleet=fleet), _restores=_Shared._restores)
    teams = list(TEAM_NAMES)
    held = [float(4 - free_gpus) if t == "train" else 0.0 for t in teams]
    below = [t == "inference" for t in teams]
    out = _Shared.restorable(shared, [waiting], held, below, 60.0, reserved)
    return out[teams.index("inference")]


@pytest.mark.parametrize(("free_gpus", "ask_cpu", "reserved", "restorable"), [
    (0, 1000, frozenset(), True),       # train holds 2 beyond its guarantee: reclaim fits it
    (0, 1000, frozenset({0}), False),   # ... but the node is reserved for a starving request
    (0, 96000, frozenset(), False),     # no preemption gives it the cores it asks
    (1, 1000, frozenset(), False),      # it fits already: waiting on something else
])
def test_restorable_is_judged_on_a_node(free_gpus, ask_cpu, reserved, restorable) -> None:
    assert _measure(free_gpus, ask_cpu, reserved) is restorable


def test_what_a_preemption_won_stays_held_through_the_grace() -> None:
    # Three train tasks on the 4-GPU node. At 09:30 critical i0 (2 GPUs) takes the free
    # GPU and preempts one train task. At 09:31, during the grace, i1 (1 GPU, inference
    # high, within inference's guarantee) arrives: the free GPU is i0's already (the store
    # records the winner's allocation the cycle it preempts), so i1 reclaims another of
    # train's, and i0's handover does not miss (it did: i1 took the GPU, and i0 waited
    # for two more preemptions).
    arrive = 9 * HOUR + 1800
    early = tuple(task(f"t{k}", "BE", 9 * HOUR, 10 * HOUR) for k in range(3))
    trace = Trace((node4(),), early + (task("i0", "Guaranteed", arrive, HOUR, gpus=2),
                                       task("i1", "LS", arrive + 60, HOUR)), "nodes", "pods")
    config = ReplayConfig(heartbeat_s=60, teams=4, guarantees=(("inference", 3), ("train", 1)))
    result = run_replay(trace, "engine", config)
    check_accounting(result)
    got = by_name(result)
    grace = 120
    assert result.sharing.handovers_missed == 0
    assert got["i0"][1] == arrive + grace
    assert got["i1"][1] == arrive + 60 + grace
    assert sorted(n for name, (_, _, _, n) in got.items() if name.startswith("t")) == [0, 1, 1]


def test_a_preemption_winner_holds_only_what_its_victims_do_not_free() -> None:
    # Three train tasks hold 60 of the node's 64 cores. Critical i0 (2 GPUs, 20 cores)
    # takes the free GPU and one train task's GPU and cores; the same cycle places c0, a
    # CPU-only task (train, placed after the critical work), on the 4 cores left. Holding
    # i0's cores from the 4 free ones would leave c0 none: the referee refuses such a start.
    arrive = 9 * HOUR + 1800
    early = tuple(task(f"t{k}", "BE", 9 * HOUR, 10 * HOUR, cpu=20000) for k in range(3))
    trace = Trace((node4(),), early + (task("i0", "Guaranteed", arrive, HOUR, 2, 20000),
                                       task("c0", "BE", arrive, HOUR, 0, 4000)),
                  "nodes", "pods")
    result = run_replay(trace, "engine", ReplayConfig(heartbeat_s=60, teams=4,
                                                      guarantees=GUARANTEES))
    check_accounting(result)
    got = by_name(result)
    assert got["c0"][1] == arrive and got["i0"][1] == arrive + 120
    assert result.sharing.handovers_missed == 0


def test_winners_on_one_node_hold_what_all_the_cycles_victims_do_not_free() -> None:
    # The node's four GPUs and 63 of its 64 cores are held by train tasks of 40, 12, 10
    # and 1 cores. Critical i0 and i1 (1 GPU, 20 cores each) arrive together: the engine
    # stops the 40-core task for i0 and the 12-core one for i1, which counts on the 20
    # cores i0 leaves of its victim's. Held per winner alone, i1's hold asked for 8 cores
    # beyond its victim's, of the one free: the referee refused it.
    arrive = 9 * HOUR + 1800
    early = tuple(task(f"t{k}", "BE", 9 * HOUR, 10 * HOUR, cpu=c)
                  for k, c in enumerate((40000, 12000, 10000, 1000)))
    trace = Trace((node4(),), early + (task("i0", "Guaranteed", arrive, HOUR, cpu=20000),
                                       task("i1", "Guaranteed", arrive, HOUR, cpu=20000)),
                  "nodes", "pods")
    result = run_replay(trace, "engine", ReplayConfig(heartbeat_s=60, teams=4,
                                                      guarantees=GUARANTEES))
    check_accounting(result)
    got = by_name(result)
    assert got["i0"][1] == got["i1"][1] == arrive + 120
    assert result.sharing.handovers_missed == 0
    assert len({e.victim for e in result.sharing.preemptions}) == 2


def test_a_victim_that_ends_within_the_grace_leaves_its_gpu_to_the_winner() -> None:
    # Train tasks t0 and t1 hold two of the node's GPUs for ten hours; research task t2
    # (low) a third until 10:31. At 10:30 critical i0 (3 GPUs) takes the free GPU and
    # preempts t2 and a train task; t2's own run ends at 10:31, within the grace. x
    # (research, within its guarantee) arrives at 10:31: t2's GPU is i0's (the store
    # holds the winner's allocation from the cycle it preempts), so x must not start on
    # it. Before, t2's end freed the GPU for everyone, x took it and i0's handover at
    # 10:32, when the train task had stopped, missed.
    arrive = 10 * HOUR + 1800
    trace = Trace((node4(),), (task("t0", "BE", 9 * HOUR, 10 * HOUR),
                               task("t1", "BE", 9 * HOUR, 10 * HOUR),
                               task("t2", "BE", arrive - 300, 360),
                               task("i0", "Guaranteed", arrive, HOUR, gpus=3),
                               task("x", "BE", arrive + 60, 600)), "nodes", "pods")
    config = ReplayConfig(heartbeat_s=60, teams=4, guarantees=(
        ("inference", 3), ("train", 1), ("research", 1)))
    result = run_replay(trace, "engine", config)
    check_accounting(result)
    got = by_name(result)
    assert got["t2"][0].team == "research" and got["x"][0].team == "research"
    assert result.sharing.handovers_missed == 0
    pre = {result.jobs[e.victim].task.name: e.moot for e in result.sharing.preemptions
           if e.for_request == f"j{got['i0'][0].index}"}
    assert pre.pop("t2") is True and list(pre.values()) == [False]
    assert got["i0"][1] == arrive + 120
    assert got["x"][1] is not None and got["x"][1] > arrive + 60
