"""Backfill (gpu_pool.engine.reserve): a reservation has an expected start, from the time
limits of what runs on its nodes, and work may use those nodes only if it ends by then."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest
from engine_checks import check_plan
from engine_factories import (
    NOW,
    make_allocation,
    make_node,
    make_quota,
    make_request,
    make_snapshot,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_pool.engine import plan
from gpu_pool.engine.types import ReasonCode
from gpu_pool.model import Allocation, OffPeak, OffPeakWindow, Policy, PriorityClass

H = timedelta(hours=1)
STARVING = timedelta(hours=3)


def _one_node(busy_ends: timedelta | None, smalls: dict[str, timedelta | None]):
    """Node a (8 GPUs) with GPU 0 held until ``busy_ends`` from now; an 8-GPU request
    starving for it; 1-GPU requests with the given time limits."""
    node = make_node("a", "A100", 8)
    busy = make_allocation("old", node, (0,), ends_in=busy_ends)
    big = make_request("big", 8, waited=STARVING)
    rest = [make_request(name, 1, time_limit=limit) for name, limit in smalls.items()]
    return make_snapshot([node], [big, *rest], allocations=[busy])


@pytest.mark.parametrize(("busy_ends", "limit", "starts"), [
    (2 * H, 1 * H, True),  # ends an hour before the reserved start
    (2 * H, 2 * H, True),  # ends exactly at it
    (2 * H, 2 * H + timedelta(seconds=1), False),  # a second past it
    (2 * H, None, False),  # no time limit: could run past it
    (None, 1 * H, False),  # the busy GPU has no limit: no start to backfill before
    (-H, 1 * H, False),  # overdue: the reserved start is now, nothing fits before it
])
def test_backfill_rule_table(busy_ends, limit, starts):
    snap = _one_node(busy_ends, {"small": limit})
    p = plan(snap)
    (held,) = p.reservations
    assert held.request_name == "big" and held.nodes == ("a",)
    if busy_ends is None:
        assert held.expected_start is None
    else:
        assert held.expected_start == NOW + max(busy_ends, timedelta(0))
    assert (p.placement_of("small") is not None) is starts
    if not starts:
        assert p.reason_of("small").code is ReasonCode.NODE_RESERVED
    check_plan(p, snap)


def test_reasons_name_the_expected_start_and_the_window():
    p = plan(_one_node(2 * H, {"long": 3 * H}))
    big, long = p.reason_of("big").message, p.reason_of("long").message
    assert big.endswith("expected to start by 2026-12-01 14:00 UTC, when the work there "
                        "reaches its time limits; until then only work ending by that time "
                        "starts there")
    assert long.endswith("work whose time limit ends by 2026-12-01 14:00 UTC may start there")


def test_several_short_tasks_fill_the_reserved_node():
    smalls = {f"s{i}": 30 * timedelta(minutes=1) for i in range(9)}
    p = plan(_one_node(2 * H, smalls))
    started = sorted(x.request_name for x in p.placements)
    assert len(started) == 7  # the seven idle GPUs; the eighth waits like any other
    assert p.reservations[0].expected_start == NOW + 2 * H


def test_reservation_goes_where_work_ends_first():
    """a lacks one GPU for ten hours; b lacks four for one hour: b is reserved (the old
    rule, smallest shortfall first, chose a and a ten-hour wait)."""
    a, b = make_node("a", "A100", 8), make_node("b", "A100", 8)
    busy = [make_allocation("old-a", a, (0,), ends_in=10 * H),
            *[make_allocation(f"old-b{i}", b, (i,), ends_in=H) for i in range(4)]]
    snap = make_snapshot([a, b], [make_request("big", 8, waited=STARVING)],
                         allocations=busy)
    (held,) = plan(snap).reservations
    assert held.nodes == ("b",) and held.expected_start == NOW + H
    # Without known ends the shortfall decides, as before.
    blind = make_snapshot([a, b], snap.requests,
                          allocations=[dataclasses.replace(x, ends_by=None) for x in busy])
    (held,) = plan(blind).reservations
    assert held.nodes == ("a",) and held.expected_start is None


def test_gang_expected_start_is_its_last_node():
    nodes = [make_node(n, "A100", 4) for n in "abc"]
    busy = [make_allocation("old-a", nodes[0], (0,), ends_in=H),
            make_allocation("old-b", nodes[1], (0,), ends_in=3 * H),
            make_allocation("old-c", nodes[2], (0,), ends_in=5 * H)]
    gang = make_request("gang", 4, nodes=2, waited=STARVING)
    short = make_request("short", 1, time_limit=2 * H)
    long = make_request("long", 1, time_limit=4 * H)
    snap = make_snapshot(nodes, [gang, short, long], allocations=busy)
    p = plan(snap)
    (held,) = p.reservations
    assert sorted(held.nodes) == ["a", "b"] and held.expected_start == NOW + 3 * H
    assert p.placement_of("short").assignments[0].node in ("a", "b", "c")
    assert p.placement_of("long").assignments[0].node == "c"  # 4 h > the 3 h window
    check_plan(p, snap)


def test_critical_work_backfills_too_and_keeps_the_rule():
    snap = _one_node(2 * H, {})
    from gpu_pool.model import PriorityClass
    crit = make_request("crit", 2, priority=PriorityClass.CRITICAL, time_limit=H)
    p = plan(dataclasses.replace(snap, requests=(*snap.requests, crit)))
    assert p.placement_of("crit") is not None


@pytest.mark.parametrize(("who", "limit", "starts", "lent_by"), [
    ("borrower", 1 * H, True, "cv"),  # preemptible, beyond its guarantee: borrows there
    ("borrower", 3 * H, False, None),  # would run past the reserved start
    ("borrower", None, False, None),
    ("critical", 1 * H, True, "cv"),  # critical work beyond its team's quota borrows idle GPUs
    ("critical", 3 * H, False, None),
    ("offpeak", 1 * H, True, None),  # batch work lent beyond its quota at night
    ("offpeak", 3 * H, False, None),
])
def test_work_beyond_its_quota_keeps_the_backfill_rule(who, limit, starts, lent_by):
    """Node a (8 GPUs, one held for two hours by team cv) is reserved for cv's starving
    8-GPU request. Team nlp has no GPUs of its own: a request of nlp may start on the idle
    GPUs only beyond its quota, and only if it ends by the reserved start (before,
    borrowing and off-peak lending never used a reserved row: a critical task whose team's
    quota was full waited a cycle in the sharing replay beside such a node)."""
    node = make_node("a", "A100", 8)
    busy = make_allocation("old", node, (0,), team="cv", ends_in=2 * H)
    big = make_request("big", 8, team="cv", waited=STARVING)
    kind = {"borrower": {"preemptible": True},
            "critical": {"priority": PriorityClass.CRITICAL},
            "offpeak": {"priority": PriorityClass.BATCH}}[who]
    small = make_request("small", 1, team="nlp", time_limit=limit, **kind)
    quotas = (make_quota("cv", 9), make_quota("nlp", 0, borrow=0 if who == "offpeak" else 4))
    policy = Policy()
    if who == "offpeak":  # off-peak from 10:00 to 20:00: now (12:00) is; borrowing off
        policy = Policy(borrowing=False,
                        off_peak=OffPeak((OffPeakWindow(start_hour=10, end_hour=20),)))
    snap = make_snapshot([node], [big, small], allocations=[busy], quotas=quotas,
                         policy=policy)
    p = plan(snap)
    (held,) = p.reservations
    assert held.request_name == "big" and held.expected_start == NOW + 2 * H
    got = p.placement_of("small")
    assert (got is not None) is starts
    if got is not None:
        assert got.borrowed_from == lent_by and got.off_peak is (who == "offpeak")
    else:  # the reason names the reservation (it read "... down or draining" for borrowers)
        why = p.reason_of("small")
        assert why.code is ReasonCode.NODE_RESERVED, why.message
        assert "fits only on a, reserved for big" in why.message
    check_plan(p, snap)


def _allocations_of(p, snap) -> list[Allocation]:
    """The plan's placements as active allocations, held until their time limits."""
    by_name = {r.name: r for r in snap.requests}
    out = []
    for x in p.placements:
        r = by_name[x.request_name]
        for part in x.assignments:
            out.append(Allocation(r.name, part.node, part.gpu_indices, part.gpu_milli,
                                  part.cpu_milli, part.memory_mib, r.team, r.purpose,
                                  r.priority, None, snap.now,
                                  ends_by=None if r.time_limit is None
                                  else snap.now + r.time_limit,
                                  id=f"new-{r.name}-{part.node}"))
    return out


@st.composite
def fleets(draw):
    n = draw(st.integers(1, 4))
    nodes = [make_node(f"n{i}", "A100", draw(st.sampled_from([2, 4, 8]))) for i in range(n)]
    allocations = []
    for node in nodes:
        held = draw(st.lists(st.integers(0, len(node.gpus) - 1), unique=True,
                             max_size=len(node.gpus)))
        for g in held:
            ends = draw(st.one_of(st.none(), st.integers(-1, 12)))
            allocations.append(make_allocation(
                f"old-{node.name}-{g}", node, (g,),
                ends_in=None if ends is None else ends * H))
    requests = []
    for i in range(draw(st.integers(1, 8))):
        gpus = draw(st.sampled_from([1, 2, 4, 8]))
        limit = draw(st.one_of(st.none(), st.integers(1, 12)))
        waited = draw(st.sampled_from([timedelta(0), STARVING, 2 * STARVING]))
        requests.append(make_request(f"r{i}", gpus, waited=waited + i * timedelta(seconds=1),
                                     time_limit=None if limit is None else limit * H))
    k = draw(st.integers(1, 3))
    return make_snapshot(nodes, requests, allocations=allocations,
                         policy=Policy(max_reservations=k))


def _reserved_rows_take_only_work_ending_by_their_start(p, snap) -> None:
    by_name = {r.name: r for r in snap.requests}
    starving = {r.name for r in snap.requests
                if snap.now - r.submitted_at >= snap.policy.reserve_after}
    for held in p.reservations:
        for x in p.placements:
            # A starving request ranked ahead of the holder is placed before it reserves.
            # (a replan holds them to the rule too: they must not delay it either)
            if x.request_name in starving:
                continue
            if {a.node for a in x.assignments} & set(held.nodes):
                limit = by_name[x.request_name].time_limit
                assert held.expected_start is not None and limit is not None
                assert snap.now + limit <= held.expected_start


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_work_never_delays_a_reservation(snap):
    """Property: whatever the plan starts on a reserved node ends by its expected start,
    and planning again with the plan's placements running (held to their time limits)
    promises every reservation the same start or an earlier one."""
    p = plan(snap)
    check_plan(p, snap)
    _reserved_rows_take_only_work_ending_by_their_start(p, snap)
    placed = {x.request_name for x in p.placements}
    after = dataclasses.replace(
        snap, allocations=(*snap.allocations, *_allocations_of(p, snap)),
        requests=tuple(r for r in snap.requests if r.name not in placed))
    again = {x.request_name: x for x in plan(after).reservations}
    for held in p.reservations:
        if held.expected_start is None:
            continue
        later = again[held.request_name]
        assert later.expected_start is not None
        assert later.expected_start <= held.expected_start


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleets())
def test_same_state_same_reservations(snap):
    a, b = plan(snap), plan(snap)
    assert a.reservations == b.reservations and a.placements == b.placements


@st.composite
def shared_fleets(draw):
    """:func:`fleets` with two teams' quotas: requests of team nlp (a small guarantee)
    borrow, critical ones beyond the quota too, batch ones are lent off-peak (now is
    off-peak in half the draws)."""
    snap = draw(fleets())
    requests = []
    for r in snap.requests:
        kind = draw(st.sampled_from(["plain", "preemptible", "critical", "batch"]))
        # The starving ones (the reservations' holders) are mostly cv's, the rest nlp's.
        starving = snap.now - r.submitted_at >= snap.policy.reserve_after
        team = draw(st.sampled_from(["cv", "cv", "nlp"] if starving else ["nlp", "nlp", "cv"]))
        requests.append(dataclasses.replace(
            r, team=team, preemptible=kind == "preemptible",
            priority={"critical": PriorityClass.CRITICAL, "batch": PriorityClass.BATCH}.get(
                kind, r.priority)))
    quotas = (make_quota("cv", draw(st.integers(4, 24)), borrow=draw(st.integers(0, 8))),
              make_quota("nlp", draw(st.integers(0, 2)), borrow=draw(st.integers(0, 8))))
    window = (OffPeakWindow(start_hour=10, end_hour=20),) if draw(st.booleans()) else ()
    policy = dataclasses.replace(snap.policy, off_peak=OffPeak(window) if window
                                 else snap.policy.off_peak)
    return dataclasses.replace(snap, requests=tuple(requests), quotas=quotas, policy=policy)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shared_fleets())
def test_borrowed_and_lent_work_never_delays_a_reservation(snap):
    """Property: with quotas, borrowing, critical work beyond its quota and off-peak
    lending, whatever the plan starts on a reserved node (a starving request ranked ahead
    of the holder aside) ends by the reservation's expected start."""
    p = plan(snap)
    check_plan(p, snap)
    _reserved_rows_take_only_work_ending_by_their_start(p, snap)
