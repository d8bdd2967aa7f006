"""Cross-zone only when it pays (gpu_pool.engine.zones): the move, its numbers and its refusal.

The fleet of every case: a home zone ``eu`` whose A100 nodes are held until the times given,
and a zone ``us`` with free A100 nodes. The request needs a whole 4-GPU node and reads a
dataset in ``eu``.
"""

from __future__ import annotations

import math
import random
from dataclasses import replace
from datetime import timedelta

import pytest
from engine_checks import check_plan
from engine_factories import (
    NOW,
    make_allocation,
    make_node,
    make_request,
    make_snapshot,
    random_snapshot,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_pool.engine import plan
from gpu_pool.engine.types import ReasonCode
from gpu_pool.model import Policy, PriorityClass


def _fleet(holds: list[float | None], *, home_free: int = 0, us_nodes: int = 1,
           us_bandwidth: float = 1000.0):
    """Home nodes ``h<i>`` (4 A100, all held until NOW + holds[i] s; None: no time limit,
    ``home_free`` GPUs of h0 left free) and free nodes ``u<i>`` in us."""
    nodes, allocations = [], []
    for i, ends in enumerate(holds):
        node = make_node(f"h{i}", "A100", 4, zone="eu")
        nodes.append(node)
        held = tuple(range(home_free, 4)) if i == 0 else (0, 1, 2, 3)
        if held:
            a = make_allocation(f"old{i}", node, held)
            allocations.append(replace(a, ends_by=None if ends is None
                                       else NOW + timedelta(seconds=ends)))
    nodes += [make_node(f"u{i}", "A100", 4, zone="us", bandwidth=us_bandwidth)
              for i in range(us_nodes)]
    return nodes, allocations


def _plan(holds, *, size_gib: float, policy: Policy | None = None, nodes: int = 1,
          gpus: int = 4, **fleet):
    fleet_nodes, allocations = _fleet(holds, us_nodes=max(nodes, 1), **fleet)
    request = make_request("x", gpus, nodes=nodes, data_zone="eu", size_gib=size_gib)
    snap = make_snapshot(fleet_nodes, [request], allocations=allocations,
                         policy=policy or Policy())
    result = plan(snap)
    check_plan(result, snap)
    return result


H = 3600.0
# id, holds (s until each home node frees), size GiB, policy, us bandwidth, gang nodes,
# moves? (True; False: held for its zone; a reason code: waits for that), transfer s,
# expected wait saved s
CASES = [
    ("pays", [2 * H], 500, Policy(), 1000.0, 1, True, 512.0, 2 * H),
    ("does not pay", [2400], 800, Policy(max_transfer_seconds=20_000), 100.0, 1, False,
     None, None),
    ("margin boundary: equal pays", [1500], 1000, Policy(cross_zone_margin=0.5), 1024.0, 1,
     True, 1000.0, 1500.0),
    ("margin boundary: a second short", [1499], 1000, Policy(cross_zone_margin=0.5), 1024.0,
     1, False, None, None),
    ("margin 0: any saving pays", [1001], 1000, Policy(cross_zone_margin=0.0), 1024.0, 1,
     True, 1000.0, 1001.0),
    ("link bandwidth wins over the node's", [2 * H], 500,
     Policy(zone_links={("eu", "us"): 100.0}, max_transfer_seconds=20_000), 1000.0, 1, False,
     None, None),
    ("a link the other way is not this one", [2 * H], 500,
     Policy(zone_links={("us", "eu"): 100.0}), 1000.0, 1, True, 512.0, 2 * H),
    ("a fast link makes it pay", [1200], 500, Policy(zone_links={("eu", "us"): 10_000.0}),
     10.0, 1, True, 51.2, 1200.0),
    ("no hold ends: infinite wait, moves within the cap", [None], 500, Policy(), 1000.0, 1,
     True, 512.0, math.inf),
    ("overdue hold ends now: no wait to save", [-600], 500, Policy(), 1000.0, 1,
     ReasonCode.WAITING_FOR_CAPACITY, None, None),
    ("gang: the second node frees late, pays", [600, 5 * H], 500, Policy(), 1000.0, 2, True,
     512.0, 5 * H),
    ("gang: both nodes free soon, does not pay", [600, 700], 500, Policy(), 1000.0, 2, False,
     None, None),
    ("gang: one home node never frees", [600, None], 500, Policy(), 1000.0, 2, True, 512.0,
     math.inf),
]


@pytest.mark.parametrize(("holds", "size", "policy", "bandwidth", "nodes", "moves",
                          "transfer", "saved"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_cross_zone_move(holds, size, policy, bandwidth, nodes, moves, transfer,
                         saved) -> None:
    result = _plan(holds, size_gib=size, policy=policy, nodes=nodes, us_bandwidth=bandwidth)
    p = result.placement_of("x")
    if moves is not True:  # False: held for its zone; a code: waits for that reason
        assert p is None, p
        reason = result.reason_of("x")
        code = ReasonCode.DATA_ZONE if moves is False else moves
        assert reason is not None and reason.code is code, reason
        assert ("waits for its data's zone eu" in reason.message) is (moves is False)
        return
    assert p is not None, result.pending
    assert p.cross_zone
    assert {a.node[0] for a in p.assignments} == {"u"}
    assert p.transfer_seconds == pytest.approx(transfer)
    assert p.expected_wait_saved_s == pytest.approx(saved)
    assert p.expected_wait_saved_s >= p.transfer_seconds * (1 + policy.cross_zone_margin)
    assert p.note.startswith(f"moves {size:g} GiB from eu to us: ")


def test_note_and_refusal_sentences() -> None:
    moved = _plan([2.1 * H], size_gib=500).placement_of("x")
    assert moved is not None
    assert moved.note == "moves 500 GiB from eu to us: 9 min transfer, saves ~2.1 h of waiting"
    held = _plan([2400], size_gib=800, policy=Policy(max_transfer_seconds=20_000),
                 us_bandwidth=100.0).reason_of("x")
    assert held is not None
    assert held.message == ("waits for its data's zone eu: moving 800 GiB to us would take "
                            "2.3 h, saving only ~40 min (a move must save 1.5x its transfer "
                            "time)")
    never = _plan([None], size_gib=500).placement_of("x")
    assert never is not None
    assert never.note == ("moves 500 GiB from eu to us: 9 min transfer; no GPUs in eu free up "
                          "at a known time (its holds have no time limit)")


def test_over_the_cap_waits_even_for_an_infinite_wait() -> None:
    result = _plan([None], size_gib=500, us_bandwidth=100.0)  # 5120 s > 3600 s
    reason = result.reason_of("x")
    assert reason is not None and reason.code is ReasonCode.DATA_ZONE
    assert reason.message == ("waits for its data's zone eu: moving 500 GiB to us would take "
                              "1.4 h, over the 1 h limit on a transfer")


def test_home_fits_now_no_move() -> None:
    """h0 has 4 GPUs free: the request stays home even though us is free and holds elsewhere
    in eu never end."""
    result = _plan([None, None], size_gib=500, home_free=4)
    p = result.placement_of("x")
    assert p is not None and not p.cross_zone and p.assignments[0].node == "h0"
    assert p.expected_wait_saved_s == 0.0 and p.note == ""


def test_home_room_for_a_smaller_part_does_not_count() -> None:
    """h0 has 2 free GPUs, the request needs 4 on one node: home has no fit now."""
    result = _plan([None], size_gib=500, home_free=2)
    p = result.placement_of("x")
    assert p is not None and p.cross_zone and math.isinf(p.expected_wait_saved_s)


def test_holds_release_in_end_order_until_the_part_fits() -> None:
    """Two holds of 2 GPUs on h0, ending in 10 min and 3 h: a 4-GPU part fits after both,
    so the wait is 3 h (a 2-GPU part would wait 10 min and not move)."""
    node = make_node("h0", "A100", 4, zone="eu")
    allocations = [replace(make_allocation("a", node, (0, 1)), ends_by=NOW + timedelta(minutes=10)),
                   replace(make_allocation("b", node, (2, 3)), ends_by=NOW + timedelta(hours=3))]
    fleet = [node, make_node("u0", "A100", 4, zone="us")]
    for gpus, moves, saved in ((4, True, 3 * H), (2, False, 0.0)):
        req = make_request("x", gpus, data_zone="eu", size_gib=500)
        result = plan(make_snapshot(fleet, [req], allocations=allocations))
        p = result.placement_of("x")
        assert (p is not None) is moves
        if moves:
            assert p.expected_wait_saved_s == pytest.approx(saved)


def test_requests_without_a_data_zone_are_not_touched() -> None:
    nodes, allocations = _fleet([2400])
    req = make_request("x", 4)
    p = plan(make_snapshot(nodes, [req], allocations=allocations)).placement_of("x")
    assert p is not None and not p.cross_zone and p.note == "" and p.assignments[0].node == "u0"


def test_shares_wait_for_a_share_to_free() -> None:
    """A 0.5 share: h0's GPUs are each half held until 10 min or 2 h; the share fits now on
    a half-free GPU, so no move (W = 0)."""
    node = make_node("h0", "A100", 1, zone="eu")
    allocations = [replace(make_allocation("a", node, (0,), milli=500),
                           ends_by=NOW + timedelta(hours=2))]
    fleet = [node, make_node("u0", "A100", 1, zone="us")]
    req = make_request("x", 1, milli=500, data_zone="eu", size_gib=10)
    p = plan(make_snapshot(fleet, [req], allocations=allocations)).placement_of("x")
    assert p is not None and p.assignments[0].node == "h0"
    req = make_request("x", 1, milli=700, data_zone="eu", size_gib=10)
    p = plan(make_snapshot(fleet, [req], allocations=allocations)).placement_of("x")
    assert p is not None and p.assignments[0].node == "u0"
    assert p.expected_wait_saved_s == pytest.approx(2 * H)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), margin=st.sampled_from([0.0, 0.5, 2.0, 50.0]),
       link=st.sampled_from([None, 10.0, 1000.0, 100_000.0]))
def test_a_cross_zone_placement_always_saves_its_transfer_times_the_margin(
        seed: int, margin: float, link: float | None) -> None:
    rng = random.Random(seed)
    snap = random_snapshot(rng, nodes=rng.randint(2, 8), requests=rng.randint(1, 25),
                           extras=True)
    allocations = tuple(replace(a, ends_by=rng.choice(
        [None, NOW + timedelta(seconds=rng.randint(-600, 6 * 3600))]))
        for a in snap.allocations)
    links = {} if link is None else {("z1", "z2"): link, ("z2", "z1"): link / 3}
    policy = replace(snap.policy, cross_zone_margin=margin, zone_links=links)
    snap = replace(snap, allocations=allocations, policy=policy)
    result = plan(snap)
    check_plan(result, snap)
    nodes = {n.name: n for n in snap.nodes}
    requests = {r.name: r for r in snap.requests}
    for p in result.placements:
        r = requests[p.request_name]
        if not p.cross_zone:
            assert p.expected_wait_saved_s == 0.0 and p.transfer_seconds == 0.0
            continue
        assert r.dataset is not None and r.dataset.zone is not None
        home = r.dataset.zone
        # the transfer, recomputed: the link between the zones, else the node's bandwidth
        expect = max(r.dataset.size_gib * 1024 / links.get((home, nodes[a.node].zone),
                                                            nodes[a.node].bandwidth_mb_s)
                     for a in p.assignments if nodes[a.node].zone != home)
        assert p.transfer_seconds == pytest.approx(expect)
        assert p.transfer_seconds <= policy.max_transfer_seconds
        assert p.expected_wait_saved_s > 0
        assert p.expected_wait_saved_s >= p.transfer_seconds * (1 + margin)
        assert p.note.startswith("moves ") and f" from {home} to " in p.note


def test_the_queue_ahead_of_the_same_type_counts() -> None:
    """h0 has room for one 4-GPU part now, h1 frees in 5 h: of three like requests, the first
    stays home, the second waits 5 h at home or moves (it moves), the third would wait
    forever (no other hold ends) and moves too."""
    nodes, allocations = _fleet([None, 5 * H], home_free=4, us_nodes=2)
    reqs = [replace(make_request(f"x{i}", 4, data_zone="eu", size_gib=500),
                    submitted_at=NOW - timedelta(minutes=10 - i)) for i in range(3)]
    snap = make_snapshot(nodes, reqs, allocations=allocations)
    result = plan(snap)
    check_plan(result, snap)
    placed = {p.request_name: p for p in result.placements}
    assert placed["x0"].assignments[0].node == "h0" and not placed["x0"].cross_zone
    assert placed["x1"].cross_zone and placed["x1"].expected_wait_saved_s == pytest.approx(5 * H)
    assert placed["x2"].cross_zone and math.isinf(placed["x2"].expected_wait_saved_s)


def test_a_later_gang_waits_for_its_own_nodes() -> None:
    """Two 2-node gangs; home nodes free in 10 min, 20 min, 4 h and 5 h: the first gang
    waits 20 min (its second node), the second 5 h (the fourth). A 30-minute transfer
    (x 1.5 = 45 min) pays for the second only; the first is held for its zone although us
    has room for it."""
    nodes, allocations = _fleet([600, 1200, 4 * H, 5 * H], us_nodes=4,
                                us_bandwidth=1024 * 500 / 1800)
    gangs = [replace(make_request(f"g{i}", 4, nodes=2, data_zone="eu", size_gib=500),
                     submitted_at=NOW - timedelta(minutes=10 - i)) for i in range(2)]
    result = plan(make_snapshot(nodes, gangs, allocations=allocations))
    assert result.placement_of("g0") is None
    reason = result.reason_of("g0")
    assert reason is not None and reason.code is ReasonCode.DATA_ZONE
    assert "saving only ~20 min" in reason.message
    g1 = result.placement_of("g1")
    assert g1 is not None and g1.cross_zone
    assert g1.transfer_seconds == pytest.approx(1800)
    assert g1.expected_wait_saved_s == pytest.approx(5 * H)


def test_second_look_moves_a_request_whose_home_room_went_to_other_work() -> None:
    """h0 (A100) has room for a 4-GPU part now, so x is first kept home; but y, more urgent
    and A100-only with no data, takes h0. The second look sees eu full until h1 frees in
    5 h (or, when y's own time limit of 1 h frees h0 sooner, 1 h) and moves x to the H100
    node in us when that pays."""
    h0 = make_node("h0", "A100", 4, zone="eu")
    h1 = make_node("h1", "A100", 4, zone="eu")
    u0 = make_node("u0", "H100", 4, zone="us")
    held = replace(make_allocation("old", h1, (0, 1, 2, 3)), ends_by=NOW + timedelta(hours=5))
    x = make_request("x", 4, data_zone="eu", size_gib=500)
    for limit, saved in ((None, 5 * H), (timedelta(hours=1), H)):
        y = replace(make_request("y", 4, models=("A100",), priority=PriorityClass.HIGH),
                    time_limit=limit)
        snap = make_snapshot([h0, h1, u0], [x, y], allocations=[held])
        result = plan(snap)
        check_plan(result, snap)
        assert result.placement_of("y").assignments[0].node == "h0"
        px = result.placement_of("x")
        assert px is not None and px.assignments[0].node == "u0", result.pending
        assert px.expected_wait_saved_s == pytest.approx(saved)
        assert result.stats.objective >= result.stats.greedy_objective
