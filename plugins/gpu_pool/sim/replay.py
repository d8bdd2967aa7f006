"""The replay benchmark: a working cluster over time, in virtual time.

Protocol
--------
* A task arrives at ``creation_time`` and, once started, runs ``deletion_time -
  scheduled_time`` seconds (``deletion_time - creation_time`` when the trace never scheduled
  it), at least one second.
* Placement cycles run every ``heartbeat_s`` seconds of virtual time; a cycle first releases
  the tasks that ended, then admits the arrivals, then lets the policy start pending tasks.
  Cycles in which nothing arrived or ended are skipped (their outcome would not change).
* ``fleet_fraction``: the openb task list is a sample: at its own timestamps it keeps about
  40 GPUs of the 6,212 busy (0.2% offered load), and even compressed 3,000-fold in time it
  never asks for more than 3,800 at once, so on the full fleet nothing ever queues. To see a
  working cluster with real arrival times and durations, the replay can run on a share of
  the nodes: ``ceil(fraction x n)`` nodes of every (model, GPU count) group, chosen with the
  seed, so every model and node size stays present.
* Declared time limits (the trace has none): each task declares ``ceil(duration x f)``
  seconds, ``f`` drawn per task, log-uniform on ``ReplayConfig.time_limit_factor`` (default
  1 to 4: users over-ask, and never under-ask here, since a limit below the run would kill
  it), with its own seeded stream, so the same seed gives the same limits to every policy.
  The engine sees them as the requests' ``time_limit`` and as the running tasks'
  ``ends_by`` (reservations' expected starts, backfill, start estimates); the baselines
  ignore them. ``time_limit_factor=None``: no task declares one (the engine's rules then
  know no end of any running work).
* ``qos`` becomes a priority class: Guaranteed -> critical, LS (latency-sensitive) -> high,
  Burstable -> normal, BE (best effort) -> low; a task without qos is normal.

Policies
--------
engine
    :func:`gpu_pool.engine.plan_on_state` over the pending queue (head of at most
    ``max_cycle_tasks`` in priority then arrival order), priorities and aging included.
engine with teams (``ReplayConfig.teams``, ``--teams 4``)
    The tasks belong to four teams with guarantees (:mod:`gpu_pool.sim.teams`); the engine
    gets quotas and the active allocations, may borrow, reclaim and preempt, and a
    preempted task stops after its grace period and requeues (:mod:`gpu_pool.sim.sharing`).
fifo
    A plain Airflow pool: one counter of GPU slots (the fleet's GPUs; a task takes
    ``ceil(GPUs asked)``, CPU-only tasks none), first come first served; the head starts when
    the counter has its slots and a node fits it first-fit, otherwise everyone waits.
bestfit
    Pending tasks in arrival order, each started wherever the bestfit baseline puts it.

Reported over the busy window (5th-percentile arrival to the last): GPU allocation (time-weighted mean, peak hours 08-20 and off-peak,
hour of day = trace seconds // 3600 mod 24), queueing delay per priority class (median, p95,
max), tasks never started, fragmentation (FGD measure as % of free GPU milli, time-weighted),
solve time per cycle (median, p95, max).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_pool.engine import FleetState, plan_on_state
from gpu_pool.engine.fragmentation import MILLI, FleetFragmentation
from gpu_pool.engine.types import NodeAssignment
from gpu_pool.errors import SpecError
from gpu_pool.model import Allocation, Policy, PriorityClass, Purpose
from gpu_pool.sim.baselines import BestFitPlacer, FirstFitPlacer
from gpu_pool.sim.engine_policy import SIM_EPOCH, SIM_TEAM, domain_node, domain_request
from gpu_pool.sim.fleet import SimFleet
from gpu_pool.sim.packing import engine_mix, typical_mix
from gpu_pool.sim.trace import Trace, TraceTask

if TYPE_CHECKING:
    from gpu_pool.sim.sharing import SharingRecord

QOS_PRIORITY = {
    "Guaranteed": PriorityClass.CRITICAL,
    "LS": PriorityClass.HIGH,
    "Burstable": PriorityClass.NORMAL,
    "BE": PriorityClass.LOW,
}
PEAK_HOURS = range(8, 20)
# Finished tasks whose run time / limit the engine's start estimates learn from (the
# store's default window is the same, gpu_pool.store).
RATIO_WINDOW = 500


@dataclass(frozen=True)
class ReplayConfig:
    heartbeat_s: float = 60.0
    sample: float = 1.0
    seed: int = 42
    max_cycle_tasks: int = 2000
    fleet_fraction: float = 1.0  # replay on this share of the nodes (stratified, seeded)
    # The engine's starvation guard (Policy.reserve_after, max_reservations); None: default.
    reserve_after_s: float | None = None
    max_reservations: int | None = None
    # The engine's policy (``--policy-file``); None: Policy(). The two above override it.
    policy: Policy | None = None
    # Teams mode (gpu_pool.sim.teams): 0 off, 4 the built-in four teams with quotas.
    teams: int = 0
    # Teams mode: a preempted task spends this long reloading its checkpoint on restart.
    restart_overhead_s: float = 60.0
    # Teams mode: while work waits, a cycle runs at least this often (None: only on events
    # and on the times at which time alone may change the plan, see gpu_pool.sim.sharing).
    wake_s: float | None = None
    # Teams mode: fixed (team, guaranteed GPUs) pairs instead of the demand-derived ones
    # (a team not listed has no quota, so gets nothing); for hand-built scenarios.
    guarantees: tuple[tuple[str, int], ...] = ()
    # Arrival times divided by this (durations kept): the offered load grows this much.
    compress: float = 1.0
    # Declared time limit = duration x a factor drawn log-uniform on [lo, hi] per task;
    # None: no task declares a time limit. Engine replays (with teams too); the baselines
    # ignore them.
    time_limit_factor: tuple[float, float] | None = (1.0, 4.0)


@dataclass(frozen=True)
class Job:
    index: int
    task: TraceTask
    arrival: int
    duration: int
    priority: PriorityClass
    team: str = SIM_TEAM
    purpose: Purpose = Purpose.TRAINING
    preemptible: bool = False
    time_limit: int | None = None  # declared seconds (see the module docstring)

    @property
    def gpus(self) -> float:
        """GPUs held while it runs (a share counts its fraction)."""
        return self.task.total_gpu_milli / MILLI


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    config: ReplayConfig
    jobs: tuple[Job, ...]
    start: tuple[float | None, ...]  # per job, virtual seconds; None: never started
    times: tuple[float, ...]  # cycle times processed
    allocated: tuple[float, ...]  # allocation ratio after each processed cycle
    frag_pct: tuple[float, ...]  # FGD fragmentation, % of free GPU milli, after each cycle
    cycle_seconds: tuple[float, ...]
    end_time: float
    sharing: SharingRecord | None = None  # teams mode only
    # Engine: per job, the first start estimate it was given (virtual seconds; None: none).
    estimates: tuple[float | None, ...] = ()


def jobs_of(trace: Trace, config: ReplayConfig) -> list[Job]:
    tasks = list(trace.tasks)
    if any(t.creation_time is None or t.deletion_time is None for t in tasks):
        raise SpecError("creation_time", None, "a task list with creation_time and "
                        "deletion_time (the multigpu* files have no timestamps)",
                        where=trace.tasks_path)
    if config.sample < 1:
        rng = np.random.default_rng(config.seed)
        keep = rng.random(len(tasks)) < config.sample
        tasks = [t for t, k in zip(tasks, keep, strict=True) if k]
    jobs = []
    for t in tasks:
        began = t.scheduled_time if t.scheduled_time is not None else t.creation_time
        duration = max(1, int(t.deletion_time) - int(began))  # type: ignore[arg-type]
        prio = QOS_PRIORITY.get(t.qos or "", PriorityClass.NORMAL)
        arrival = int(t.creation_time) if config.compress == 1 else int(
            t.creation_time / config.compress)  # type: ignore[operator]
        jobs.append((arrival, t, duration, prio))  # type: ignore[arg-type]
    jobs.sort(key=lambda j: (j[0], j[1].name))
    limits: list[int | None] = [None] * len(jobs)
    if config.time_limit_factor is not None:
        lo, hi = config.time_limit_factor
        if not 1 <= lo <= hi:
            raise SpecError("time_limit_factor", config.time_limit_factor,
                            "two factors 1 <= lo <= hi (a limit below the run would kill it)")
        draw = np.random.default_rng([config.seed, 0x71]).uniform(
            math.log(lo), math.log(hi), len(jobs))
        limits = [math.ceil(d * math.exp(f)) for (_, _, d, _), f in zip(jobs, draw, strict=True)]
    return [Job(i, t, a, d, p, time_limit=lim)
            for i, ((a, t, d, p), lim) in enumerate(zip(jobs, limits, strict=True))]


def window_of(arrivals: Sequence[int | float]) -> tuple[float, float]:
    """The busy window: from the 5th-percentile arrival to the last one (the openb trace
    has a long, nearly empty lead-in before most of its tasks arrive)."""
    ordered = sorted(arrivals)
    return float(ordered[int(0.05 * (len(ordered) - 1))]), float(ordered[-1])


def fleet_share(trace: Trace, fraction: float, seed: int) -> Trace:
    """``trace`` on ``ceil(fraction x n)`` nodes of each (model, GPU count) group."""
    if fraction >= 1:
        return trace
    groups: dict[tuple[str | None, int], list[int]] = {}
    for i, n in enumerate(trace.nodes):
        groups.setdefault((n.model, n.gpus), []).append(i)
    rng = np.random.default_rng(seed)
    keep: list[int] = []
    for members in groups.values():
        k = math.ceil(fraction * len(members))
        keep.extend(int(x) for x in rng.choice(members, size=k, replace=False))
    nodes = tuple(trace.nodes[i] for i in sorted(keep))
    return Trace(nodes, trace.tasks, trace.nodes_path, trace.tasks_path)


class _Runner:
    def __init__(self, trace: Trace, policy: str, config: ReplayConfig) -> None:
        self.policy = policy
        self.config = config
        self.fleet = SimFleet(trace.nodes)
        self.rng = np.random.default_rng(config.seed)
        self.mix = typical_mix(trace.tasks)
        self.frag = FleetFragmentation(self.fleet.free_milli, self.fleet.free_cpu,
                                       self.fleet.free_memory, self.fleet.models, self.mix)
        self.engine_mix = engine_mix(trace.tasks)
        guard: dict[str, Any] = {}
        if config.reserve_after_s is not None:
            guard["reserve_after"] = timedelta(seconds=config.reserve_after_s)
        if config.max_reservations is not None:
            guard["max_reservations"] = config.max_reservations
        self.engine_policy = dataclasses.replace(config.policy or Policy(), **guard)
        self.nodes = tuple(domain_node(n, self.engine_policy) for n in trace.nodes)
        self.state = FleetState.from_nodes(self.nodes) if policy == "engine" else None
        self.row_of = {n.name: i for i, n in enumerate(self.nodes)}
        # Engine: the running tasks with a declared time limit, as the engine sees them.
        self.active: dict[int, Allocation] = {}
        self.estimates: dict[int, float] = {}  # job -> first estimated start
        # Run time / declared limit of the last finished tasks (start estimates learn it).
        self.ratios: deque[float] = deque(maxlen=RATIO_WINDOW)
        self.slots_free = int(self.fleet.gpus.sum())
        self.bestfit = BestFitPlacer(self.fleet, self.rng)
        self.firstfit = FirstFitPlacer(self.fleet, self.rng)

    @staticmethod
    def slots(task: TraceTask) -> int:
        return math.ceil(task.total_gpu_milli / MILLI) if task.num_gpu else 0

    def start(self, job: Job, node: int, cols: tuple[int, ...], now: float = 0.0) -> None:
        self.hold(job.task, node, cols)
        self.slots_free -= self.slots(job.task)
        if self.state is not None and job.time_limit is not None:
            t = job.task
            began = SIM_EPOCH + timedelta(seconds=now)
            self.active[job.index] = Allocation(
                f"j{job.index}", self.nodes[node].name, cols, t.gpu_milli if t.num_gpu else 0,
                t.cpu_milli, t.memory_mib, job.team, job.purpose, job.priority, None, began,
                ends_by=began + timedelta(seconds=job.time_limit), id=f"a{job.index}")

    def hold(self, task: TraceTask, node: int, cols: tuple[int, ...]) -> None:
        """Take ``task``'s capacity on the referee's fleet and the engine's state (a
        running task's, or what a placement waiting for its handover holds)."""
        self.fleet.take(task, node, cols)
        self.frag.refresh([node])
        if self.state is not None:
            self.state.apply([self._part(task, node, cols)])

    def unhold(self, task: TraceTask, node: int, cols: tuple[int, ...]) -> None:
        self.fleet.release(task, node, cols)
        self.frag.refresh([node])
        if self.state is not None:
            self.state.release([self._part(task, node, cols)])

    def _part(self, task: TraceTask, node: int, cols: tuple[int, ...]) -> NodeAssignment:
        return NodeAssignment(self.nodes[node].name, cols,
                              task.gpu_milli if task.num_gpu else 0, task.cpu_milli,
                              task.memory_mib)

    def finish(self, job: Job, node: int, cols: tuple[int, ...], ended: bool = True) -> None:
        """Release what ``job`` held; ``ended=False``: it was stopped (preempted), so its
        run/limit ratio is not one of a finished task."""
        self.unhold(job.task, node, cols)
        self.slots_free += self.slots(job.task)
        if self.state is not None:
            self.active.pop(job.index, None)
            if job.time_limit and ended:
                self.ratios.append(job.duration / job.time_limit)

    def cycle(self, pending: list[Job], now: float) -> list[tuple[Job, int, tuple[int, ...]]]:
        started: list[tuple[Job, int, tuple[int, ...]]] = []
        if self.policy == "fifo":
            for job in pending:
                need = self.slots(job.task)
                choice = self.firstfit.choose(job.task) if need <= self.slots_free else None
                if choice is None:
                    break
                self.start(job, *choice)
                started.append((job, *choice))
            return started
        if self.policy == "bestfit":
            for job in pending:
                choice = self.bestfit.choose(job.task)
                if choice is not None:
                    self.start(job, *choice)
                    started.append((job, *choice))
            return started
        head = sorted(pending, key=lambda j: (j.priority.rank, j.arrival, j.index))
        head = head[: self.config.max_cycle_tasks]
        when = SIM_EPOCH + timedelta(seconds=now)
        requests = [domain_request(j.task, f"j{j.index}", j.priority,
                                   SIM_EPOCH + timedelta(seconds=j.arrival),
                                   time_limit=j.time_limit) for j in head]
        assert self.state is not None
        plan = plan_on_state(self.state, requests, policy=self.engine_policy, now=when,
                             workload_mix=self.engine_mix,
                             allocations_usage=tuple(self.active.values()),
                             runtime_ratios=tuple(self.ratios))
        by_name = {f"j{j.index}": j for j in head}
        for name, at in plan.estimates.items():
            self.estimates.setdefault(by_name[name].index, (at - SIM_EPOCH).total_seconds())
        for p in plan.placements:
            (part,) = p.assignments
            job = by_name[p.request_name]
            choice = (self.row_of[part.node], tuple(part.gpu_indices))
            self.start(job, *choice, now=now)
            started.append((job, *choice))
        return started


def run_replay(trace: Trace, policy: str, config: ReplayConfig = ReplayConfig()) -> ReplayResult:
    jobs = jobs_of(trace, config)
    full = trace
    trace = fleet_share(trace, config.fleet_fraction, config.seed)
    runner = _Runner(trace, policy, config)
    if config.teams:
        if policy != "engine":
            raise SpecError("teams", config.teams, "teams only with --policy engine (the "
                            "baselines know no quotas)")
        from gpu_pool.sim.sharing import run_shared

        return run_shared(full, jobs, config, runner)
    hb = config.heartbeat_s
    start: list[float | None] = [None] * len(jobs)
    running: list[tuple[float, int, int, tuple[int, ...]]] = []  # (end, job, node, cols)
    pending: list[Job] = []
    times: list[float] = []
    allocated: list[float] = []
    frags: list[float] = []
    cycle_s: list[float] = []
    nxt = 0
    now = math.ceil(jobs[0].arrival / hb) * hb if jobs else 0.0
    while nxt < len(jobs) or running:
        running.sort()
        changed = False
        while running and running[0][0] <= now:
            _, j, node, cols = running.pop(0)
            runner.finish(jobs[j], node, cols)
            changed = True
        while nxt < len(jobs) and jobs[nxt].arrival <= now:
            pending.append(jobs[nxt])
            nxt += 1
            changed = True
        if changed and pending:
            t0 = time.perf_counter()
            started = runner.cycle(pending, now)
            cycle_s.append(time.perf_counter() - t0)
            done = {job.index for job, _, _ in started}
            pending = [j for j in pending if j.index not in done]
            for job, node, cols in started:
                start[job.index] = now
                running.append((now + job.duration, job.index, node, cols))
        if changed:
            times.append(now)
            fleet = runner.fleet
            allocated.append(fleet.allocated_milli / fleet.capacity_milli)
            free = fleet.capacity_milli - fleet.allocated_milli
            frags.append(100.0 * runner.frag.fleet_fragment() / free if free else 0.0)
        upcoming = [r[0] for r in running[:1]] + ([jobs[nxt].arrival] if nxt < len(jobs) else [])
        if not upcoming:
            break
        running.sort()
        nearest = min(r[0] for r in running) if running else math.inf
        if nxt < len(jobs):
            nearest = min(nearest, jobs[nxt].arrival)
        now = max(now + hb, math.ceil(nearest / hb) * hb)
    return ReplayResult(policy, config, tuple(jobs), tuple(start), tuple(times),
                        tuple(allocated), tuple(frags), tuple(cycle_s), float(now),
                        estimates=tuple(runner.estimates.get(j.index) for j in jobs)
                        if policy == "engine" else ())


def _weighted(times: Sequence[float], values: Sequence[float], begin: float, end: float,
              hours: range | None = None, inside: bool = True) -> float:
    """Time-weighted mean of a step function (``values[k]`` from ``times[k]``) on
    [begin, end], optionally only over the hours of the day in (or outside) ``hours``."""
    total = weight = 0.0
    for k, t0 in enumerate(times):
        t_next = min(end, times[k + 1] if k + 1 < len(times) else end)
        t = max(t0, begin)
        if t_next <= t:
            continue
        # Split the interval at hour boundaries only when a filter asks for it.
        if hours is None:
            total += values[k] * (t_next - t)
            weight += t_next - t
            continue
        s = t
        while s < t_next:
            e = min(t_next, (s // 3600 + 1) * 3600)
            if (int(s // 3600) % 24 in hours) == inside:
                total += values[k] * (e - s)
                weight += e - s
            s = e
    return total / weight if weight else float("nan")


def hourly_allocation(result: ReplayResult) -> list[float]:
    """Mean allocation % per hour of the day (0..23) over the arrival window."""
    begin, end = window_of([j.arrival for j in result.jobs]) if result.jobs else (0.0, 0.0)
    return [100 * _weighted(result.times, result.allocated, begin, end, range(h, h + 1))
            for h in range(24)]


def replay_summary(result: ReplayResult) -> dict[str, Any]:
    delays: dict[str, list[float]] = {p.value: [] for p in PriorityClass}
    never = 0
    for job, s in zip(result.jobs, result.start, strict=True):
        if s is None:
            never += 1
        else:
            delays[job.priority.value].append(s - job.arrival)
    queue = {}
    for name, values in delays.items():
        counted = sum(1 for j in result.jobs if j.priority.value == name)
        if not counted:
            continue
        arr = np.asarray(values) if values else np.zeros(1)
        queue[name] = {"tasks": counted, "started": len(values),
                       "median": float(np.median(arr)), "p95": float(np.percentile(arr, 95)),
                       "max": float(arr.max())}
    cyc = np.asarray(result.cycle_seconds) * 1e3 if result.cycle_seconds else np.zeros(1)
    begin, end = window_of([j.arrival for j in result.jobs]) if result.jobs else (0.0, 0.0)
    return {
        "policy": result.policy,
        "heartbeat_s": result.config.heartbeat_s,
        "sample": result.config.sample,
        "fleet_fraction": result.config.fleet_fraction,
        "tasks": len(result.jobs),
        "never_started": never,
        "cycles": len(result.cycle_seconds),
        "gpu_allocation_pct": {
            "mean": 100 * _weighted(result.times, result.allocated, begin, end),
            "peak": 100 * _weighted(result.times, result.allocated, begin, end, PEAK_HOURS),
            "off_peak": 100 * _weighted(result.times, result.allocated, begin, end,
                                        PEAK_HOURS, False),
        },
        "allocation_by_hour_pct": hourly_allocation(result),
        "fragmentation_pct": _weighted(result.times, result.frag_pct, begin, end),
        "window_s": [begin, end],
        "queueing_delay_s": queue,
        "cycle_ms": {"median": float(np.median(cyc)), "p95": float(np.percentile(cyc, 95)),
                     "max": float(cyc.max())},
        "qos_to_priority": {k: v.value for k, v in QOS_PRIORITY.items()},
        **({"sharing": _sharing(result)} if result.sharing is not None else {}),
        **({"start_estimate_error": estimate_errors(result)} if result.estimates else {}),
    }


def estimate_errors(result: ReplayResult) -> dict[str, dict[str, float | int]]:
    """How far the first start estimate of each task that waited landed from its actual
    start, per priority class: ``|estimate - start| / (start - arrival)`` (median and p90,
    in % of the wait), the median in seconds, and how many tasks waited (were still
    pending after the first cycle after their arrival) and how many of them got one (a
    task is given one when a cycle leaves it waiting for capacity, among the first
    ``Policy.start_estimates`` in line, with room made by known ends)."""
    out: dict[str, dict[str, float | int]] = {}
    for prio in PriorityClass:
        rel, abs_s, waited = [], [], 0
        hb = result.config.heartbeat_s
        for job, s, e in zip(result.jobs, result.start, result.estimates, strict=True):
            # Waited: still pending after its first cycle (cycles run on multiples of hb).
            if job.priority is not prio or s is None or s <= math.ceil(job.arrival / hb) * hb:
                continue
            waited += 1
            if e is None:
                continue
            rel.append(100 * abs(e - s) / (s - job.arrival))
            abs_s.append(abs(e - s))
        if not waited:
            continue
        out[prio.value] = {
            "waited": waited, "estimated": len(rel),
            "median_pct": float(np.median(rel)) if rel else float("nan"),
            "p90_pct": float(np.percentile(rel, 90)) if rel else float("nan"),
            "median_s": float(np.median(abs_s)) if abs_s else float("nan")}
    return out


def _sharing(result: ReplayResult) -> dict[str, Any]:
    from gpu_pool.sim.sharing import sharing_summary

    return sharing_summary(result)
