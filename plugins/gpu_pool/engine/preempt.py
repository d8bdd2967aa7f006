"""Preemption: critical work that cannot fit, and teams taking back their guarantee.

Terms
-----
victim
    One running request's allocations, all of them (a gang is preempted on every node or
    on none). A victim is eligible only when every allocation of it is preemptible, not
    critical, has run at least ``Policy.min_runtime_before_preemption``, and its request was
    preempted fewer than ``Policy.max_preemptions_per_task`` times before
    (``Allocation.preemptions``).
work lost
    GPU-seconds the victim has run since it started (``gpus x (now - started_at)``).

Rules (step 6 of :func:`gpu_pool.engine.plan.plan_on_state`, on the plan's final cycle)
---------------------------------------------------------------------------------------
* ``critical`` (6a): each critical single-node request still pending, in greedy order,
  may preempt any eligible victims.
* ``reclaim`` (6b, with ``Policy.reclaim_guarantees``): each single-node request still
  pending whose team's group has the whole request left in its guarantee
  (``usage + request <= guarantee``) may preempt eligible victims of other teams that
  run on borrowed capacity (``Allocation.borrowed_from`` set) or whose team holds more
  than its guarantees (within that team's excess: a reclaim never takes a team below its
  own guarantee; what the team holds counts the work this cycle started for it before
  step 6, so a team that grows within its own quota while holding borrowed GPUs gives
  back in the same cycle, not the next). As Kueue's reclaim within a cohort, it is the
  team that borrows, not one placement: the GPUs a borrower holds beyond its guarantee
  may sit on any node, and taking its work where the reclaiming request fits restores
  the guarantee where taking only the placements marked borrowed could not (an 8-GPU
  request needs one node's 8).
  Order: borrowed from the reclaiming team first, then other borrowed work, then other
  work of teams over their guarantee (never its own team's: that would trade GPUs within
  the team).
* On each node the request could use (compatible, data move allowed, up), victims there
  are freed in order — (reclaim: borrowed from another team last), lowest priority first,
  then least work lost — until the request fits, then those it fits without are dropped
  (the most costly first); a victim whose team's excess the ones before it spent is
  passed over, and when that leaves the request short, every candidate is freed, the
  ones it does not need dropped, and the rest taken if within the excess (a share that
  frees no whole GPU must not spend the excess a whole-GPU victim needs); among nodes it
  takes the set that keeps
  the most urgent victim least urgent, then loses the least work, then has the fewest
  victims (ties: row order). A request whose data blocks it is not helped. A critical
  request whose team's quota is used up may preempt lower-priority preemptible work of
  the same quota group (its own team's): a victim within its group's guarantee gives its
  quota back as well as its GPUs (as Kueue's within-queue preemption of lower priority).
* critical borrowing (6d, kind ``critical``, with ``Policy.critical_preempts_borrowers``,
  ``borrowing`` and ``critical_borrows``): each critical single-node request still pending after borrowing
  (6c), whose group may still borrow it (``borrowed + request <= borrow limit``), may
  preempt the reclaim's victims (other teams' work marked borrowed or within their
  excess; same order) on a node where it then fits, and borrows what that frees from one
  consenting lender (:mod:`gpu_pool.engine.borrow`), judged after the victims go (what
  they borrowed back to its lender, what they held within their guarantee idle there);
  when no lender would cover it, nothing is preempted (Kueue's ``borrowWithinCohort``).
  Only once the request has waited as long as the victims' grace (the longest of
  theirs): a preemption starts it a grace later, so until then the next end may start it
  as soon, and after it waiting has cost what preempting would have (the ski-rental rule:
  it never waits more than twice what preempting at once would take, beyond a heartbeat).
* Gang requests do not preempt (all-or-nothing across nodes would need a search this rule
  does not make). Every preemption carries the victim's grace (its own, else
  ``Policy.preemption_grace``) and says why in a sentence.

Invariants: works on the plan's final cycle only (its private copy of free capacity); a
victim is preempted at most once per cycle; a non-preemptible or critical allocation is
never preempted; placements won here are within guarantee, so nothing placed by reclaim
is itself reclaimable in the same cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import numpy as np

from gpu_pool.engine import borrow
from gpu_pool.engine.greedy import Cycle, fit
from gpu_pool.engine.objective import RequestView
from gpu_pool.engine.quota import NO_QUOTA, UNLIMITED, QuotaBook
from gpu_pool.engine.types import NodeAssignment, Placement, Preemption
from gpu_pool.model import (
    MILLI_PER_GPU,
    Allocation,
    AllocationState,
    Policy,
    PriorityClass,
    Request,
)


def _part(a: Allocation) -> NodeAssignment:
    return NodeAssignment(a.node, a.gpu_indices, a.gpu_milli, a.cpu_milli, a.memory_mib)


def _free(cycle: Cycle, v: Victim) -> None:
    """Release ``v``'s GPUs on ``cycle`` and give back the quota they drew on."""
    cycle.release([_part(a) for a in v.allocations])
    for group, milli in v.quota:
        cycle.remaining[group] += milli


@dataclass(frozen=True)
class Victim:
    """All active allocations of one running request."""

    request_name: str
    allocations: tuple[Allocation, ...]
    rank: int  # priority rank: 0 critical .. 4 batch
    work_lost: float  # GPU-seconds run so far
    borrowed_from: str | None
    grace_s: float
    # (quota group, milli) its parts draw on within guarantees: given back when preempted.
    quota: tuple[tuple[int, int], ...] = ()

    @property
    def team(self) -> str:
        return self.allocations[0].team

    @property
    def milli(self) -> int:
        return sum(a.gpu_milli_total for a in self.allocations)


def excess(book: QuotaBook, allocations: Sequence[Allocation],
           started: Sequence[Request] = ()) -> dict[str, int]:
    """Milli each team with a live guarantee holds beyond it (see the module docstring):
    its active allocations and the requests this cycle ``started`` before preempting."""
    limit: dict[str, int] = defaultdict(int)
    for (team, _p, _m), milli in zip(book.keys, book.limit_milli, strict=True):
        limit[team] += int(milli)
    held: dict[str, int] = defaultdict(int)
    for a in allocations:
        if a.state is AllocationState.ACTIVE and a.team in limit:
            held[a.team] += a.gpu_milli_total
    for r in started:
        if r.team in limit:
            held[r.team] += r.total_gpu_milli
    return {t: max(0, held[t] - limit[t]) for t in limit}


def eligible(a: Allocation, policy: Policy, now: datetime) -> bool:
    """Whether ``a`` alone may be preempted now (see the module docstring)."""
    return (a.preemptible and a.priority is not PriorityClass.CRITICAL
            and a.state is AllocationState.ACTIVE
            and (a.preemptions == 0
                 or now - a.started_at >= policy.min_runtime_before_preemption)
            and a.preemptions < policy.max_preemptions_per_task)


def victims_of(allocations: Sequence[Allocation], policy: Policy, now: datetime
               ) -> list[Victim]:
    """Eligible victims, one per running request (gangs whole), by request name."""
    by_request: dict[str, list[Allocation]] = defaultdict(list)
    for a in allocations:
        by_request[a.request_name].append(a)
    out = []
    for name in sorted(by_request):
        parts = by_request[name]
        if not all(eligible(a, policy, now) for a in parts):
            continue
        first = parts[0]
        grace = first.grace if first.grace is not None else policy.preemption_grace
        work = sum(a.gpu_milli_total / MILLI_PER_GPU
                   * max((now - a.started_at).total_seconds(), 0.0) for a in parts)
        borrowed = next((a.borrowed_from for a in parts if a.borrowed_from is not None), None)
        out.append(Victim(name, tuple(parts), first.priority.rank, work, borrowed,
                          grace.total_seconds()))
    return out


class Preempter:
    """Victims on the final cycle, shared by the critical, reclaim and borrow steps."""

    def __init__(self, cycle: Cycle, allocations: Sequence[Allocation], policy: Policy,
                 now: datetime, book: QuotaBook | None = None,
                 started: Sequence[Request] = ()) -> None:
        """``started``: the requests whose placements ``cycle`` already holds: what a team
        starts this cycle counts in what it holds (:func:`excess`)."""
        self.cycle = cycle
        self.policy = policy
        self.now = now
        self.excess = excess(book, allocations, started) if book is not None else {}
        self.by_row: dict[int, list[Victim]] = defaultdict(list)
        row_of = cycle.state.layout.row_of
        for v in victims_of(allocations, policy, now):
            if book is not None and len(cycle.remaining):
                v = replace(v, quota=book.quota_parts(v.allocations))
            if all(a.node in row_of for a in v.allocations):
                for row in sorted({row_of[a.node] for a in v.allocations}):
                    self.by_row[row].append(v)
        self.taken: set[str] = set()
        # Critical requests that will preempt to borrow once they have waited their
        # victims' grace: when, and that grace (seconds); for their pending reasons.
        self.deferred: dict[str, tuple[datetime, float]] = {}
        self.nodes: set[str] = set()  # nodes where this cycle preempted
        # Requests of one type that found no victims: the same answer until a preemption
        # changes the cycle (a queue of thousands of one shape searches once).
        self._failed: set[tuple] = set()

    def _untried(self, pending: Sequence[Request], kind: str, eligible: Callable[[Request], bool],
                 views: dict[str, RequestView], groups: dict[str, np.ndarray]
                 ) -> Iterator[tuple[Request, tuple]]:
        """The ``eligible`` requests of ``pending`` whose type has not yet failed a ``kind``
        search, each with its type key (add it to ``_failed`` when the search fails); read
        lazily, so a preemption between two requests reopens every type."""
        for r in pending:
            if not eligible(r):
                continue
            key = (kind, r.team, id(views[r.name]), id(groups[r.name]), r.gpus, r.gpu_milli,
                   r.cpu_milli, r.memory_mib, r.priority)
            if key not in self._failed:
                yield r, key

    def _search(self, r: Request, weight: int, view: RequestView, g: np.ndarray,
                allowed: Callable[[Victim], bool], order: Callable[[Victim], tuple],
                first: Callable[[list[Victim]], tuple] = lambda freed: (),
                capped: Callable[[Victim], bool] = lambda v: False
                ) -> tuple[int, list[Victim]] | None:
        """The best node and victims there for ``r``; a ``capped`` victim counts against
        its team's :attr:`excess` (the victims taken of one team never exceed it)."""
        cycle = self.cycle
        best: tuple[tuple, list[Victim]] | None = None
        for row in sorted(self.by_row):
            if not (view.compatible[row] and view.zone_ok[row] and cycle.state.up[row]):
                continue
            pool = sorted((v for v in self.by_row[row]
                           if v.request_name not in self.taken and allowed(v)), key=order)
            if not pool:
                continue
            freed = self._freeing(r, weight, view, g, row, pool, capped)
            if freed is not None:
                freed = self._minimal(r, weight, view, g, row, freed, order)
            elif any(capped(v) for v in pool):
                # The caps may have been spent on victims the request does not need, passing
                # over one it does: free them all, keep those it needs, then check the caps.
                freed = self._freeing(r, weight, view, g, row, pool, lambda v: False)
                if freed is not None:
                    freed = self._minimal(r, weight, view, g, row, freed, order)
                    spent: dict[str, int] = defaultdict(int)
                    for v in freed:
                        if capped(v):
                            spent[v.team] += v.milli
                    if any(m > self.excess.get(t, 0) for t, m in spent.items()):
                        freed = None
            if freed is not None:
                cost = (*first(freed), -min(x.rank for x in freed),
                        sum(x.work_lost for x in freed), len(freed), row)
                if best is None or cost < best[0]:
                    best = (cost, freed)
        if best is None:
            return None
        return best[0][-1], best[1]

    def _freeing(self, r: Request, weight: int, view: RequestView, g: np.ndarray, row: int,
                 pool: list[Victim], capped: Callable[[Victim], bool]) -> list[Victim] | None:
        """The victims of ``pool`` on ``row``, freed in its order until ``r`` fits there (a
        ``capped`` victim skipped when its team's :attr:`excess` is spent); None: it never
        fits."""
        trial = self.cycle.clone()
        freed: list[Victim] = []
        spent: dict[str, int] = defaultdict(int)
        rows = np.array([row])
        for v in pool:
            if capped(v):
                if spent[v.team] + v.milli > self.excess.get(v.team, 0):
                    continue
                spent[v.team] += v.milli
            _free(trial, v)
            freed.append(v)
            if fit(trial, r, weight, view, g, rows) is not None:
                return freed
        return None

    def _minimal(self, r: Request, weight: int, view: RequestView, g: np.ndarray, row: int,
                 freed: list[Victim], order: Callable[[Victim], tuple]) -> list[Victim]:
        """``freed`` without the victims the request fits without, the most costly to
        preempt (last in ``order``) dropped first."""
        keep = list(freed)
        for v in sorted(freed, key=order, reverse=True):
            if len(keep) == 1:
                break
            rest = [x for x in keep if x is not v]
            trial = self.cycle.clone()
            for x in rest:
                _free(trial, x)
            if fit(trial, r, weight, view, g, np.array([row])) is not None:
                keep = rest
        return keep

    def _preempt(self, r: Request, freed: list[Victim], message: Callable[[Victim], str],
                 kind: str) -> list[Preemption]:
        """Preempt ``freed`` for ``r`` on the cycle: their capacity and quota given back,
        their teams' excess spent, one preemption per allocation."""
        self._failed.clear()
        out = []
        for v in freed:
            _free(self.cycle, v)
            self.taken.add(v.request_name)
            if v.team in self.excess:
                self.excess[v.team] = max(0, self.excess[v.team] - v.milli)
            for a in v.allocations:
                self.nodes.add(a.node)
                out.append(Preemption(a.id or f"{a.request_name}@{a.node}", a.request_name,
                                      r.name, message(v), grace_s=v.grace_s, kind=kind))
        return out

    def _take(self, r: Request, weight: int, view: RequestView, g: np.ndarray, row: int,
              freed: list[Victim], message: Callable[[Victim], str], kind: str
              ) -> tuple[Placement, list[Preemption]]:
        """Preempt ``freed`` and place ``r`` on ``row`` within its quota groups ``g``."""
        out = self._preempt(r, freed, message, kind)
        choice = fit(self.cycle, r, weight, view, g, np.array([row]))
        assert choice is not None  # found feasible on a trial copy of this very state
        return self.cycle.commit(r, choice), out

    def _beyond_guarantee(self, team: str) -> Callable[[Victim], bool]:
        """Whether a victim is work another team holds beyond its guarantee: marked
        borrowed, or within what its team holds over it. Never ``team``'s own: that would
        only trade GPUs within the team, losing the victim's work for no change in who
        holds what."""
        return lambda v: v.team != team and (
            v.borrowed_from is not None or self.excess.get(v.team, 0) >= v.milli)

    def critical(self, pending: Sequence[Request], weights: dict[str, int],
                 views: dict[str, RequestView], groups: dict[str, np.ndarray]
                 ) -> tuple[list[Placement], list[Preemption]]:
        """Critical single-node requests still pending preempt eligible victims."""
        placements: list[Placement] = []
        preemptions: list[Preemption] = []
        for r, key in self._untried(
                pending, "critical",
                lambda r: r.priority is PriorityClass.CRITICAL and not r.is_gang, views, groups):
            view, g = views[r.name], groups[r.name]
            found = self._search(r, weights[r.name], view, g, lambda v: True,
                                 lambda v: (-v.rank, v.work_lost, v.request_name))
            if found is None:
                self._failed.add(key)
                continue
            row, freed = found
            node = self.cycle.state.layout.names[row]
            placed, pre = self._take(
                r, weights[r.name], view, g, row, freed,
                lambda v, r=r, node=node: (
                    f"preempted for critical request {r.name}: it needs {node} and nothing "
                    f"else fits" + (f" within team {r.team}'s quota" if v.quota and v.team
                                    == r.team else "") + f", grace {v.grace_s:g} s"),
                "critical")
            placements.append(placed)
            preemptions.extend(pre)
        return placements, preemptions

    def reclaim(self, pending: Sequence[Request], weights: dict[str, int],
                views: dict[str, RequestView], groups: dict[str, np.ndarray]
                ) -> tuple[list[Placement], list[Preemption]]:
        """Requests within their team's guarantee take back borrowed GPUs."""
        placements: list[Placement] = []
        preemptions: list[Preemption] = []
        if not self.policy.reclaim_guarantees:
            return placements, preemptions
        remaining = self.cycle.remaining
        # Per quota-group array (shared by the requests of one team and purpose): the quota
        # groups it names, so a request beyond every one of its guarantees is passed over
        # without a pass over the fleet's rows.
        named: dict[int, np.ndarray] = {}
        if not len(remaining):
            return placements, preemptions
        for r, key in self._untried(pending, "reclaim", lambda r: not r.is_gang and r.gpus > 0,
                                    views, groups):
            g = groups[r.name]
            need = r.total_gpu_milli
            quotas = named.get(id(g))
            if quotas is None:
                quotas = named[id(g)] = np.unique(g[g >= 0])
            if not (remaining[quotas] >= need).any():
                continue
            live = g >= 0
            within = np.zeros(len(g), dtype=bool)  # some row is: a named quota has room
            within[live] = remaining[g[live]] >= need
            view = views[r.name]
            mine = np.where(within, g, -2)  # rows outside the guarantee are out of reach
            team = r.team
            found = self._search(
                r, weights[r.name], view, mine, self._beyond_guarantee(team),
                lambda v, team=team: (v.borrowed_from != team, v.borrowed_from is None,
                                      -v.rank, v.work_lost, v.request_name),
                lambda freed, team=team: (sum(v.borrowed_from != team for v in freed),
                                          sum(v.borrowed_from is None for v in freed)),
                lambda v: v.borrowed_from is None)
            if found is None:
                self._failed.add(key)
                continue
            row, freed = found
            placed, pre = self._take(
                r, weights[r.name], view, mine, row, freed,
                lambda v, team=team: (
                    f"preempted: team {team} reclaimed its guarantee"
                    + ("" if v.borrowed_from is not None else
                       f" (team {v.team} holds more than its own guarantee)")
                    + f", grace {v.grace_s:g} s"), "reclaim")
            gpus = sum(a.gpu_milli_total for v in freed for a in v.allocations)
            whose = ", ".join(sorted({f"team {v.team} ({v.request_name})" for v in freed}))
            lent = all(v.borrowed_from is not None for v in freed)
            note = (f"reclaimed its guarantee: took back {gpus / MILLI_PER_GPU:g} GPUs "
                    f"{'lent to' if lent else 'held beyond their guarantee by'} {whose}")
            placements.append(replace(placed, note=note))
            preemptions.extend(pre)
        return placements, preemptions

    def borrow_by_preemption(self, pending: Sequence[Request], weights: dict[str, int],
                             views: dict[str, RequestView], groups: dict[str, np.ndarray],
                             book: QuotaBook, lent: borrow.Lent
                             ) -> tuple[list[Placement], list[Preemption]]:
        """Critical requests beyond their team's guarantee that borrowing found no idle
        GPUs for preempt other teams' work held beyond their own guarantees, and borrow
        what it frees (``Policy.critical_preempts_borrowers``; see the module docstring)."""
        policy = self.policy
        placements: list[Placement] = []
        preemptions: list[Preemption] = []
        if not (policy.critical_preempts_borrowers and policy.borrowing
                and policy.critical_borrows) or book.open_fleet or not len(book.keys):
            return placements, preemptions
        models = np.array(self.cycle.state.layout.models, dtype=object)
        for r, key in self._untried(
                pending, "borrow",
                lambda r: r.priority is PriorityClass.CRITICAL and not r.is_gang and r.gpus > 0,
                views, groups):
            g = groups[r.name]
            need = r.total_gpu_milli
            room = lent.room(book, g, need)
            if not room.any():
                continue
            # Borrowing, not a guarantee, is what limits it here: every row its group may
            # borrow on is open to the search (quota-free), the others closed.
            open_g = np.where(room, UNLIMITED, NO_QUOTA).astype(np.int64)
            view, weight, team = views[r.name], weights[r.name], r.team
            found = self._search(
                r, weight, view, open_g, self._beyond_guarantee(team),
                lambda v: (v.borrowed_from is None, -v.rank, v.work_lost, v.request_name),
                lambda freed: (sum(v.borrowed_from is None for v in freed),),
                lambda v: v.borrowed_from is None)
            chosen = None if found is None else self._lender(r, *found, book, lent, room,
                                                             models)
            if found is None or chosen is None:
                self._failed.add(key)
                continue
            row, freed = found
            grace = max(v.grace_s for v in freed)
            if self._waited(r) < grace:
                # Not yet: an end may free room before the victims' grace would.
                assert r.submitted_at is not None  # else it has waited any grace
                self.deferred[r.name] = (r.submitted_at + timedelta(seconds=grace), grace)
                continue
            lender, pool = chosen
            pre = self._preempt(
                r, freed,
                lambda v, r=r: (
                    f"preempted for critical request {r.name}: team {r.team}'s guarantee is "
                    f"used up, so it borrows, and nothing else fits; team {v.team} holds "
                    f"this beyond its own guarantee, grace {v.grace_s:g} s"),
                "critical")
            lent.pool = pool
            rows_ok = borrow.covered_rows(book, lender, room, models)
            placed = borrow.place_borrowed(self.cycle, r, weight, view, g, rows_ok, lender,
                                           lent, policy, np.array([row]))
            assert placed is not None  # found feasible on a trial copy of this very state
            whose = ", ".join(sorted({f"team {v.team} ({v.request_name})" for v in freed}))
            of = f"team {lender}'s quota" if lender else "capacity no team's guarantee covers"
            note = (f"borrowed {r.total_gpu_milli / MILLI_PER_GPU:g} GPUs of {of}, preempting "
                    f"{whose} (held beyond their guarantees); critical work, not reclaimed")
            placements.append(replace(placed, note=note))
            preemptions.extend(pre)
        return placements, preemptions

    def _waited(self, r: Request) -> float:
        """Seconds ``r`` has waited (unknown: as long as any grace)."""
        if r.submitted_at is None:
            return float("inf")
        return (self.now - r.submitted_at).total_seconds()

    def _lender(self, r: Request, row: int, freed: list[Victim], book: QuotaBook,
                lent: borrow.Lent, room: np.ndarray, models: np.ndarray
                ) -> tuple[str, dict[str, int]] | None:
        """Who lends ``r`` its GPUs on ``row`` once ``freed`` are gone, and what every
        lender may lend then: what they borrowed goes back to its lender, what they held
        within their own team's guarantee becomes idle there. None when no consenting
        lender can cover it."""
        pool = dict(lent.pool)
        for v in freed:
            if v.borrowed_from is not None:
                pool[v.borrowed_from] = pool.get(v.borrowed_from, 0) + v.milli
        before = borrow.lendable(book, self.cycle)
        trial = self.cycle.clone()
        for v in freed:
            _free(trial, v)
        for t, milli in borrow.lendable(book, trial).items():
            pool[t] = pool.get(t, 0) + milli - before.get(t, 0)
        for lender in borrow.lenders(book, r.team, pool):
            if pool.get(lender, 0) >= r.total_gpu_milli and borrow.covered_rows(
                    book, lender, room, models)[row]:
                return lender, pool
        return None
