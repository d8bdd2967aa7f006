"""Teams mode of the engine replay: quotas, borrowing, reclaim, preemption with grace.

The replay of :mod:`gpu_pool.sim.replay` with ``ReplayConfig.teams``: every task belongs to
a team (:mod:`gpu_pool.sim.teams`), each team has one quota (its guarantee, and a borrow
limit), and each engine cycle sees what the live executor's store would give it.

Terms
-----
attempt
    One run of a task on one placement, from its start to its natural end or its stop.
holding
    The simulator's fleet (the referee) and the engine's ``FleetState`` both hold an
    attempt's capacity from its start to the cycle at or after its end.
engine view
    The engine gets the pending queue head (team, purpose, priority, preemptible, how
    often it was preempted, and its declared time limit, as in every engine replay), one
    quota per team, and the active allocations as the store would list them: every attempt
    not being preempted (``borrowed_from`` and ``off_peak`` copied from the placement that
    started it, ``preemptions`` its count so far, ``ends_by`` its start plus the time limit:
    each run may take the limit from its own start; a restart, which spends the reload
    overhead first, may run past it by up to that overhead, since the replay enforces no
    limit), plus the placements won by preemption that wait for their victims (as not
    preemptible, ``ends_by`` counted from the cycle that won them). An
    attempt being preempted is no longer active for the engine (the store marks it
    preempted at once), but its capacity stays held until its stop. No lending records
    are passed: every team lends to every team without limit (the default).

Preemption model
----------------
* A preemption decided at cycle time ``t`` with grace ``g`` (``Preemption.grace_s``)
  SIGTERMs the victim at ``t``; it keeps its GPUs until ``t + g`` (released at the cycle at
  or after it). Its SIGTERM handler checkpoints everything done up to ``t``; nothing done
  during the grace period counts.
* It re-enters the queue at its stop, keeping its arrival time, with the work it had left
  at ``t``; a restart first spends ``ReplayConfig.restart_overhead_s`` reloading the
  checkpoint. So each preemption loses ``GPUs x (g + restart overhead)`` GPU-seconds
  (less when the restart is itself preempted during the reload: then all it held).
* A victim whose natural end comes before ``t + g`` just finishes: the preemption is
  counted as moot and loses nothing.
* The placement that won the preemption starts at the cycle where its last victim's GPUs
  are free, on the node the engine chose. What it takes beyond what the cycle's victims
  free is held for it from that cycle (the store records the winner's allocation at once,
  so no later plan gives it away during the grace; :meth:`_Shared.hold`), and so is what
  a victim that leaves before the others frees for it (its own run ended within the
  grace; :meth:`_Shared.keep_for_winners`); if it still does not fit at the handover it
  goes back to the queue (counted as a missed handover).
* Preemptions of kind ``peak`` (off-peak work at the peak) have no winner: the victims
  stop and requeue.

Invariants (checked by tests/sim/test_sharing.py)
-------------------------------------------------
* Every GPU-second held is either progress or lost: for each task,
  ``held = GPUs x duration + lost`` once it finished.
* A finished task's progress adds up to its trace duration.
* The referee refuses any placement that does not fit, as in every replay.

Cycles: as in the replay, on every arrival or end (a preempted task's stop and requeue
included); in teams mode also, while work waits, at every time at which time alone may
change the plan (:meth:`_Shared.trigger`: a victim reaching its minimum runtime, a request
reaching ``reserve_after``, an off-peak window opening or closing), and at the peak while
off-peak work runs; and at the next heartbeat after a cycle that started or preempted
anything while work still waits, as the executor plans every heartbeat: what one cycle
placed may let the next do more (work it lent beyond a guarantee is work a team within its
own guarantee may reclaim; reclaim comes before borrowing within a cycle).
``ReplayConfig.wake_s`` adds a cycle at least that often while work waits (aging and fair
share change orders continuously, but never make room).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_pool.engine import plan_on_state
from gpu_pool.engine.preempt import eligible
from gpu_pool.engine.types import NodeAssignment, Placement, ReasonCode
from gpu_pool.model import (
    MILLI_PER_GPU,
    Allocation,
    OffPeak,
    Policy,
    Quota,
    Request,
)
from gpu_pool.sim.engine_policy import SIM_EPOCH, domain_request
from gpu_pool.sim.fleet import InfeasiblePlacement
from gpu_pool.sim.teams import (
    TEAMS,
    burst_hours,
    concurrent_demand,
    guarantees,
    owner_of,
    quota_window,
    team_quotas,
)
from gpu_pool.sim.trace import TraceTask

if TYPE_CHECKING:
    from gpu_pool.sim.replay import Job, ReplayConfig, _Runner
    from gpu_pool.sim.trace import Trace


# A queued task with one of these last reasons waited on the policy (its quota or the
# critical headroom), not on capacity, a reservation or its data.
POLICY_CODES = frozenset({ReasonCode.QUOTA_EXHAUSTED, ReasonCode.HEADROOM_RESERVED})

@dataclass(frozen=True)
class PreemptionEvent:
    time: float  # the cycle that decided it (SIGTERM)
    victim: int  # job index
    for_request: str
    kind: str
    grace_s: float
    moot: bool  # the victim ended within its grace period anyway
    lost_gpu_s: float
    message: str


@dataclass(frozen=True)
class SharingRecord:
    """What teams mode adds to a :class:`~gpu_pool.sim.replay.ReplayResult`."""

    teams: tuple[str, ...]
    guarantee: dict[str, int]
    demand_p95: dict[str, float]
    fleet_gpus: int
    policy_summary: dict[str, Any]
    off_peak_hours: OffPeak  # the policy's off-peak windows
    team_held: tuple[tuple[float, ...], ...]  # per processed time, GPUs held per team
    team_below: tuple[tuple[bool, ...], ...]  # ... below guarantee with work that fits in it
    # ... and meanwhile another team held more than its guarantee (borrowed: reclaimable).
    team_reclaimable: tuple[tuple[bool, ...], ...]
    # ... and meanwhile stopping other teams' work beyond their own guarantees would let one
    # of its queued tasks start on some node (_Shared.restorable).
    team_restorable: tuple[tuple[bool, ...], ...]
    queued_gpus: tuple[float, ...]  # per processed time, GPUs asked by the queue
    # per processed time: a queued task's last reason was its quota or headroom (the policy
    # held it back), not capacity, reservations or its data
    policy_held: tuple[bool, ...]
    off_peak: tuple[bool, ...]  # per processed time: inside Policy.off_peak
    preemptions: tuple[PreemptionEvent, ...]
    finished: tuple[float | None, ...]  # per job: end of its last attempt
    held_gpu_s: tuple[float, ...]  # per job, all attempts
    lost_gpu_s: tuple[float, ...]
    preempted: tuple[int, ...]  # per job: attempts stopped by preemption
    requeue_waits: tuple[float, ...]  # stop to restart, every stop that restarted
    handovers: int
    handovers_missed: int
    borrowed_starts: int
    off_peak_starts: int
    # Per job that waited: the engine's last reason before its first start (or, never
    # started, its last reason).
    wait_reasons: dict[int, str]


@dataclass
class _Attempt:
    job: Job
    number: int
    start: float
    length: float  # seconds it would hold if left alone: overhead + work left
    overhead: float
    node: int
    cols: tuple[int, ...]
    alloc: Allocation
    sigterm: float | None = None
    stop: float | None = None

    @property
    def end(self) -> float:
        natural = self.start + self.length
        return natural if self.stop is None else min(natural, self.stop)


@dataclass
class _Handover:
    job: Job
    placement: Placement
    victims: set[int]
    alloc: Allocation
    # What of the placement the cycle's victims do not free, held for it until the handover.
    holds: tuple[tuple[TraceTask, int, tuple[int, ...]], ...] = ()


def sharing_off(policy: Policy | None = None) -> Policy:
    """``policy`` (default: the defaults) with borrowing, reclaim and off-peak lending off:
    each team holds at most its guarantee, nothing is lent or reclaimed."""
    return replace(policy or Policy(), borrowing=False, reclaim_guarantees=False,
                   lend_idle_off_peak=False)


def assign_owners(trace: Trace, jobs: Sequence[Job], compress: float = 1.0) -> list[Job]:
    """``jobs`` with team, purpose, priority and preemptibility from the rules of
    :mod:`gpu_pool.sim.teams` (burst hours counted over the whole task list, on the
    replay's clock: arrival times divided by ``compress``)."""
    bursts = burst_hours([int(t.creation_time / compress) for t in trace.tasks
                          if t.creation_time is not None])
    out = []
    for j in jobs:
        o = owner_of(j.task.qos, j.duration, j.arrival, j.gpus, bursts)
        out.append(replace(j, team=o.team, purpose=o.purpose, priority=o.priority,
                           preemptible=o.preemptible))
    return out


def team_demand_p95(jobs: Sequence[Job], begin: float, end: float) -> dict[str, float]:
    out = {}
    for t in TEAMS:
        mine = [j for j in jobs if j.team == t.name]
        level = concurrent_demand(np.array([j.arrival for j in mine], dtype=float),
                                  np.array([j.duration for j in mine], dtype=float),
                                  np.array([j.gpus for j in mine], dtype=float), begin, end)
        out[t.name] = float(np.percentile(level, 95)) if len(level) else 0.0
    return out


class _Shared:
    """The state of one teams-mode run (see the module docstring)."""

    def __init__(self, runner: _Runner, jobs: list[Job], config: ReplayConfig,
                 quotas: tuple[Quota, ...], guarantee: dict[str, int]) -> None:
        self.runner = runner
        self.jobs = jobs
        self.config = config
        self.policy = runner.engine_policy
        self.quotas = quotas
        self.guarantee = guarantee
        n = len(jobs)
        self.left = [float(j.duration) for j in jobs]
        self.count = [0] * n  # preemptions that stopped it
        self.tries = [0] * n
        self.first_start: list[float | None] = [None] * n
        self.finished: list[float | None] = [None] * n
        self.held = [0.0] * n
        self.lost = [0.0] * n
        self.stopped_at: dict[int, float] = {}
        self.requeue_waits: list[float] = []
        self.attempts: dict[int, _Attempt] = {}
        self.handovers: dict[int, _Handover] = {}
        self.events: list[PreemptionEvent] = []
        self.wake_at: set[float] = set()
        self.missed = self.handovers_done = self.borrowed = self.lent_off_peak = 0
        self.request_cache: dict[tuple[int, int], Request] = {}
        self._switch: float | None = None
        self.reason: dict[int, str] = {}  # the engine's last sentence for a waiting task
        self.wait_reason: dict[int, str] = {}  # ... as it was when it first started

    # engine inputs ------------------------------------------------------------------
    def request(self, job: Job) -> Request:
        key = (job.index, self.count[job.index])
        r = self.request_cache.get(key)
        if r is None:
            base = domain_request(job.task, f"j{job.index}", job.priority,
                                  SIM_EPOCH + timedelta(seconds=job.arrival),
                                  time_limit=job.time_limit)
            r = replace(base, team=job.team, purpose=job.purpose, preemptible=job.preemptible,
                        preemptions=self.count[job.index])
            self.request_cache[key] = r
        return r

    def allocation(self, job: Job, part: NodeAssignment, placement: Placement, when: float,
                   number: int, preemptible: bool) -> Allocation:
        node = self.runner.nodes[self.runner.row_of[part.node]]
        return Allocation(
            f"j{job.index}", part.node, tuple(part.gpu_indices), part.gpu_milli, part.cpu_milli,
            part.memory_mib, job.team, job.purpose, job.priority, node.gpu_model,
            SIM_EPOCH + timedelta(seconds=when), preemptible=preemptible,
            id=f"j{job.index}#{number}", borrowed_from=placement.borrowed_from,
            off_peak=placement.off_peak, preemptions=self.count[job.index],
            # Each run (a restart too) may take the declared limit from its own start.
            ends_by=None if job.time_limit is None
            else SIM_EPOCH + timedelta(seconds=when + job.time_limit))

    # attempts -----------------------------------------------------------------------
    def begin(self, job: Job, placement: Placement, now: float) -> None:
        (part,) = placement.assignments  # trace tasks are never gangs
        choice = (self.runner.row_of[part.node], tuple(part.gpu_indices))
        self.runner.start(job, *choice)  # the referee refuses what does not fit
        j = job.index
        overhead = self.config.restart_overhead_s if self.tries[j] else 0.0
        self.tries[j] += 1
        if self.first_start[j] is None:
            self.first_start[j] = now
            if j in self.reason:
                self.wait_reason[j] = self.reason[j]
        self.reason.pop(j, None)
        if j in self.stopped_at:
            self.requeue_waits.append(now - self.stopped_at.pop(j))
        alloc = self.allocation(job, part, placement, now, self.tries[j], job.preemptible)
        self.attempts[j] = _Attempt(job, self.tries[j], now, overhead + self.left[j], overhead,
                                    *choice, alloc)
        self.borrowed += placement.borrowed_from is not None
        if placement.off_peak:
            self.lent_off_peak += 1
            peak = self.policy.off_peak.peak_starts(SIM_EPOCH + timedelta(seconds=now))
            if peak is not None:
                self.wake_at.add((peak - SIM_EPOCH).total_seconds())

    def release(self, j: int, pending: list[Job]) -> None:
        a = self.attempts.pop(j)
        job = a.job
        stopped = a.stop is not None and a.stop < a.start + a.length
        self.runner.finish(job, a.node, a.cols, ended=not stopped)
        held = a.end - a.start
        self.held[j] += job.gpus * held
        if stopped:
            assert a.sigterm is not None
            progress = min(max(0.0, a.sigterm - a.start - a.overhead), self.left[j])
            self.count[j] += 1
            self.stopped_at[j] = a.end
            pending.append(job)
        else:
            progress = self.left[j]
            self.finished[j] = a.end
        self.left[j] -= progress
        self.lost[j] += job.gpus * (held - progress)
        self.keep_for_winners(a)
        for h in self.handovers.values():
            h.victims.discard(j)

    def act(self, plan, head: list[Job], pending: list[Job], now: float) -> set[int]:
        """Apply a plan: preemptions first, then placements (now, or at their handover)."""
        by_alloc = {a.alloc.id: j for j, a in self.attempts.items()}
        by_name = {f"j{job.index}": job for job in head}
        winners: dict[str, set[int]] = {}
        for pre in plan.preemptions:
            j = by_alloc.get(pre.allocation_id)
            if j is None or self.attempts[j].stop is not None:
                continue
            a = self.attempts[j]
            a.sigterm, a.stop = now, now + pre.grace_s
            moot = a.start + a.length <= a.stop
            job = a.job
            lost = 0.0 if moot else job.gpus * (pre.grace_s + self.config.restart_overhead_s)
            self.events.append(PreemptionEvent(now, j, pre.for_request,
                                               pre.kind, pre.grace_s, moot, lost, pre.message))
            if pre.for_request in by_name:
                winners.setdefault(pre.for_request, set()).add(j)
        started: set[int] = set()
        won: list[tuple[Job, Placement, set[int]]] = []
        for p in plan.placements:
            job = by_name[p.request_name]
            started.add(job.index)
            if p.request_name in winners:
                won.append((job, p, winners[p.request_name]))
            else:
                self.begin(job, p, now)
        stopped = [j for w in winners.values() for j in w]
        holds = self.hold([(job, p.assignments[0]) for job, p, _ in won], stopped)
        for (job, p, victims), held in zip(won, holds, strict=True):
            alloc = self.allocation(job, p.assignments[0], p, now, self.tries[job.index] + 1,
                                    False)
            self.handovers[job.index] = _Handover(job, p, victims, alloc, held)
        return started

    def hold(self, won: Sequence[tuple[Job, NodeAssignment]], stopped: Sequence[int]
             ) -> list[tuple[tuple[TraceTask, int, tuple[int, ...]], ...]]:
        """Hold, per placement won by preemption, what of it the cycle's victims do not
        free, until its handover.

        The store records a winner's allocation the cycle it preempts, so no later plan may
        give those GPUs, cores or memory to anyone else while the victims' grace runs. The
        engine counted the victims' capacity as free and planned the cycle on it, so
        exactly what the winners take beyond it is held, per node: per card, the milli the
        winners there take beyond what the victims there free (a card a victim shares is
        held in part), and the cores and memory beyond the victims'. What is held goes to
        the winners in plan order (one hold per amount of milli; the first carries the
        cores and memory), each released at its own handover."""
        r = self.runner
        # What the victims free and no winner has taken yet: milli per (row, card), and
        # cores and memory per row.
        milli_left: dict[tuple[int, int], int] = {}
        cpu_left: dict[int, int] = {}
        memory_left: dict[int, int] = {}
        for v in stopped:
            a = self.attempts[v]
            t = a.job.task
            for c in a.cols:
                milli_left[(a.node, c)] = milli_left.get((a.node, c), 0) + t.gpu_milli
            cpu_left[a.node] = cpu_left.get(a.node, 0) + t.cpu_milli
            memory_left[a.node] = memory_left.get(a.node, 0) + t.memory_mib

        def beyond(left: dict, key: object, need: int) -> int:
            """What of ``need`` the victims' ``left[key]`` does not cover (spending it)."""
            have = left.get(key, 0)
            left[key] = max(0, have - need)
            return max(0, need - have)

        out = []
        for job, part in won:
            row = r.row_of[part.node]
            milli = {c: m for c in part.gpu_indices
                     if (m := beyond(milli_left, (row, c), part.gpu_milli)) > 0}
            out.append(self._take(job, row, milli, beyond(cpu_left, row, part.cpu_milli),
                                  beyond(memory_left, row, part.memory_mib)))
        return out

    def _take(self, job: Job, row: int, milli: dict[int, int], cpu: int, memory: int
              ) -> tuple[tuple[TraceTask, int, tuple[int, ...]], ...]:
        """Hold for ``job`` on ``row`` ``milli`` per card, ``cpu`` and ``memory`` (one hold
        per amount of milli, the first carrying the cores and memory); the holds."""
        by_milli: dict[int, list[int]] = {}
        for c, m in milli.items():
            by_milli.setdefault(m, []).append(c)
        groups = list(by_milli.items()) or ([(0, [])] if cpu or memory else [])
        holds = []
        for k, (m, cols) in enumerate(groups):
            task = TraceTask(f"hold-j{job.index}", cpu if k == 0 else 0,
                             memory if k == 0 else 0, len(cols), m)
            held = (task, row, tuple(cols))
            self.runner.hold(*held)  # the referee refuses a plan that counted on more than is free
            holds.append(held)
        return tuple(holds)

    def keep_for_winners(self, victim: _Attempt) -> None:
        """A victim of placements still waiting for their handover has just left (at its
        stop, or before it when its own run ended within the grace): what it freed that
        those placements take, and their holds do not cover yet, is held for them until
        the handover. The store holds the winner's allocation from the cycle it preempts;
        without this a plan between the victim's end and the handover gave its GPU away
        and the handover missed (seed 49 at twice the load, max_reservations 3)."""
        t = victim.job.task
        freed_milli = {c: t.gpu_milli for c in victim.cols} if t.num_gpu else {}
        freed_cpu, freed_memory = t.cpu_milli, t.memory_mib
        for h in self.handovers.values():
            if victim.job.index not in h.victims:
                continue
            (part,) = h.placement.assignments
            if self.runner.row_of[part.node] != victim.node:
                continue
            held_milli: dict[int, int] = {}
            held_cpu = held_memory = 0
            for task, _, cols in h.holds:
                for c in cols:
                    held_milli[c] = held_milli.get(c, 0) + task.gpu_milli
                held_cpu += task.cpu_milli
                held_memory += task.memory_mib
            milli = {}
            for c in part.gpu_indices:
                m = min(freed_milli.get(c, 0), part.gpu_milli - held_milli.get(c, 0))
                if m > 0:
                    milli[c] = m
                    freed_milli[c] -= m
            cpu = max(0, min(freed_cpu, part.cpu_milli - held_cpu))
            memory = max(0, min(freed_memory, part.memory_mib - held_memory))
            freed_cpu -= cpu
            freed_memory -= memory
            if milli or cpu or memory:
                h.holds = (*h.holds, *self._take(h.job, victim.node, milli, cpu, memory))

    def hand_over(self, now: float, pending: list[Job]) -> bool:
        ready = [j for j, h in self.handovers.items() if not h.victims]
        for j in ready:
            h = self.handovers.pop(j)
            for held in h.holds:
                self.runner.unhold(*held)
            try:
                self.begin(h.job, h.placement, now)
                self.handovers_done += 1
            except (InfeasiblePlacement, ValueError):
                self.missed += 1
                pending.append(h.job)
        return bool(ready)

    def trigger(self, now: float, pending: Sequence[Job]) -> float:
        """The next time at which time alone may change the plan while work waits: a
        running preemptible attempt preempted before reaching
        ``min_runtime_before_preemption`` (the first preemption needs none), a pending
        request reaching ``reserve_after``, an off-peak window opening or closing."""
        t = self.switch(now)
        least = self.policy.min_runtime_before_preemption.total_seconds()
        for a in self.attempts.values():
            x = a.start + least
            if a.stop is None and a.job.preemptible and self.count[a.job.index] and x > now:
                t = min(t, x)
        if self.policy.reserves:
            wait = self.policy.reserve_after.total_seconds()
            for job in pending:
                x = job.arrival + wait
                if x > now:
                    t = min(t, x)
        return t

    def switch(self, now: float) -> float:
        """The next time the off-peak state changes (on a 15-minute grid, the finest any
        time zone's offset needs; within 8 days, else never)."""
        if self._switch is not None and self._switch > now:
            return self._switch
        at = self.policy.off_peak.contains
        state = at(SIM_EPOCH + timedelta(seconds=now))
        probe = (now // 900 + 1) * 900
        self._switch = math.inf
        while probe <= now + 8 * 86400:
            if at(SIM_EPOCH + timedelta(seconds=probe)) != state:
                self._switch = probe
                break
            probe += 900
        return self._switch

    def engine_allocations(self) -> list[Allocation]:
        active = [a.alloc for a in self.attempts.values() if a.stop is None]
        return active + [h.alloc for h in self.handovers.values()]

    # records ------------------------------------------------------------------------
    def team_state(self, pending: Sequence[Job]) -> tuple[tuple[float, ...], tuple[bool, ...]]:
        """Per team: GPUs held, and whether it is below its guarantee with a queued task
        that fits within it."""
        held = {t.name: 0.0 for t in TEAMS}
        for a in self.attempts.values():
            held[a.job.team] += a.job.gpus
        smallest: dict[str, float] = {}
        for job in pending:
            if job.gpus > 0:
                smallest[job.team] = min(smallest.get(job.team, math.inf), job.gpus)
        below = tuple(
            t.name in smallest
            and held[t.name] + smallest[t.name] <= self.guarantee.get(t.name, 0) + 1e-9
            for t in TEAMS)
        return tuple(held[t.name] for t in TEAMS), below

    def restorable(self, pending: Sequence[Job], held: Sequence[float],
                   below: Sequence[bool], now: float,
                   reserved: frozenset[int] = frozenset()) -> tuple[bool, ...]:
        """Per team below its guarantee: whether reclaim is restoring it (a placement won
        by preemption waits for its victims' grace) or could: one of its queued GPU tasks
        that fit within the guarantee (counting what it holds and what it is about to get)
        fits, on some node whose model it accepts (GPUs, CPU, RAM), once some of the other
        teams' work running there is stopped -- work reclaim may take (preemptible, not
        critical, under the preemption cap, past its minimum runtime if preempted before,
        not already stopping), no team's taken work beyond what it holds over its guarantee
        (its running work not already stopping, plus what it is about to get). Every set of
        such victims on the node is tried (nodes hold a few tasks; beyond 12 candidates,
        the 12 smallest). A node where the task fits already does not count (see
        :meth:`_restores`), nor a node ``reserved`` for a starving request (reclaim, like
        every other step, leaves those closed)."""
        out = [False] * len(TEAMS)
        if not any(below):
            return tuple(out)
        when = SIM_EPOCH + timedelta(seconds=now)
        coming = {t.name: 0.0 for t in TEAMS}
        for h in self.handovers.values():
            coming[h.job.team] += h.job.gpus
        active = dict(coming)
        for a in self.attempts.values():
            if a.stop is None:
                active[a.job.team] += a.job.gpus
        room = {t.name: active[t.name] - self.guarantee.get(t.name, 0) for t in TEAMS}
        on_node: dict[int, list[_Attempt]] = {}
        for a in self.attempts.values():
            # The engine's own rule for a victim (its allocation carries the preemptible
            # flag, class, start and the preemptions so far).
            if (a.stop is None and a.job.gpus > 0 and a.node not in reserved
                    and room[a.job.team] >= a.job.gpus - 1e-9
                    and eligible(a.alloc, self.policy, when)):
                on_node.setdefault(a.node, []).append(a)
        fleet = self.runner.fleet
        for i, team in enumerate(TEAMS):
            if not below[i]:
                continue
            if coming[team.name]:
                out[i] = True
                continue
            limit = self.guarantee.get(team.name, 0) - held[i] + 1e-9
            shapes = {(j.task.num_gpu, j.task.gpu_milli, j.task.cpu_milli, j.task.memory_mib,
                       j.task.gpu_spec) for j in pending
                      if j.team == team.name and 0 < j.gpus <= limit}
            out[i] = any(self._restores(fleet, shape, node, victims, room, team.name)
                         for shape in shapes for node, victims in on_node.items())
        return tuple(out)

    @staticmethod
    def _restores(fleet, shape: tuple, node: int, victims: list[_Attempt],
                  room: dict[str, float], team: str) -> bool:
        """Whether a task of ``shape`` that does not fit on ``node`` now fits there once some
        set of ``victims`` (other teams', each team's within its ``room``) is stopped. A
        task that already fits waits for something reclaim does not decide (a reservation
        of the node, the order of the queue): not counted here."""
        gpus, milli, cpu, mem, spec = shape
        if not fleet.model_mask(spec)[node]:
            return False
        mine = sorted((a for a in victims if a.job.team != team),
                      key=lambda a: (a.job.gpus, a.job.index))[:12]
        base_gpu = fleet.free_milli[node, : fleet.gpus[node]].tolist()
        base_cpu, base_mem = int(fleet.free_cpu[node]), int(fleet.free_memory[node])

        def fits(free: list[int], c: int, m: int) -> bool:
            if c < cpu or m < mem:
                return False
            if milli < MILLI_PER_GPU:
                return bool(free) and max(free) >= milli
            return free.count(MILLI_PER_GPU) >= gpus

        if fits(base_gpu, base_cpu, base_mem):
            return False
        for mask in range(1, 1 << len(mine)):
            chosen = [a for k, a in enumerate(mine) if mask >> k & 1]
            taken: dict[str, float] = {}
            for a in chosen:
                taken[a.job.team] = taken.get(a.job.team, 0.0) + a.job.gpus
            if any(g > room[t] + 1e-9 for t, g in taken.items()):
                continue
            free = list(base_gpu)
            c, m = base_cpu, base_mem
            for a in chosen:
                for col in a.cols:
                    free[col] += a.job.task.gpu_milli
                c += a.job.task.cpu_milli
                m += a.job.task.memory_mib
            if fits(free, c, m):
                return True
        return False

    def over(self, held: Sequence[float]) -> tuple[bool, ...]:
        """Per team: whether it holds more than its guarantee (it borrows)."""
        return tuple(h > self.guarantee.get(t.name, 0) + 1e-9
                     for t, h in zip(TEAMS, held, strict=True))


def run_shared(trace: Trace, jobs: list[Job], config: ReplayConfig, runner: _Runner):
    """The teams-mode replay loop (the engine policy only); returns a ReplayResult."""
    from gpu_pool.sim.replay import ReplayResult, window_of

    jobs = assign_owners(trace, jobs, config.compress)
    fleet_gpus = int(runner.fleet.gpus.sum())
    begin, end = window_of([j.arrival for j in jobs]) if jobs else (0.0, 0.0)
    demand = team_demand_p95(jobs, begin, end)
    guarantee = dict(config.guarantees) or guarantees(demand, fleet_gpus)
    first = jobs[0].arrival if jobs else 0
    last = jobs[-1].arrival if jobs else 0
    quotas = team_quotas(guarantee, fleet_gpus, *quota_window(first, last, SIM_EPOCH))
    sh = _Shared(runner, jobs, config, quotas, guarantee)
    policy = runner.engine_policy
    hb = config.heartbeat_s
    wake = config.wake_s
    trigger = math.inf
    pending: list[Job] = []
    times: list[float] = []
    allocated: list[float] = []
    frags: list[float] = []
    cycle_s: list[float] = []
    team_held: list[tuple[float, ...]] = []
    team_below: list[tuple[bool, ...]] = []
    team_reclaimable: list[tuple[bool, ...]] = []
    team_restorable: list[tuple[bool, ...]] = []
    policy_held: list[bool] = []
    codes: dict[int, ReasonCode] = {}
    queued: list[float] = []
    off_peak: list[bool] = []
    reserved: frozenset[int] = frozenset()  # rows the last cycle closed for starving requests
    nxt = 0
    last_cycle = -math.inf
    now = math.ceil(jobs[0].arrival / hb) * hb if jobs else 0.0
    while nxt < len(jobs) or sh.attempts or sh.handovers:
        changed = False
        for j in sorted((j for j, a in sh.attempts.items() if a.end <= now),
                        key=lambda j: (sh.attempts[j].end, j)):
            sh.release(j, pending)
            changed = True
        changed |= sh.hand_over(now, pending)
        while nxt < len(jobs) and jobs[nxt].arrival <= now:
            pending.append(jobs[nxt])
            nxt += 1
            changed = True
        due = any(w <= now for w in sh.wake_at)
        sh.wake_at = {w for w in sh.wake_at if w > now}
        timed = now >= trigger or (wake is not None and now - last_cycle >= wake)
        if (pending and (changed or timed)) or due:
            t0 = time.perf_counter()
            head = sorted(pending, key=lambda j: (j.priority.rank, j.arrival, j.index))
            head = head[: config.max_cycle_tasks]
            when = SIM_EPOCH + timedelta(seconds=now)
            plan = plan_on_state(runner.state, [sh.request(j) for j in head],
                                 quotas=quotas, allocations_usage=sh.engine_allocations(),
                                 policy=policy, now=when, workload_mix=runner.engine_mix,
                                 runtime_ratios=tuple(runner.ratios))
            for why in plan.pending:
                sh.reason[int(why.request_name[1:])] = why.message
                codes[int(why.request_name[1:])] = why.code
            done = sh.act(plan, head, pending, now)
            reserved = frozenset(runner.row_of[n] for x in plan.reservations for n in x.nodes)
            pending = [j for j in pending if j.index not in done]
            if pending and (done or plan.preemptions):
                # What a cycle places changes what the next one may do (work lent beyond a
                # guarantee becomes work a team within its own may reclaim): as the executor,
                # plan again at the next heartbeat.
                sh.wake_at.add(now + hb)
            # A preemption without grace frees its GPUs at once: hand them over now.
            for j in [j for j, a in sh.attempts.items() if a.end <= now]:
                sh.release(j, pending)
            sh.hand_over(now, pending)
            cycle_s.append(time.perf_counter() - t0)
            last_cycle = now
            changed = True
        if changed:
            times.append(now)
            fleet = runner.fleet
            allocated.append(fleet.allocated_milli / fleet.capacity_milli)
            free = fleet.capacity_milli - fleet.allocated_milli
            frags.append(100.0 * runner.frag.fleet_fragment() / free if free else 0.0)
            held, below = sh.team_state(pending)
            team_held.append(held)
            team_below.append(below)
            over = sh.over(held)
            team_reclaimable.append(tuple(
                b and any(o for k, o in enumerate(over) if k != i) for i, b in enumerate(below)))
            team_restorable.append(sh.restorable(pending, held, below, now, reserved))
            queued.append(sum(j.gpus for j in pending))
            policy_held.append(any(codes.get(j.index) in POLICY_CODES for j in pending))
            off_peak.append(policy.off_peak.contains(SIM_EPOCH + timedelta(seconds=now)))
        nearest = min((a.end for a in sh.attempts.values()), default=math.inf)
        if nxt < len(jobs):
            nearest = min(nearest, jobs[nxt].arrival)
        if sh.wake_at:
            nearest = min(nearest, min(sh.wake_at))
        trigger = math.inf
        if pending and (sh.attempts or sh.handovers or nxt < len(jobs)):
            trigger = sh.trigger(now, pending)
            if wake is not None:
                trigger = min(trigger, last_cycle + wake)
            nearest = min(nearest, trigger)
        if nearest == math.inf:
            break
        now = max(now + hb, math.ceil(nearest / hb) * hb)
    record = SharingRecord(
        tuple(t.name for t in TEAMS), guarantee, demand, fleet_gpus,
        {"borrowing": policy.borrowing, "reclaim_guarantees": policy.reclaim_guarantees,
         "lend_idle_off_peak": policy.lend_idle_off_peak,
         "preemption_grace_s": policy.preemption_grace.total_seconds(),
         "min_runtime_before_preemption_s":
             policy.min_runtime_before_preemption.total_seconds(),
         "max_preemptions_per_task": policy.max_preemptions_per_task},
        policy.off_peak,
        tuple(team_held), tuple(team_below), tuple(team_reclaimable), tuple(team_restorable),
        tuple(queued), tuple(policy_held),
        tuple(off_peak),
        tuple(sh.events), tuple(sh.finished), tuple(sh.held), tuple(sh.lost), tuple(sh.count),
        tuple(sh.requeue_waits), sh.handovers_done, sh.missed, sh.borrowed, sh.lent_off_peak,
        {**sh.wait_reason, **sh.reason})
    return ReplayResult("engine", config, tuple(jobs), tuple(sh.first_start), tuple(times),
                        tuple(allocated), tuple(frags), tuple(cycle_s), float(now), record)


def _stretches(times: Sequence[float], flags: Sequence[bool], end: float) -> float:
    """Longest stretch of a step function (``flags[k]`` from ``times[k]``) that is True."""
    longest = 0.0
    since: float | None = None
    for t, f in zip(times, flags, strict=True):
        if f and since is None:
            since = t
        elif not f and since is not None:
            longest = max(longest, t - since)
            since = None
    if since is not None:
        longest = max(longest, end - since)
    return longest


def _off_peak_allocation(result, flags: Sequence[bool], begin: float, end: float
                         ) -> float | None:
    """Mean GPU allocation (%) over the off-peak time in which ``flags`` (per processed
    time) held; None when it never did."""
    rec: SharingRecord = result.sharing
    times = result.times
    total = weight = 0.0
    for k, t0 in enumerate(times):
        t1 = min(end, times[k + 1] if k + 1 < len(times) else end)
        t = max(t0, begin)
        if t1 <= t or not flags[k]:
            continue
        s = t
        while s < t1:
            e = min(t1, (s // 3600 + 1) * 3600)
            if rec.off_peak_hours.contains(SIM_EPOCH + timedelta(seconds=s)):
                total += result.allocated[k] * (e - s)
                weight += e - s
            s = e
    return 100 * total / weight if weight else None


def sharing_summary(result) -> dict[str, Any]:
    """The teams-mode figures (added to :func:`~gpu_pool.sim.replay.replay_summary`)."""
    from gpu_pool.sim.replay import window_of

    rec: SharingRecord = result.sharing
    jobs = result.jobs
    begin, end = window_of([j.arrival for j in jobs]) if jobs else (0.0, 0.0)
    times = result.times
    queued_pct = _off_peak_allocation(result, [q > 0 for q in rec.queued_gpus], begin, end)
    held_pct = _off_peak_allocation(result, rec.policy_held, begin, end)
    useful = sum(j.gpus * j.duration for j, f in zip(jobs, rec.finished, strict=True)
                 if f is not None)
    held = sum(rec.held_gpu_s)
    lost = sum(rec.lost_gpu_s)
    stops = [e for e in rec.preemptions if not e.moot]
    span_h = max(1e-9, (end - begin) / 3600)
    in_window = [e for e in stops if begin <= e.time <= end]
    kinds: dict[str, int] = {}
    for e in stops:
        kinds[e.kind] = kinds.get(e.kind, 0) + 1
    team_of = {f"j{j.index}": j.team for j in jobs}
    own = sum(1 for e in stops if team_of.get(e.for_request) == jobs[e.victim].team)
    below = {name: _stretches(times, [b[i] for b in rec.team_below], result.end_time)
             for i, name in enumerate(rec.teams)}
    reclaimable = {name: _stretches(times, [b[i] for b in rec.team_reclaimable],
                                    result.end_time) for i, name in enumerate(rec.teams)}
    restorable = {name: _stretches(times, [b[i] for b in rec.team_restorable],
                                   result.end_time) for i, name in enumerate(rec.teams)}
    series_end = result.end_time
    mean_held = {}
    for i, name in enumerate(rec.teams):
        acc = w = 0.0
        for k, t0 in enumerate(times):
            t1 = min(end, times[k + 1] if k + 1 < len(times) else series_end)
            t = max(t0, begin)
            if t1 > t:
                acc += rec.team_held[k][i] * (t1 - t)
                w += t1 - t
        mean_held[name] = acc / w if w else 0.0
    return {
        "teams": {name: {"guarantee_gpus": rec.guarantee.get(name, 0),
                         "demand_p95_gpus": round(rec.demand_p95[name], 2),
                         "tasks": sum(1 for j in jobs if j.team == name),
                         "mean_held_gpus": mean_held[name],
                         "longest_below_guarantee_with_work_s": below[name],
                         "longest_below_guarantee_while_others_borrow_s": reclaimable[name],
                         "longest_below_guarantee_restorable_s": restorable[name]}
                  for name in rec.teams},
        "fleet_gpus": rec.fleet_gpus,
        "policy": rec.policy_summary,
        "off_peak_allocation_when_queued_pct": queued_pct,
        "off_peak_allocation_when_policy_held_pct": held_pct,
        "preemptions": len(stops),
        "preemptions_moot": len(rec.preemptions) - len(stops),
        "preemptions_by_kind": kinds,
        # Stops for a task of the victim's own team: GPUs change hands inside one team.
        "preemptions_within_a_team": own,
        "preemptions_per_hour": len(in_window) / span_h,
        "max_preemptions_of_a_task": max(rec.preempted, default=0),
        "gpu_hours_held": held / 3600,
        "gpu_hours_lost": lost / 3600,
        "lost_pct": 100 * lost / held if held else 0.0,
        "useful_gpu_hours": useful / 3600,
        "unfinished": sum(1 for f in rec.finished if f is None),
        "handovers": rec.handovers,
        "handovers_missed": rec.handovers_missed,
        "borrowed_starts": rec.borrowed_starts,
        "off_peak_starts": rec.off_peak_starts,
        "requeue_wait_max_s": max(rec.requeue_waits, default=0.0),
        "longest_waits": _longest_waits(result, 5),
    }


def _longest_waits(result, count: int) -> list[dict[str, Any]]:
    """The ``count`` longest first waits, with the engine's reason for each."""
    rec: SharingRecord = result.sharing
    waits = []
    for job, s in zip(result.jobs, result.start, strict=True):
        wait = (result.end_time if s is None else s) - job.arrival
        waits.append((wait, job))
    waits.sort(key=lambda x: (-x[0], x[1].index))
    return [{"task": job.task.name, "team": job.team, "priority": job.priority.value,
             "gpus": job.gpus, "cpu_milli": job.task.cpu_milli,
             "memory_mib": job.task.memory_mib, "wait_s": wait,
             "reason": rec.wait_reasons.get(job.index, "")}
            for wait, job in waits[:count] if wait > 0]


__all__ = ["PreemptionEvent", "SharingRecord", "run_shared", "sharing_off", "sharing_summary"]
