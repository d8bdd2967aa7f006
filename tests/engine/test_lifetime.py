"""Lifetime-aware node choice (gpu_pool.engine.greedy.lifetime_points): work with a time
limit goes beside work that outlasts it, so no node stays pinned by one long task."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest
from engine_checks import check_plan
from engine_factories import NOW, make_allocation, make_node, make_request, make_snapshot

from gpu_pool.engine import FleetState, plan
from gpu_pool.engine.greedy import (
    LIFETIME_POINTS,
    LIFETIME_SPAN_S,
    Cycle,
    fit,
    lifetime_points,
    node_order,
    row_ends,
)
from gpu_pool.engine.objective import build_view
from gpu_pool.model import Policy

H = timedelta(hours=1)
DAY = timedelta(days=1)


def test_points_are_zero_when_the_row_outlasts_the_task_and_grow_with_the_lengthening():
    ends = np.array([0.0, 3600.0, 86400.0, 10 * 86400.0, math.inf])
    pts = lifetime_points(ends, 86400.0)
    assert pts[2] == pts[3] == pts[4] == 0.0  # the row is busy at least as long
    assert pts[0] > pts[1] > 0.0  # an empty row is lengthened most
    assert lifetime_points(np.array([0.0]), 10 * LIFETIME_SPAN_S)[0] == LIFETIME_POINTS
    steps = [lifetime_points(np.zeros(1), s)[0] for s in (60.0, 3600.0, 86400.0, 30 * 86400.0)]
    assert 0 < steps[0] < steps[1] < steps[2] < steps[3] == LIFETIME_POINTS


def test_row_ends_reads_the_allocations_time_limits():
    a, b, c, d = (make_node(n, "A100", 8) for n in ("a", "b", "c", "d"))
    allocs = [make_allocation("x", a, (0,), ends_in=2 * H),
              make_allocation("y", a, (1,), ends_in=5 * H),
              make_allocation("z", b, (0,), ends_in=H),
              make_allocation("w", b, (1,), ends_in=None),  # no limit: b never frees
              make_allocation("v", c, (0,), ends_in=-H)]  # overdue: ends any moment
    snap = make_snapshot([a, b, c, d], [], allocations=allocs)
    state = FleetState.from_snapshot(snap)
    ends = row_ends(state, snap.allocations, NOW)
    got = dict(zip(state.layout.names, ends.tolist(), strict=True))
    assert got == {"a": 5 * 3600.0, "b": math.inf, "c": 0.0, "d": 0.0}


def test_capacity_in_use_without_an_allocation_counts_as_never_ending():
    a = make_node("a", "A100", 8)
    snap = make_snapshot([a], [], allocations=[make_allocation("x", a, (0,), ends_in=H)])
    state = FleetState.from_snapshot(snap)
    assert row_ends(state, (), NOW).tolist() == [math.inf]


def _two_nodes(limit: timedelta | None):
    """a: one GPU held for ten days; b: one GPU held for an hour; b comes first in the
    fixed node order, and FGD sees the two alike."""
    a, b = make_node("a", "A100", 8), make_node("b", "A100", 8)
    allocs = [make_allocation("long", a, (0,), ends_in=10 * DAY),
              make_allocation("short", b, (0,), ends_in=H)]
    return make_snapshot([a, b], [make_request("r", 1, time_limit=limit)], allocations=allocs)


@pytest.mark.parametrize(("limit", "node"), [
    (5 * DAY, "a"),  # beside the ten-day task: b empties in an hour, whole again
    (30 * timedelta(minutes=1), "b"),  # ends before either: the fixed order decides
    (None, "b"),  # no limit: lifetimes unknown, the fixed order decides
])
def test_a_long_task_goes_beside_the_work_that_outlasts_it(limit, node):
    snap = _two_nodes(limit)
    state = FleetState.from_snapshot(snap)
    rank = dict(zip(state.layout.names, node_order(state).tolist(), strict=True))
    assert rank["b"] < rank["a"]  # the order alone would choose b
    p = plan(snap)
    assert p.placement_of("r").assignments[0].node == node
    check_plan(p, snap)


def test_the_cycle_books_its_own_placements_lifetimes():
    """A placement lengthens its rows' busy time to its time limit (for ever without one),
    in the cycle and in its clones, so later decisions of the cycle see it."""
    nodes = [make_node(n, "A100", 8) for n in ("a", "b")]
    state = FleetState.from_nodes(nodes)
    cycle = Cycle(state, np.zeros(0), 0, None, ends=row_ends(state, (), NOW))
    view = build_view(make_request("probe"), state.layout, Policy())
    for name, limit in (("ten-days", 10 * DAY), ("an-hour", H), ("unlimited", None)):
        r = make_request(name, 1, time_limit=limit)
        choice = fit(cycle, r, 1, view, np.full(state.size, -1))
        assert choice is not None
        before = cycle.clone()
        cycle.commit(r, choice)
        (row,) = choice.rows
        expected = math.inf if limit is None else max(limit.total_seconds(),
                                                      before.ends[row])
        assert cycle.ends[row] == expected
        if name == "ten-days":  # the clone kept its own copy, as it was
            assert before.ends[row] == 0.0 and expected == 10 * 86400.0
