"""Starvation guard: a request that has waited too long reserves the node(s) it needs.

Without it a large request (8 GPUs, a gang) can wait forever: every cycle the few nodes
that could ever hold it are back-filled with small requests the moment anything frees
there (measured on the openb trace: 8-GPU requests waiting 26 days while best-fit starts
them within a minute). Slurm's backfill reservation, Kueue's reservations and YARN's
reservations all answer it the same way, and so does this module.

Terms
-----
starving
    Eligible (data ready, could ever fit) and pending for at least
    ``Policy.reserve_after`` (``now - submitted_at``).
shortfall of a row
    What a part of the request still lacks there, as the largest fraction over its
    resources: whole GPUs missing / GPUs asked (for a share: milli missing on the row's
    freest GPU / milli asked), CPU missing / CPU asked, RAM missing / RAM asked.
    0 means it fits the row now.

Rule (applied to the start cycle, before greedy and CP-SAT, so every planner sees it):
starving requests are taken in greedy order (aged weight, larger whole-GPU requests first,
older first).
The first ``Policy.max_reservations`` of them are served (the rest wait their turn, as
in Slurm, where only the top of the queue holds a reservation; serving every starving
request of a long backlog would turn the cycle into a fixed-order greedy pass): each that
fits now (:func:`~gpu_pool.engine.greedy.fit`, headroom and quota included) is
committed first: it is placed this cycle ahead of everything else. Each that does not
fit reserves the K rows it would fit soonest on (K: its nodes; rows compatible, data move
allowed, up, able to hold it when empty, with quota left for it): earliest *ready time*
first — when the holds there end by their declared time limits (``ends_by``, released in
end order, :class:`gpu_pool.engine.zones.Holds`) and one part fits (infinite when the
known ends never make room) — then smallest shortfall, then smaller summed shortfall,
then the fixed node order of :func:`~gpu_pool.engine.greedy.node_order`. The
reservation's *expected start* is the latest ready time of its rows (None when infinite).
Reserved rows are closed for the cycle: marked not up in the start cycle's private copy,
so greedy, CP-SAT and preemption place nothing there, critical work included (critical
work keeps its headroom and may preempt elsewhere; a starving critical request reserves
like any other). A row reserved for one request is never offered to the next.

Backfill (:func:`backfill`, after the planners, as Slurm's backfill scheduler): a request
still waiting whose own time limit ends by a reservation's expected start may start on
that reservation's rows. It is gone, by the limit the executor enforces, before the
reserved request's expected start, so it never delays it; work without a time limit, or
with a longer one, never starts on a reserved row. Work beyond its quota keeps the same
rule: off-peak lending and borrowing (steps 6(b') and 6(c) of
:mod:`gpu_pool.engine.plan`) see each reservation's rows open only to requests whose limit
ends by its expected start (:func:`backfill_views`); before, they never used a reserved
row, and a critical task whose team's quota was full waited beside one idle for weeks.

Why it ends: nothing new lands on a reserved row, so its shortfall never grows; the
smallest shortfall over the fleet never grows from one cycle to the next and falls as work
on the reserved rows ends, so the reservation moves only to a row closer to fitting.

Invariants: works on the cycle it is given (the planner's private copy) and nothing else;
with no starving request it changes nothing, so plans are exactly those without the rule.
A backfilled placement's request has a time limit no longer than the time from ``now`` to
the expected start of every reservation whose rows it takes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

import numpy as np

from gpu_pool.engine.greedy import Cycle, fit, node_order, run_greedy
from gpu_pool.engine.objective import RequestView, view_levels
from gpu_pool.engine.quota import UNLIMITED
from gpu_pool.engine.types import Placement, Reservation
from gpu_pool.engine.zones import Holds, ready_times
from gpu_pool.model import Allocation, Policy, Request


@dataclass
class Held:
    """What the guard did to the start cycle."""

    placements: list[Placement] = field(default_factory=list)  # starving, placed first
    value: int = 0  # their value (objective units)
    reservations: list[Reservation] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)  # every reserved row
    # Per reservation: its rows and its expected start in seconds from now (inf: unknown).
    windows: list[tuple[list[int], float]] = field(default_factory=list)

    @property
    def placed(self) -> set[str]:
        return {p.request_name for p in self.placements}

    def holder(self, name: str) -> Reservation | None:
        return next((x for x in self.reservations if x.request_name == name), None)


def starving(ordered: Sequence[Request], policy: Policy, now: datetime) -> list[Request]:
    """The requests of ``ordered`` (eligible, in greedy order) that waited past the limit."""
    if not policy.reserves:
        return []
    limit = policy.reserve_after
    return [r for r in ordered if r.submitted_at is not None and now - r.submitted_at >= limit]


def shortfall(cycle: Cycle, request: Request, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of ``rows``: the shortfall (module docstring) and the summed fractions."""
    st = cycle.state
    parts = []
    if request.gpus and request.is_share:
        best = np.maximum(st.gpu_free[rows], 0).max(axis=1)
        parts.append(np.maximum(request.gpu_milli - best, 0) / request.gpu_milli)
    elif request.gpus:
        parts.append(np.maximum(request.gpus - st.whole_free[rows], 0) / request.gpus)
    if request.cpu_milli:
        parts.append(np.maximum(request.cpu_milli - st.cpu_free[rows], 0) / request.cpu_milli)
    if request.memory_mib:
        parts.append(np.maximum(request.memory_mib - st.mem_free[rows], 0) / request.memory_mib)
    if not parts:
        zero = np.zeros(len(rows))
        return zero, zero
    stacked = np.vstack(parts)
    return stacked.max(axis=0), stacked.sum(axis=0)


def holdable_rows(cycle: Cycle, request: Request, view: RequestView,
                  groups: np.ndarray) -> np.ndarray:
    """Rows a part of ``request`` could take once enough work there ends: compatible, data
    move allowed, up, big enough when empty (healthy GPUs, CPU, RAM), quota left."""
    st = cycle.state
    layout = st.layout
    rows = np.flatnonzero(view.compatible & view.zone_ok & st.up)
    if not len(rows):
        return rows
    ok = (layout.cpu_total[rows] >= request.cpu_milli) & (
        layout.mem_total[rows] >= request.memory_mib)
    if request.gpus:
        healthy = (st.gpu_free[rows] >= 0).sum(axis=1)
        ok &= healthy >= (1 if request.is_share else request.gpus)
        g = groups[rows]
        quota_ok = g == UNLIMITED
        if len(cycle.remaining):
            part = request.gpus * request.gpu_milli
            quota_ok |= (g >= 0) & (cycle.remaining[np.maximum(g, 0)] >= part)
        ok &= quota_ok
    return rows[ok]


def close(cycle: Cycle, rows: Sequence[int]) -> Cycle:
    """Close the reserved ``rows`` of ``cycle`` (again, after work on :func:`reopened`)."""
    st = cycle.state
    for row in rows:
        cycle.adjust_budgets(row, -1)  # the fleet-wide and per model/group headroom
        st.set_schedulable(st.layout.names[row], False)
    cycle._blocks = None
    return cycle


def reopened(cycle: Cycle, rows: Sequence[int]) -> Cycle:
    """A copy of ``cycle`` with the reserved ``rows`` open again (for reasons: what would
    fit there if nothing were reserved)."""
    opened = cycle.clone()
    st = opened.state
    for row in rows:
        st.set_schedulable(st.layout.names[row], True)
        opened.adjust_budgets(row, +1)
    opened._blocks = None
    return opened


def reserve(start: Cycle, ordered: Sequence[Request], weights: dict[str, int],
            views: dict[str, RequestView], groups: dict[str, np.ndarray], policy: Policy,
            now: datetime, allocations: Sequence[Allocation] = ()) -> Held:
    """Apply the rule (module docstring) to ``start`` (changed in place); ``allocations``:
    the active ones, whose ``ends_by`` give the reservations' expected starts."""
    held = Held()
    hungry = starving(ordered, policy, now)
    if not hungry:
        return held
    names = start.state.layout.names
    holds: Holds | None = None
    first: list[tuple[Placement, Request]] = []
    for r in hungry:
        view, g = views[r.name], groups[r.name]
        if len(held.placements) + len(held.reservations) >= policy.max_reservations:
            break
        # No fit masks: this start cycle is cloned by every planner after it, and masks
        # would be carried and refreshed through each of their passes.
        choice = fit(start, r, weights[r.name], view, g, masks=False)
        if choice is not None:
            placement = start.commit(r, choice)
            held.placements.append(placement)
            held.value += choice.value
            first.append((placement, r))
            if holds is not None:  # it holds its GPUs until its own time limit
                holds = holds.plus(first[-1:])
            continue
        rows = holdable_rows(start, r, view, g)
        if len(rows) < r.nodes:
            continue  # nothing it could ever take is open: reserving would only idle nodes
        if holds is None:  # with the starving requests placed first, until their limits
            holds = Holds.of(start.state.layout, allocations, now).plus(first)
        worst, total = shortfall(start, r, rows)
        ready = (ready_times(r, rows, start.state, holds) if holds is not None
                 else np.full(len(rows), math.inf))
        order = np.lexsort((node_order(start.state)[rows], total, worst, ready))
        picked = order[: r.nodes]
        chosen = [int(rows[k]) for k in picked]
        expected = float(ready[picked].max())
        close(start, chosen)
        held.rows.extend(chosen)
        held.windows.append((chosen, expected))
        assert r.submitted_at is not None
        held.reservations.append(Reservation(
            r.name, tuple(names[row] for row in chosen), r.submitted_at + policy.reserve_after,
            now + timedelta(seconds=expected) if math.isfinite(expected) else None))
    return held


def backfill_views(held: Held, waiting: Sequence[Request], views: dict[str, RequestView],
                   every: bool = True) -> tuple[dict[str, RequestView], set[str]]:
    """The backfill rule as views, for a cycle with the reserved rows open again
    (:func:`reopened`): per request of ``waiting``, its view with each reservation's rows
    open only if its time limit ends by that reservation's expected start (a reservation's
    holder, work without a limit or with a longer one: every reserved row closed). Also the
    names of the requests some reserved rows are open to. ``every=False``: views of those
    requests only."""
    windows = [(rows, s) for rows, s in held.windows if math.isfinite(s) and s > 0]
    holders = {x.request_name for x in held.reservations}
    narrowed: dict[tuple[int, tuple[int, ...]], RequestView] = {}
    out: dict[str, RequestView] = {}
    backfills: set[str] = set()
    closed: np.ndarray | None = None
    for r in waiting:
        allowed: tuple[int, ...] = ()
        if windows and r.time_limit is not None and r.name not in holders:
            limit = r.time_limit.total_seconds()
            allowed = tuple(i for i, (_, s) in enumerate(windows) if limit <= s)
        if not allowed and not every:
            continue
        view = views[r.name]
        key = (id(view), allowed)
        v = narrowed.get(key)
        if v is None:
            if closed is None:
                closed = np.zeros(len(view.zone_ok), dtype=bool)
                closed[held.rows] = True
            ok = ~closed
            for i in allowed:
                ok[windows[i][0]] = True
            zone_ok = view.zone_ok & ok
            v = narrowed[key] = replace(
                view, zone_ok=zone_ok, signature=hash((view.signature, zone_ok.tobytes())),
                levels=view_levels(view.compatible, zone_ok, view.penalty))
        out[r.name] = v
        if allowed:
            backfills.add(r.name)
    return out, backfills


def backfill(final: Cycle, held: Held, waiting: Sequence[Request], weights: dict[str, int],
             views: dict[str, RequestView], groups: dict[str, np.ndarray]
             ) -> tuple[Cycle, list[Placement], int]:
    """Backfill (module docstring): greedy over ``waiting`` (in the cycle's order) on
    ``final`` with the reserved rows open only to requests whose time limit ends by the
    expected start of the reservation holding them. Returns the cycle after (its reserved
    rows closed again), the placements and their value; ``final`` is not changed."""
    bviews, names = backfill_views(held, waiting, views, every=False)
    chosen = [r for r in waiting if r.name in names]
    if not chosen:
        return final, [], 0
    work = reopened(final, held.rows)
    placements, value = run_greedy(work, chosen, weights, bviews, groups)
    close(work, held.rows)
    return work, placements, value
