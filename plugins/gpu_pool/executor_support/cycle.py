"""One placement cycle of the executor, over the store and the engine — no Airflow here.

A cycle reads top to bottom:

1. **admit** — requests the executor holds but the store does not know yet are submitted
   (idempotent: the name is derived from the task instance try, and a name the store
   already has — after a restart, a deferral, or from another scheduler — is not resubmitted);
2. **snapshot** — ``store.load_snapshot(policy, now)`` in a short transaction;
3. **readiness** — a request with a dataset is submitted ready only if the injected
   ``data_ready`` oracle (Airflow asset events) says so; each cycle, waiting ones whose
   data arrived are flipped to ready (``store.set_data_ready``). Until then the engine
   leaves them pending with "data not ready" and holds no GPU for them;
4. **plan** — ``engine.plan(snapshot)`` outside any transaction, capped by the policy's
   solver time;
5. **apply** — ``store.apply_plan(plan, now, actor)`` in one guarded transaction; a plan
   that lost a race against another scheduler is dropped and recomputed next cycle. A
   preemption in it also asks, in that transaction, for the victim's remote jobs to be
   stopped with grace (the executor sends the kills); a preempted request's pending reason
   says who preempted it until it is placed again;
6. **bind** — the store's active allocations of the requests this executor holds are
   returned as :class:`Binding` objects: whoever placed them (this scheduler or another),
   the holder starts them. A held request that already *finished* is a task resumed after
   its remote job ended (the trigger gave its GPUs back then): it is bound to the
   allocations it had, marked not ``live``, so it can start and conclude.

Invariant: this module never starts or kills a process; it only changes the store.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpu_pool.engine.types import PendingReason, Plan, ReasonCode
from gpu_pool.model import (
    Allocation,
    AllocationState,
    Headroom,
    Outcome,
    Policy,
    PriorityClass,
    Request,
)
from gpu_pool.telemetry import fleet_gauges

_log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
DataReady = Callable[[Iterable[str]], set[str]]  # dataset URIs -> those with an event


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Binding:
    """The allocations a held request got: one per node (several for a gang)."""

    request_name: str
    allocations: tuple[Allocation, ...]
    live: bool = True  # False: the allocations ended with the job; the task only concludes

    @property
    def parts(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        return tuple((a.node, a.gpu_indices) for a in self.allocations)


@dataclass(frozen=True)
class CycleReport:
    """What one cycle did, for logs, metrics and the bench."""

    planned: bool
    placed: tuple[str, ...] = ()
    preempted: tuple[str, ...] = ()  # allocation ids the plan ended
    dropped: tuple[str, ...] = ()
    pending: tuple[PendingReason, ...] = ()
    bindings: tuple[Binding, ...] = ()
    finished: tuple[Binding, ...] = ()  # held requests whose job already ended
    seconds: float = 0.0
    detail: str = ""
    # The fleet's gauges as the cycle saw it (gpu_pool.telemetry.fleet_gauges); empty when
    # the cycle read no snapshot.
    gauges: Mapping[str, float] = field(default_factory=dict)

    @property
    def changed(self) -> bool:
        """Whether the cycle changed any allocation (or tried to and lost a race)."""
        return bool(self.placed or self.preempted or self.dropped)


@dataclass
class PlacementCycle:
    """The executor's store-facing half. ``store`` is a :class:`gpu_pool.store.Store`."""

    store: Any
    policy: Policy
    planner: Callable[[Any], Plan]
    actor: str
    clock: Clock = utcnow
    data_ready: DataReady | None = None
    # Plan at least this often even when nothing changed here (another scheduler's
    # releases, a node coming back, an asset event).
    idle_replan_s: float = 5.0
    # The store's policy version ``policy`` is (None until the first plan reads it).
    policy_version: int | None = None
    # gpu_pool.telemetry.Metrics: a release counts there, and an idle cycle reads the store
    # for the gauges only when it is enabled (None: no metrics).
    telemetry: Any = None
    _submitted: set[str] = field(default_factory=set)
    _dirty: bool = True
    _last_plan: float = 0.0
    _last_gauges: float = 0.0

    def admit(self, request: Request, link: Mapping[str, Any]) -> None:
        """Record ``request`` in the store once; ``link`` names its Airflow task instance."""
        if request.name in self._submitted:
            return
        if self.store.get_request(request.name) is None:
            self.store.submit_request(request, actor=self.actor, now=self.clock(),
                                      external=dict(link), policy=self.policy)
        self._submitted.add(request.name)
        self._dirty = True

    def forget(self, name: str) -> None:
        self._submitted.discard(name)

    def mark_dirty(self) -> None:
        self._dirty = True

    def run(self, held: Iterable[str]) -> CycleReport:
        """One cycle; returns the bindings of the ``held`` request names."""
        started = time.monotonic()
        held_names = set(held)
        report = CycleReport(planned=False)
        if held_names and (self._dirty or started - self._last_plan >= self.idle_replan_s):
            self._follow_policy()
            report = self._plan_and_apply()
        elif (self.telemetry is not None and self.telemetry.enabled
              and started - self._last_gauges >= self.idle_replan_s):
            # Nothing to plan here: the gauges still follow the store (other schedulers'
            # work, a drained queue) at the idle re-plan pace — only when metrics are sent.
            self._last_gauges = started
            report = CycleReport(planned=False, gauges=fleet_gauges(
                self.store.load_snapshot(self.policy, self.clock())))
        bindings = self.bindings(held_names)
        finished = self.finished(held_names - {b.request_name for b in bindings})
        return dataclasses.replace(
            report, bindings=bindings, finished=finished, seconds=time.monotonic() - started
        )

    def _follow_policy(self) -> None:
        """Plan with the store's latest policy version (one cheap read per plan)."""
        version = self.store.policy_version()
        if self.policy_version is not None and version != self.policy_version:
            self.policy = self.store.load_policy()
            _log.info("policy v%d in force", version)
        self.policy_version = version

    def _plan_and_apply(self) -> CycleReport:
        now = self.clock()
        self._dirty = False
        self._last_plan = time.monotonic()
        snapshot = self.store.load_snapshot(self.policy, now)
        self._last_gauges = self._last_plan
        gauges = fleet_gauges(snapshot)
        if not snapshot.requests:
            return CycleReport(planned=False, detail="no pending requests", gauges=gauges)
        snapshot = self._with_readiness(snapshot)
        snapshot, frozen = self._without_frozen(snapshot, now)
        plan = self._with_preemption_notes(self.planner(snapshot))
        if frozen:
            plan = dataclasses.replace(plan, pending=(*plan.pending, *frozen))
        result = self.store.apply_plan(plan, now, self.actor, policy=self.policy)
        placed = tuple(_names(getattr(result, "applied", None), plan))
        dropped = tuple(_names(getattr(result, "dropped", ()), None))
        preempted = tuple(getattr(result, "preempted", ()) or ())
        return CycleReport(
            planned=True, placed=placed, preempted=preempted, dropped=dropped,
            pending=plan.pending,
            detail=f"{plan.stats.status} in {plan.stats.wall_seconds:.3f}s", gauges=gauges,
        )

    def _without_frozen(self, snapshot: Any, now: datetime
                        ) -> tuple[Any, tuple[PendingReason, ...]]:
        """A critical-only freeze: the team's non-critical requests are held back, and the
        nodes labelled ``team=<team>`` keep every GPU for critical work (a headroom over
        each; a share may still join a GPU already partly used there)."""
        freezes_of = getattr(self.store, "critical_only_freezes", None)
        freezes = freezes_of(now) if callable(freezes_of) else {}
        if not freezes:
            return snapshot, ()
        held = [r for r in snapshot.requests
                if r.team in freezes and r.priority is not PriorityClass.CRITICAL]
        reasons = tuple(PendingReason(
            r.name, ReasonCode.FROZEN,
            f"team {r.team} is frozen until {freezes[r.team].ends_at:%Y-%m-%d %H:%M UTC} "
            f"(set by {freezes[r.team].set_by}: {freezes[r.team].reason}); only its critical "
            "work starts") for r in held)
        names = {r.name for r in held}
        kept = tuple(r for r in snapshot.requests if r.name not in names)
        guarded = tuple(Headroom(n.gpu_count, node=n.name) for n in snapshot.nodes
                        if n.labels.get("team") in freezes and n.gpu_count)
        policy = snapshot.policy
        if guarded:
            policy = dataclasses.replace(policy, headroom=(*policy.headroom, *guarded))
        return dataclasses.replace(snapshot, requests=kept, policy=policy), reasons

    def _with_preemption_notes(self, plan: Plan) -> Plan:
        """A preempted request's pending reason keeps saying who preempted it until it is
        placed again: the plan's reason, then the preemption's."""
        notes_of = getattr(self.store, "preemption_notes", None)
        notes = notes_of() if plan.pending and callable(notes_of) else {}
        if not notes:
            return plan
        pending = tuple(
            dataclasses.replace(p, message=f"{p.message}; it was {notes[p.request_name]}"[:500])
            if p.request_name in notes else p for p in plan.pending)
        return dataclasses.replace(plan, pending=pending)

    def _with_readiness(self, snapshot: Any) -> Any:
        """Flip requests whose dataset got its first asset event to ready, in the store too."""
        if self.data_ready is None:
            return snapshot
        waiting = {r.dataset.uri for r in snapshot.requests
                   if r.dataset is not None and not r.data_ready}
        if not waiting:
            return snapshot
        ready = self.data_ready(waiting)
        if not ready:
            return snapshot
        requests = []
        for r in snapshot.requests:
            if r.dataset is not None and not r.data_ready and r.dataset.uri in ready:
                self.store.set_data_ready(r.name, True, actor=self.actor)
                r = dataclasses.replace(r, data_ready=True)
            requests.append(r)
        return dataclasses.replace(snapshot, requests=tuple(requests))

    def is_ready(self, request: Request) -> bool:
        """Whether a new request's data is ready now (no dataset: always)."""
        if request.dataset is None or self.data_ready is None:
            return request.data_ready
        return request.dataset.uri in self.data_ready([request.dataset.uri])

    def bindings(self, held: set[str]) -> tuple[Binding, ...]:
        if not held:
            return ()
        by_request: dict[str, list[Allocation]] = {}
        for allocation in self.store.active_allocations():
            if allocation.request_name in held:
                by_request.setdefault(allocation.request_name, []).append(allocation)
        return tuple(
            Binding(name, tuple(sorted(allocs, key=lambda a: a.node)))
            for name, allocs in sorted(by_request.items())
        )

    def finished(self, names: set[str]) -> tuple[Binding, ...]:
        """Bindings (not live) of those of ``names`` that finished: their ended allocations."""
        if not names:
            return ()
        return tuple(
            Binding(name, tuple(sorted((a for a in self.store.allocations_of(name)
                                        if a.state is AllocationState.RELEASED),
                                       key=lambda a: a.node)), live=False)
            for name in sorted(self.store.finished_outcomes(names)))

    def release(self, name: str, outcome: Outcome, reason: str,
                metrics: Mapping[str, float] | None = None) -> None:
        """End the request's allocations (ledger rows, with the task's metrics, by the store)."""
        self.store.release_request(name, outcome, actor=self.actor, reason=reason,
                                   now=self.clock(), policy=self.policy, metrics=metrics)
        if self.telemetry is not None:
            self.telemetry.release(outcome)
        self._submitted.discard(name)
        self._dirty = True


def _names(items: Any, plan: Plan | None) -> Iterable[str]:
    if items is None:
        return [p.request_name for p in plan.placements] if plan else []
    return [getattr(i, "request_name", i) for i in items]
