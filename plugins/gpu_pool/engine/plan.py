"""One placement cycle, read top to bottom: ``plan(snapshot) -> Plan``.

Steps of :func:`plan_on_state`:

1. weigh every pending request (aged weight) and look up its static view and quota group
   per node;
2. set aside what cannot be placed this cycle at all (never fits, data not ready);
3. build the start cycle (a private copy of free capacity, quota left, headroom, FGD); a
   request whose data would leave its zone keeps only the moves that pay for their
   transfer with the home-zone wait they save (:mod:`gpu_pool.engine.zones`, per request
   type and its place in the cycle's order: room at home now means no move);
   requests pending past ``policy.reserve_after`` go into it first when they fit, else
   close the node(s) they need to everything else (:mod:`gpu_pool.engine.reserve`);
4. greedy priority-order placement on a copy of it (small cycles try three orders
   within a priority and keep the best, see :func:`~gpu_pool.engine.greedy.best_greedy`):
   the baseline; steps 4 and 5 place every request within its quota, one the off-peak
   gate would lend too (it goes beyond its quota only in step 6(b'));
5. a model on another copy: the exact per-GPU CP-SAT model (:mod:`gpu_pool.engine.exact`)
   when the cycle is small, else the class model (:mod:`gpu_pool.engine.cpsat`, built
   before step 4, its LP solving in the background while greedy runs): its LP
   relaxation bounds every plan, and greedy within ``policy.solver_relative_gap`` of the
   bound stands; else the LP rounded down made concrete, then CP-SAT if still short; a
   plan is kept only when it is worth strictly more than greedy's;
   then a second look at data moves: a request kept home for room at home that the plan
   gave to other work is decided again against what the plan left (this cycle's
   placements holding their GPUs until their time limits), and greedy places the moves
   that now pay (what the next cycle would do, one cycle sooner);
   then backfill: requests still waiting whose time limit ends by a reservation's
   expected start may take its nodes (:func:`gpu_pool.engine.reserve.backfill`);
6. preemption and borrowing on the plan's final cycle: (a) critical requests still
   pending may preempt eligible preemptible allocations; (b) requests within their team's
   guarantee take back GPUs lent out (:mod:`gpu_pool.engine.preempt`); (b') off-peak, the
   requests the gate lends that are still pending go beyond their quota (greedy, their
   lent quota groups); (c) preemptible requests still pending may borrow beyond their
   guarantee, with the lender's consent (:mod:`gpu_pool.engine.borrow`); neither (b') nor
   (c) on nodes (a) or (b) preempted on; (d) critical requests still pending whose team's
   guarantee is used up preempt other teams' work held beyond their own guarantees and
   borrow what that frees (``policy.critical_preempts_borrowers``). So work within its quota goes before work beyond
   it, whatever their classes (Kueue's order: requests under nominal quota before
   borrowing ones); ranked by class alone, a low request lent beyond its team's quota
   could take the GPU a batch request within its own needs, which reclaim would then
   take back from the lent team: a preemption for nothing;
   6b. once off-peak has ended, the peak preempts the preemptible off-peak allocations
   still running (:mod:`gpu_pool.engine.offpeak`; off-peak lending in step 6(b') only
   lends work that ends before the peak or is preemptible, and lent placements beyond
   quota are marked);
7. a reason for every request left pending (:mod:`gpu_pool.engine.reasons`);
8. an estimated start for each request waiting for capacity, the first
   ``policy.start_estimates`` in line (:mod:`gpu_pool.engine.estimate`), and for critical
   work that will preempt to borrow (6d) the end of its victims' grace.

Invariants: no I/O, no printing, inputs never mutated (the caller's :class:`FleetState`
may gain a cache of its FGD measure, which does not change what it reports); the same
inputs give the same plan (the solver runs with a fixed seed under a deterministic time
limit, see :func:`gpu_pool.engine.cpsat.configured_solver`; only its wall-clock guard,
at twice the limit on an overloaded machine, can break this; GLOP is deterministic).
``stats.objective`` is the value of the placements on free capacity (step 4 or 5, with
the starving requests step 3 placed first, the moves of step 5's second look and the
backfilled work, all added to the greedy value and the bound too); placements won by preemption or
borrowing (step 6) come on top and are not counted in it.
"""

from __future__ import annotations

import gc
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta

import numpy as np

from gpu_pool.engine import borrow, cpsat, estimate, exact, offpeak, preempt, reserve, zones
from gpu_pool.engine.capacity import FleetState
from gpu_pool.engine.compat import never_fits
from gpu_pool.engine.fragmentation import TaskShape, WorkloadMix
from gpu_pool.engine.greedy import (
    FGD_CACHE_CELLS,
    FGD_DECISIONS,
    Cycle,
    best_greedy,
    greedy_order,
    headroom_scopes,
    row_ends,
)
from gpu_pool.engine.objective import (
    RequestView,
    aged_weights,
    build_view,
    view_key,
    view_policy_key,
)
from gpu_pool.engine.quota import NO_QUOTA, QuotaBook
from gpu_pool.engine.reasons import ReasonInputs, pending_reason, queued_behind
from gpu_pool.engine.types import (
    PendingReason,
    Placement,
    Plan,
    ReasonCode,
    Snapshot,
    SolveStats,
    SolveStatus,
)
from gpu_pool.model import Allocation, Lending, Policy, PriorityClass, Quota, Request

MixSpec = tuple[tuple[tuple[int, int], float], ...]


def mix_of(requests: Sequence[Request], given: MixSpec | WorkloadMix = ()) -> WorkloadMix:
    """The mix FGD measures against: ``given`` if any, else the shapes of ``requests``.

    ``given`` is either :attr:`Snapshot.workload_mix` pairs or a full :class:`WorkloadMix`
    (with CPU per shape, as the simulator derives it from a trace). Derived shapes keep GPU
    count, share and accepted models but not CPU or RAM, so a large queue yields a handful
    of shapes rather than one per request.
    """
    if isinstance(given, WorkloadMix):
        return given
    if given:
        return WorkloadMix.from_snapshot(given)
    counts = Counter((r.gpus, r.gpu_milli, r.gpu_models) for r in requests if r.gpus > 0)
    return WorkloadMix.from_counts(
        {TaskShape(g, m, 0, 0, models): n for (g, m, models), n in counts.items()},
        coverage=0.95)


def plan(snapshot: Snapshot) -> Plan:
    """The plan for ``snapshot`` (see the module docstring)."""
    with gc_paused():  # the fleet state too is thousands of small objects
        return plan_on_state(
            FleetState.from_snapshot(snapshot), snapshot.requests, quotas=snapshot.quotas,
            allocations_usage=snapshot.allocations, policy=snapshot.policy, now=snapshot.now,
            workload_mix=snapshot.workload_mix, team_usage=snapshot.team_usage,
            lending=snapshot.lending, runtime_ratios=snapshot.runtime_ratios)


def plan_on_state(state: FleetState, requests: Sequence[Request], *,
                  quotas: Sequence[Quota] = (), allocations_usage: Sequence[Allocation] = (),
                  policy: Policy, now: datetime, workload_mix: MixSpec | WorkloadMix = (),
                  use_solver: bool = True, team_usage: Mapping[str, float] | None = None,
                  lending: Sequence[Lending] = (),
                  runtime_ratios: Sequence[float] = ()) -> Plan:
    """Plan ``requests`` onto the free capacity of ``state`` (which is not changed).

    ``allocations_usage``: the active allocations, from which quota usage is derived and
    among which preemptible ones may be preempted; capacity comes from ``state`` alone.
    ``use_solver=False`` returns the greedy plan (what-if tools, the simulator's baseline).
    ``team_usage``: decayed GPU-hours per team (:attr:`Snapshot.team_usage`): among requests
    of equal aged weight, the team with less goes first (off when
    ``policy.fair_share_half_life`` is zero). The solvers value requests by weight alone:
    a plan of theirs that beats greedy may choose differently among equals.
    ``lending``: the teams' lending consents (:attr:`Snapshot.lending`).
    ``runtime_ratios``: run time / time limit of recently finished tasks, for the start
    estimates (:attr:`Snapshot.runtime_ratios`).

    Python's cyclic garbage collector is paused for the cycle (and restored after, as it
    was): a large cycle allocates tens of thousands of small objects, none of them in
    reference cycles, and each allocation burst set off collector passes over the
    caller's whole heap: a quarter of a 20,000-request cycle's time in
    ``bench/placement_scale.py`` (2.3-2.7 s with it, 1.75-1.84 s without, same run).
    """
    with gc_paused():
        usage = team_usage if policy.fair_share_half_life > timedelta(0) else None
        return _plan_on_state(state, requests, quotas, allocations_usage, policy, now,
                              workload_mix, use_solver, usage, lending, runtime_ratios)


@contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off inside, as it was after (nests)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _plan_on_state(state: FleetState, requests: Sequence[Request], quotas: Sequence[Quota],
                   allocations_usage: Sequence[Allocation], policy: Policy, now: datetime,
                   workload_mix: MixSpec | WorkloadMix, use_solver: bool,
                   usage: Mapping[str, float] | None = None,
                   lending: Sequence[Lending] = (),
                   runtime_ratios: Sequence[float] = ()) -> Plan:
    t0 = time.perf_counter()
    layout = state.layout
    # 1. weights, views, quota groups
    weights = aged_weights(requests, policy, now)
    book = QuotaBook.build(quotas, allocations_usage, policy, now, lending)
    vkey = view_policy_key(policy)
    views: dict[str, RequestView] = {r.name: build_view(r, layout, policy, vkey)
                                     for r in requests}
    group_cache: dict[tuple, np.ndarray] = {}
    groups: dict[str, np.ndarray] = {}
    gate = offpeak.OffPeakGate.at(policy, now)  # off-peak lending: only work done by the peak
    lent_names: set[str] = set()
    for r in requests:
        lent = gate.lends(r)
        if lent:
            lent_names.add(r.name)
        key = (r.team, r.purpose, lent)
        if key not in group_cache:
            group_cache[key] = book.groups_by_row(r, layout.models, lent)
        groups[r.name] = group_cache[key]
    # Reclaim measures a request against its own guarantee, lent off-peak or not: a team
    # below its guarantee takes back its GPUs at night as by day.
    own_groups = dict(groups)
    for r in requests:
        if r.name in lent_names:
            key = (r.team, r.purpose, False)
            if key not in group_cache:
                group_cache[key] = book.groups_by_row(r, layout.models, False)
            own_groups[r.name] = group_cache[key]
    # 2. what cannot be placed this cycle at all
    never: dict[str, str | None] = {}
    compatible_rows: dict[int, int] = {}  # per view (shared by identical requests)
    for r in requests:
        view = views[r.name]
        count = compatible_rows.get(id(view))
        if count is None:
            count = compatible_rows[id(view)] = int(view.compatible.sum())
        # The view already holds the static check; the sentence is only built when it fails.
        never[r.name] = (never_fits(r, layout.nodes) or "no compatible node"
                         if count < r.nodes else None)
    eligible = [r for r in requests if never[r.name] is None and r.data_ready]
    # 3. the start cycle
    # A cycle of more decisions than FGD affords never measures it: no mix to derive.
    mix = mix_of(requests, workload_mix) if len(eligible) <= FGD_DECISIONS else WorkloadMix((), ())
    if len(mix) and len(eligible) <= FGD_DECISIONS and len(mix) * state.size <= FGD_CACHE_CELLS:
        # Warm the caller's cache: later copies rebind, not rebuild. Its size is not
        # FGD_CELLS (the cells one decision may score): a request naming a scarce model has
        # few candidates, and a mix of 500 shapes over 1,213 nodes was rebuilt every cycle
        # (59 ms, when one decision costs 1 ms).
        state.fragmentation(mix)
    start_state = state.copy()
    start = Cycle(start_state, book.remaining(), policy.critical_headroom_gpus,
                  mix if len(mix) else None, decisions=max(len(eligible), 1),
                  scopes=headroom_scopes(start_state, policy.headroom),
                  # lifetimes weigh only requests with a time limit: none, no pass
                  ends=row_ends(start_state, allocations_usage, now)
                  if any(r.time_limit is not None for r in eligible) else None)
    ordered = greedy_order(eligible, weights, usage)  # fair share breaks ties of weight
    static_views = views
    decision = zones.decide(ordered, views, state, allocations_usage, policy, now)
    views, zone_calls, zone_waits = decision.views, decision.calls, decision.waits
    by_request = {r.name: r for r in ordered}
    held = reserve.reserve(start, ordered, weights, views, groups, policy, now,
                           allocations_usage)
    if held.placements:
        first = held.placed
        ordered = [r for r in ordered if r.name not in first]
    # 5, begun: a large cycle's class model is built from ``start`` and its LP solves in
    # the background (GLOP without the GIL) while greedy runs.
    solving = use_solver and len(ordered) > 1 and policy.solver_time_limit_s > 0
    cand = exact.affordable(start, ordered, views, own_groups) if solving else None
    classes = (cpsat.build_classes(start, ordered, weights, views, own_groups, policy)
               if solving and cand is None else None)
    # 4. greedy
    # The solvers of step 5 start again from ``start`` only when there is a choice to make,
    # so a single request may be placed on it (best_greedy decides when that is).
    work, placements, greedy_value = best_greedy(start, ordered, weights, views, own_groups,
                                                 usage, in_place=True)
    stats = SolveStats(SolveStatus.GREEDY if eligible else SolveStatus.TRIVIAL,
                       0.0, float(greedy_value), float(greedy_value))
    best_value, final = greedy_value, work
    # 5. CP-SAT (exact when small, over classes otherwise), when there is a choice to make
    if solving:
        if cand is not None:
            result = exact.solve_exact(start, ordered, weights, views, own_groups, placements,
                                       policy, cand)
        else:
            assert classes is not None
            result = cpsat.finish_classes(classes, start, ordered, weights, views, own_groups,
                                          placements, policy, greedy_value)
        upper = result.upper_bound
        improved = result.value > greedy_value and result.cycle is not None
        if improved:
            placements, best_value, final = result.placements, result.value, result.cycle
        # OPTIMAL only when the plan's value meets a proven bound (of the exact model, or of
        # the class relaxation); the solver's own status speaks of its model, not the plan.
        if upper is not None and best_value >= upper:
            status = SolveStatus.OPTIMAL
        else:
            status = SolveStatus.FEASIBLE if improved else SolveStatus.GREEDY
        stats = SolveStats(status, 0.0, float(best_value), float(greedy_value),
                           None if upper is None else float(max(upper, best_value)),
                           result.detail)
    if held.placements:
        placements = [*held.placements, *placements]
    # 5b. a second look at data moves: requests kept home for room the plan gave to others
    placed = {p.request_name for p in placements}
    again = [r for r in ordered if r.name not in placed and zone_waits.get(r.name) == 0.0]
    second = 0
    if again:
        assert decision.holds is not None  # some request moves data
        second_look = zones.decide(
            again, static_views, final.state, allocations_usage, policy, now,
            holds=decision.holds, placed=[(p, by_request[p.request_name]) for p in placements])
        views.update((r.name, second_look.views[r.name]) for r in again)
        zone_calls.update(second_look.calls)
        zone_waits.update(second_look.waits)
        movers = [r for r in again if second_look.waits[r.name] > 0]
        if movers:
            final, more, second = best_greedy(final, movers, weights, views, own_groups,
                                              usage)
            placements = [*placements, *more]
    # 5c. backfill: work that ends before a reservation's expected start may use its nodes
    placed = {p.request_name for p in placements}
    backfilled = 0
    if held.windows:
        waiting = [r for r in ordered if r.name not in placed]
        final, more, backfilled = reserve.backfill(final, held, waiting, weights, views,
                                                   own_groups)
        if more:
            placements = [*placements, *more]
            placed |= {p.request_name for p in more}
    # 6. (a) critical preemption, (b) reclaiming guarantees, (c) borrowing beyond them
    preempter = preempt.Preempter(final, allocations_usage, policy, now, book,
                                  [by_request[p.request_name] for p in placements])
    preemptions = []
    for step in (preempter.critical, preempter.reclaim):
        waiting = [r for r in ordered if r.name not in placed]
        won, pre = step(waiting, weights, views, own_groups)
        placements = [*placements, *won]
        placed |= {p.request_name for p in won}
        preemptions.extend(pre)
    # (b') off-peak lending: only now may eligible work go beyond its quota (Kueue's order:
    # requests within their quota before those beyond it), never on a node (a) or (b)
    # preempted on
    differs: dict[tuple[int, int], bool] = {}  # lent groups that open more than own ones
    lent_waiting = []
    for r in ordered:
        if r.name in lent_names and r.name not in placed:
            lent_g, own_g = groups[r.name], own_groups[r.name]
            key = (id(lent_g), id(own_g))
            if key not in differs:
                differs[key] = not np.array_equal(lent_g, own_g)
            if differs[key]:
                lent_waiting.append(r)
    # (b') and (c) keep the backfill rule: a reserved row takes work that ends by its
    # reservation's expected start, within quota or beyond it.
    if lent_waiting:
        final, won = _backfilling(
            final, held, lent_waiting, views,
            lambda cycle, bviews: _lend_off_peak(cycle, lent_waiting, weights, bviews, groups,
                                                 usage, preempter.nodes))
        placements = [*placements, *won]
        placed |= {p.request_name for p in won}
    borrowers = borrow.borrowers([r for r in ordered if r.name not in placed], book, policy)
    if borrowers:
        lent = borrow.Lent.of(book, final)
        final, won = _backfilling(
            final, held, borrowers, views,
            lambda cycle, bviews: (cycle, borrow.borrow(cycle, borrowers, weights, bviews,
                                                        groups, book, policy, preempter.nodes,
                                                        lent)))
        if won:
            placements = [*placements, *won]
            placed |= {p.request_name for p in won}
        # (d) critical work that found nothing idle to borrow preempts work other teams
        # hold beyond their guarantees, and borrows what that frees
        preempter.cycle = final
        won, pre = preempter.borrow_by_preemption(
            [r for r in borrowers if r.name not in placed], weights, views, groups, book, lent)
        if won:
            placements = [*placements, *won]
            placed |= {p.request_name for p in won}
            preemptions.extend(pre)
    # 6b. the peak ends off-peak work: preemptible off-peak allocations still running
    taken = {x.allocation_id for x in preemptions}
    preemptions = [*preemptions, *(x for x in offpeak.peak_reclaims(allocations_usage, policy, now)
                                   if x.allocation_id not in taken)]
    # 7. reasons
    opened = reserve.reopened(final, held.rows) if held.rows else None
    inputs = ReasonInputs(final, book, policy, held, opened, zone_calls)
    # Requests of one type get the same reason (the sentence names no request): decide once.
    decided: dict[tuple, PendingReason] = {}
    ahead = _queued_ahead(ordered, placed, {x.request_name for x in held.reservations},
                          views, groups)
    pending_list = []
    for r in requests:
        if r.name in placed:
            continue
        key = (view_key(r), id(views[r.name]), r.priority is PriorityClass.CRITICAL,
               id(groups[r.name]),
               never[r.name], None if r.data_ready else (r.dataset and r.dataset.uri),
               held.holder(r.name) if held.reservations else None)
        reason = decided.get(key)
        if reason is None:
            reason = pending_reason(r, weights[r.name], views[r.name], groups[r.name], inputs,
                                    never[r.name])
            decided[key] = reason
        message = reason.message
        if reason.code is ReasonCode.QUOTA_EXHAUSTED:
            back = gate.held_back(r)  # off-peak would have lent it, but it crosses the peak
            if back is not None:
                message = f"{back} ({message})"
        if r.name in preempter.deferred:
            at, grace = preempter.deferred[r.name]
            message = (f"{message}; unless GPUs free first, it preempts work other teams "
                       f"hold beyond their guarantees at {at:%Y-%m-%d %H:%M:%S} UTC, once it "
                       f"has waited their {grace:g} s grace")
        pending_list.append(queued_behind(PendingReason(r.name, reason.code, message),
                                          ahead.get(r.name, 0)))
    pending = tuple(pending_list)
    if lent_names & placed:
        by_request = {r.name: r for r in requests}
        placements = offpeak.mark_beyond_quota(placements, by_request, lent_names & placed, book,
                                               dict(zip(layout.names, layout.models,
                                                        strict=True)), gate)
    # 8. start estimates for the requests waiting for capacity
    estimates = {}
    if policy.start_estimates:
        waits = {x.request_name for x in pending if x.code in estimate.CAPACITY}
        queue = [r for r in ordered if r.name in waits]
        if queue:
            gone = {x.allocation_id for x in preemptions}
            every = {r.name: r for r in requests}
            runtimes = estimate.Runtimes(runtime_ratios)
            holds = runtimes.holds(layout, [a for a in allocations_usage if a.id not in gone],
                                   [(p, every[p.request_name]) for p in placements], now)
            estimates = estimate.estimate_starts(
                (opened or final).state, queue, views, holds, held.reservations, now,
                policy.start_estimates, runtimes)
        # Critical work that will preempt to borrow starts when its victims' grace ends
        # (held by quota, the queue's play-forward gives it none).
        for name, (at, grace) in preempter.deferred.items():
            estimates[name] = at + timedelta(seconds=grace)
    by_name = {p.request_name: p for p in placements}
    if zone_calls:
        for name, p in by_name.items():
            if p.cross_zone:
                by_name[name] = zones.annotate(p, zone_calls[id(views[name])],
                                               zone_waits[name], layout)
    ordered_placements: tuple[Placement, ...] = tuple(
        by_name[r.name] for r in requests if r.name in by_name)
    # Starving requests placed first and the second look's moves count on both sides.
    pre = held.value + second + backfilled
    stats = SolveStats(stats.status, time.perf_counter() - t0, stats.objective + pre,
                       stats.greedy_objective + pre,
                       None if stats.upper_bound is None else stats.upper_bound + pre,
                       stats.detail)
    reservations = tuple(x for x in held.reservations if x.request_name not in placed)
    return Plan(ordered_placements, pending, tuple(preemptions), stats, reservations,
                estimates)


def _backfilling(final: Cycle, held: reserve.Held, waiting: Sequence[Request],
                 views: dict[str, RequestView],
                 step: Callable[[Cycle, dict[str, RequestView]], tuple[Cycle, list[Placement]]]
                 ) -> tuple[Cycle, list[Placement]]:
    """Run a placing ``step`` over ``waiting`` (a cycle and their views in, the cycle
    after and its placements out) on ``final``; where some of them end by a reservation's
    expected start, on a copy with the reserved rows open to them alone
    (:func:`reserve.backfill_views`, a view for each of ``waiting``), closed again after."""
    if held.windows:
        bviews, names = reserve.backfill_views(held, waiting, views)
        if names:
            after, won = step(reserve.reopened(final, held.rows), bviews)
            return reserve.close(after, held.rows), won
    return step(final, views)


def _lend_off_peak(cycle: Cycle, waiting: Sequence[Request], weights: dict[str, int],
                   views: dict[str, RequestView], groups: dict[str, np.ndarray],
                   usage: Mapping[str, float] | None, avoid: set[str]
                   ) -> tuple[Cycle, list[Placement]]:
    """Step 6(b'): greedy over the pending requests the off-peak gate lends, with their
    lent quota groups, on ``cycle`` after the plan, preemption and reclaim; rows of the
    nodes in ``avoid`` (this cycle preempted there) closed."""
    if avoid:
        closed = cycle.state.layout.rows_named(avoid)
        masked: dict[int, np.ndarray] = {}
        lent = {}
        for r in waiting:
            g = groups[r.name]
            if id(g) not in masked:
                masked[id(g)] = np.where(closed, NO_QUOTA, g)
            lent[r.name] = masked[id(g)]
        groups = lent
    final, won, _value = best_greedy(cycle, waiting, weights, views, groups, usage)
    return final, won


def _queued_ahead(ordered: Sequence[Request], placed: set[str], holders: set[str],
                  views: dict[str, RequestView], groups: dict[str, np.ndarray]
                  ) -> dict[str, int]:
    """For each request left waiting, how many of the same shape and quota wait before it.

    ``ordered`` is the cycle's ranking (priority, then larger, then older); equal views and
    quota groups are the same objects, shared by requests of one type. A reservation's
    holder is first in line (it counts for those behind it, nobody counts for it).
    """
    seen: Counter[tuple[int, int]] = Counter()
    ahead: dict[str, int] = {}
    for r in ordered:
        if r.name in placed:
            continue
        key = (id(views[r.name]), id(groups[r.name]))
        ahead[r.name] = 0 if r.name in holders else seen[key]
        seen[key] += 1
    return ahead


def greedy_plan(snapshot: Snapshot) -> Plan:
    """The greedy baseline alone for ``snapshot``."""
    with gc_paused():
        return plan_on_state(
            FleetState.from_snapshot(snapshot), snapshot.requests, quotas=snapshot.quotas,
            allocations_usage=snapshot.allocations, policy=snapshot.policy, now=snapshot.now,
            workload_mix=snapshot.workload_mix, use_solver=False,
            team_usage=snapshot.team_usage, lending=snapshot.lending,
            runtime_ratios=snapshot.runtime_ratios)
