"""Borrowing beyond a guarantee, with the lender's consent.

Terms
-----
guarantee
    A quota's ``gpus``: what its team may always use for (purpose, model); the plan's main
    steps (greedy, CP-SAT) place within guarantees only (:mod:`gpu_pool.engine.quota`).
borrowing
    A group may go beyond its guarantee by up to its quotas' ``borrow_limit_gpus``, on GPUs
    idle in a lender's guarantee or on capacity no guarantee covers (lender ``""``).
lendable
    What lender team ``L`` may still lend now: ``min(idle, limit - lent)`` where ``idle``
    is what is left of its live guarantees after the plan (its own use and this cycle's
    placements taken off) less what it lends already, ``limit`` its
    :class:`~gpu_pool.model.Lending` ``limit_gpus`` (none: no cap) and ``lent`` what active
    allocations and this cycle borrow from it. Lender ``""`` has every healthy GPU of the up
    nodes less all live guarantees less what is borrowed of it already.

Rules (step 6c of :func:`gpu_pool.engine.plan.plan_on_state`, on the plan's final cycle)
----------------------------------------------------------------------------------------
* Nothing is borrowed in an open fleet (no quotas), with ``Policy.borrowing`` off, by a
  request without a live quota group, or by a request that is not preemptible (a task
  that can never be reclaimed may not hold another team's GPUs) -- except critical work
  with ``Policy.critical_borrows``: a critical request is never held back by its team's
  quota while GPUs sit idle; it borrows them although it cannot be reclaimed (its
  lender's reclaim takes other borrowers' work, or waits for it to end).
* Still-pending requests are tried in the cycle's greedy order. A borrowed placement
  borrows all its GPUs from ONE lender (``Placement.borrowed_from``): the group's borrowing
  (``borrowed + request <= borrow limit``) and the lender's lendable must both hold the
  whole request; lender ``""`` is tried first (nobody's guarantee), then consenting teams
  with most lendable first, then by name. A lender lends only on nodes of a model its
  guarantees cover (an any-model quota covers every model).
* Nodes where this cycle preempts are not lent out again in the same cycle (no loops),
  but to critical work that preempts there to borrow (step 6d, :meth:`gpu_pool.engine.
  preempt.Preempter.borrow_by_preemption`), which books its borrowing on the same
  :class:`Lent` after this step.
* Capacity, headroom and node reservations hold as for every placement (the same
  :func:`~gpu_pool.engine.greedy.fit`); a reserved node takes only a borrower whose time
  limit ends by the reservation's expected start (the backfill rule of
  :mod:`gpu_pool.engine.reserve`).

Invariant: the same inputs give the same borrowing; only ``cycle`` is changed.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from gpu_pool.engine.greedy import Cycle, fit
from gpu_pool.engine.objective import RequestView
from gpu_pool.engine.quota import NO_QUOTA, QuotaBook
from gpu_pool.engine.types import Placement
from gpu_pool.model import MILLI_PER_GPU, Policy, PriorityClass, Request

UNGUARANTEED = ""


def _gpus(milli: float) -> str:
    return f"{milli / MILLI_PER_GPU:g}"


def lendable(book: QuotaBook, cycle: Cycle) -> dict[str, int]:
    """Milli each lender may still lend now (``""``: capacity no guarantee covers)."""
    st = cycle.state
    layout = st.layout
    fleet = sum(MILLI_PER_GPU for row, node in enumerate(layout.nodes) if st.up[row]
                for g in node.gpus if g.healthy)
    out = {UNGUARANTEED: max(0, fleet - int(book.limit_milli.sum())
                             - book.lent_milli.get(UNGUARANTEED, 0))}
    idle: dict[str, int] = {}
    for i, (team, _purpose, _model) in enumerate(book.keys):
        idle[team] = idle.get(team, 0) + max(0, int(cycle.remaining[i]))
    for team, free in idle.items():
        lent = book.lent_milli.get(team, 0)
        consent = book.consent(team)
        room = free - lent
        if consent.limit_gpus is not None:
            room = min(room, round(consent.limit_gpus * MILLI_PER_GPU) - lent)
        out[team] = max(0, room)
    return out


def covers(book: QuotaBook, lender: str) -> set[str | None]:
    """GPU models ``lender``'s live guarantees cover (``None`` in the set: every model)."""
    return {model for team, _p, model in book.keys if team == lender}


def lenders_for(book: QuotaBook, borrower: str) -> list[str]:
    """Teams with a live guarantee whose consent lets ``borrower`` borrow, sorted."""
    return [t for t in book.teams() if book.consent(t).allows(borrower)]


@dataclass
class Lent:
    """What one cycle's borrowing has left: milli per lender still lendable
    (:func:`lendable` less what the cycle borrowed of it) and milli borrowed per group
    (the book's, plus the cycle's). Carried from the borrowing step (c) to critical
    borrowing by preemption (:meth:`gpu_pool.engine.preempt.Preempter.borrow_by_preemption`)."""

    pool: dict[str, int]
    borrowed: np.ndarray

    @classmethod
    def of(cls, book: QuotaBook, cycle: Cycle) -> Lent:
        return cls(lendable(book, cycle), book.borrowed_milli.copy())

    def room(self, book: QuotaBook, g: np.ndarray, need: int) -> np.ndarray:
        """Per row: whether the request's group there may borrow ``need`` more milli."""
        safe = np.maximum(g, 0)
        return (g >= 0) & (book.borrow_limit_milli[safe] - self.borrowed[safe] >= need)


def lenders(book: QuotaBook, borrower: str, pool: Mapping[str, int]) -> list[str]:
    """Who ``borrower`` tries, in order: capacity no guarantee covers, then consenting
    teams with the most lendable in ``pool`` first, then by name."""
    return [UNGUARANTEED] + sorted((t for t in lenders_for(book, borrower) if t != borrower),
                                   key=lambda t: (-pool.get(t, 0), t))


def covered_rows(book: QuotaBook, lender: str, rows_ok: np.ndarray,
                 models: np.ndarray) -> np.ndarray:
    """``rows_ok`` less the rows of a GPU model ``lender``'s guarantees do not cover."""
    if lender == UNGUARANTEED:
        return rows_ok
    cover = covers(book, lender)
    return rows_ok if None in cover else rows_ok & np.isin(models, list(cover))


def place_borrowed(cycle: Cycle, r: Request, weight: int, view: RequestView,
                   g: np.ndarray, rows_ok: np.ndarray, lender: str, lent: Lent,
                   policy: Policy, rows: np.ndarray | None = None) -> Placement | None:
    """Place ``r`` on ``rows_ok`` (within ``rows``, if given) borrowing from ``lender``,
    applied to ``cycle`` and booked on ``lent``; None where it does not fit."""
    need = r.total_gpu_milli
    slot = len(cycle.remaining)
    trial_groups = np.where(rows_ok, slot, NO_QUOTA).astype(np.int64)
    trial = Cycle(cycle.state, np.append(cycle.remaining, need), cycle.headroom,
                  cycle.mix, cycle.budget, cycle.decisions)
    choice = fit(trial, r, weight, view, trial_groups, rows)
    if choice is None:
        return None
    placed = trial.commit(r, choice)
    cycle.budget = trial.budget
    cycle._blocks = None
    lent.pool[lender] = lent.pool.get(lender, 0) - need
    for row in choice.rows:
        lent.borrowed[int(g[row])] += r.gpus * r.gpu_milli
    where = (f"idle in team {lender}'s quota" if lender
             else "no team's guarantee covers")
    note = (f"borrowed {_gpus(need)} GPUs {where}; "
            + ("preemptible, may be reclaimed" if reclaimable(r, policy) else
               "critical work, not reclaimed: its lender waits for it to end"))
    return replace(placed, borrowed_from=lender, note=note)


def borrow(cycle: Cycle, pending: Sequence[Request], weights: dict[str, int],
           views: dict[str, RequestView], groups: dict[str, np.ndarray], book: QuotaBook,
           policy: Policy, closed: Collection[str] = (), lent: Lent | None = None
           ) -> list[Placement]:
    """Placements of still-pending preemptible requests on borrowed capacity (applied to
    ``cycle``); ``closed``: node names no borrower may use this cycle; ``lent``: where
    the cycle's borrowing is booked (a new one from ``book`` and ``cycle`` if None)."""
    pending = borrowers(pending, book, policy)
    if not pending:
        return []
    if lent is None:
        lent = Lent.of(book, cycle)
    layout = cycle.state.layout
    models = np.array(layout.models, dtype=object)
    open_rows = ~layout.rows_named(closed)
    placements: list[Placement] = []
    for r in pending:
        g = groups[r.name]
        need = r.total_gpu_milli
        ok = open_rows & lent.room(book, g, need)
        if not ok.any():
            continue
        for lender in lenders(book, r.team, lent.pool):
            if lent.pool.get(lender, 0) < need:
                continue
            rows_ok = covered_rows(book, lender, ok, models)
            if not rows_ok.any():
                continue
            placed = place_borrowed(cycle, r, weights[r.name], views[r.name], g, rows_ok,
                                    lender, lent, policy)
            if placed is not None:
                placements.append(placed)
                break
    return placements


def borrowers(pending: Sequence[Request], book: QuotaBook, policy: Policy
               ) -> list[Request]:
    """The requests of ``pending`` that may borrow (GPU work :func:`may_borrow` allows),
    none in an open fleet, with borrowing off or without quotas."""
    if book.open_fleet or not policy.borrowing or not len(book.keys):
        return []
    return [r for r in pending if r.gpus and may_borrow(r, policy)]


def may_borrow(request: Request, policy: Policy) -> bool:
    """Whether ``request`` may borrow at all: reclaimable work, or critical work with
    ``policy.critical_borrows``."""
    return reclaimable(request, policy) or (
        policy.critical_borrows and request.priority is PriorityClass.CRITICAL)


def reclaimable(request: Request, policy: Policy) -> bool:
    """Whether a placement of ``request`` could be taken back: preemptible and preempted
    fewer than ``policy.max_preemptions_per_task`` times. Only such work borrows: borrowed
    GPUs that could never be reclaimed would break their lender's guarantee."""
    return request.preemptible and request.preemptions < policy.max_preemptions_per_task


def why_not(request: Request, book: QuotaBook, policy: Policy, group: int) -> str | None:
    """Why ``request``, whose guarantee in ``group`` is used up, does not borrow: a clause
    for its pending reason, or None when borrowing was possible in principle (then it is
    capacity that lacks); ``""`` when there is nothing to add (its quota allows no
    borrowing)."""
    if book.open_fleet:
        return None
    limit = int(book.borrow_limit_milli[group])
    if limit <= 0:
        return ""
    if not policy.borrowing:
        return "borrowing beyond guarantees is off"
    if may_borrow(request, policy) and not reclaimable(request, policy):
        pass  # critical work borrows though it cannot be reclaimed
    elif not request.preemptible:
        return "held back: not preemptible, so it may not borrow beyond its guarantee"
    elif not reclaimable(request, policy):
        return (f"held back: preempted {request.preemptions} times already, the most a task "
                "may be, so it may not borrow beyond its guarantee (it could not be reclaimed)")
    need = request.total_gpu_milli
    used = int(book.borrowed_milli[group])
    if used + need > limit:
        return (f"it borrows {_gpus(used)} of its {_gpus(limit)} GPU borrow limit already; "
                f"needs {_gpus(need)}")
    others = [t for t in lenders_for(book, request.team) if t != request.team]
    if not others and int(book.limit_milli.sum()) > 0:
        return (f"quota: team {request.team} may borrow only from teams that consent "
                "(none do)")
    return None
