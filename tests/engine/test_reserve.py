"""The starvation guard (gpu_pool.engine.reserve): starving requests go first or hold nodes."""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta

import numpy as np
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

from gpu_pool.engine import FleetState, plan, plan_on_state
from gpu_pool.engine.types import NodeAssignment, ReasonCode
from gpu_pool.errors import SpecError
from gpu_pool.model import Policy, PriorityClass

OFF = Policy(max_reservations=0)
TICK = timedelta(minutes=10)


def _same(a, b) -> None:
    """Equal plans, but for the wall-clock time."""
    assert a.placements == b.placements
    assert a.pending == b.pending
    assert a.preemptions == b.preemptions
    assert a.reservations == b.reservations
    assert dataclasses.replace(a.stats, wall_seconds=0) == dataclasses.replace(
        b.stats, wall_seconds=0)


def _stream(policy: Policy, cycles: int = 40) -> dict[str, int]:
    """One 8-GPU node, eight 1-GPU jobs of 80 min ending one per 10-min cycle and a new
    1-GPU job arriving every cycle, plus one 8-GPU request from the start: the cycle at
    which each request started (plans applied to a kept state, finished work released)."""
    node = make_node("a", "A100", 8)
    state = FleetState.from_nodes([node])
    running: list[tuple[int, tuple[NodeAssignment, ...]]] = []
    for i in range(8):  # running at cycle 0, ending at cycles 1..8
        part = NodeAssignment("a", (i,), 1000, 0, 0)
        state.apply([part])
        running.append((i + 1, (part,)))
    pending = [make_request("big", 8)]
    started: dict[str, int] = {}
    for c in range(cycles):
        now = NOW + c * TICK
        for _end, parts in [x for x in running if x[0] <= c]:
            state.release(parts)
        running = [x for x in running if x[0] > c]
        pending.append(dataclasses.replace(make_request(f"s{c}", 1), submitted_at=now))
        snapshot_state = (state.gpu_free.copy(), state.up.copy())
        p = plan_on_state(state, pending, policy=policy, now=now)
        assert np.array_equal(state.gpu_free, snapshot_state[0])
        assert np.array_equal(state.up, snapshot_state[1])
        for placement in p.placements:
            state.apply(placement)
            running.append((c + 8, placement.assignments))
            started[placement.request_name] = c
        pending = [r for r in pending if r.name not in started]
    return started


def test_big_request_starves_without_the_rule_and_starts_with_it():
    without = _stream(OFF)
    assert "big" not in without  # every GPU freed went to the next 1-GPU job, 40 cycles long
    with_rule = _stream(Policy(reserve_after=timedelta(hours=1)))
    # Reserved from cycle 6 (1 h); the last 1-GPU job placed before it ends at cycle 13.
    assert with_rule["big"] == 13
    # The small jobs wait while the node drains, then start again, eight at a time.
    assert sorted(c for c in with_rule.values() if c > 13) == [21] * 8 + [29] * 8 + [37] * 8


def _big_behind_one_busy_gpu(waited: timedelta):
    """An 8-GPU node with one GPU busy, an 8-GPU request that has waited ``waited`` and a
    fresh 1-GPU one."""
    node = make_node("a", "A100", 8)
    busy = make_allocation("old", node, (0,))
    big = make_request("big", 8, waited=waited)
    small = make_request("small", 1)
    return make_snapshot([node], [big, small], allocations=[busy])


def test_no_reservation_before_reserve_after():
    snap = _big_behind_one_busy_gpu(timedelta(minutes=59))
    p = plan(snap)
    assert p.reservations == ()
    assert [x.request_name for x in p.placements] == ["small"]
    _same(p, plan(dataclasses.replace(snap, policy=OFF)))


def test_starving_request_holds_the_node_and_others_are_told():
    snap = _big_behind_one_busy_gpu(timedelta(hours=3))
    big = snap.requests[0]
    p = plan(snap)
    assert p.placements == ()
    (held,) = p.reservations
    assert held.request_name == "big" and held.nodes == ("a",)
    assert held.since == big.submitted_at + Policy().reserve_after
    mine = p.reason_of("big")
    assert mine.code is ReasonCode.WAITING_FOR_CAPACITY
    assert mine.message.startswith("needs 8 any-model GPUs on one node; largest free block is 7")
    assert "a reserved for it since 2026-12-01 10:00 UTC (pending over 1 h)" in mine.message
    assert mine.message.endswith("no start can be promised: work there has no time limit; "
                                 "nothing else starts there until it does")
    other = p.reason_of("small")
    assert other.code is ReasonCode.NODE_RESERVED
    assert other.message == ("fits only on a, reserved for big (pending over 1 h: starving "
                             "requests go first); nothing else starts there until it does")


def test_reservation_closes_the_node_to_critical_work_too():
    a, b = make_node("a", "A100", 8), make_node("b", "A100", 8)
    busy = [make_allocation("old-a", a, (0,)), *[make_allocation(f"old-b{i}", b, (i,))
                                                  for i in range(4)]]
    big = make_request("big", 8, waited=timedelta(hours=2))
    urgent = make_request("urgent", 4, priority=PriorityClass.CRITICAL)
    p = plan(make_snapshot([a, b], [big, urgent], allocations=busy))
    assert p.reservations[0].nodes == ("a",)  # 1 GPU short, against 4 on b
    (placed,) = p.placements
    assert placed.request_name == "urgent" and placed.assignments[0].node == "b"


def test_fits_now_is_placed_first():
    node = make_node("a", "A100", 8)
    big = make_request("big", 8, waited=timedelta(hours=2))
    hot = make_request("hot", 2, priority=PriorityClass.HIGH)
    snap = make_snapshot([node], [big, hot])
    # Without the rule the high-priority request takes two GPUs and the big one waits.
    assert [x.request_name for x in plan(dataclasses.replace(snap, policy=OFF)).placements] \
        == ["hot"]
    p = plan(snap)
    assert [x.request_name for x in p.placements] == ["big"]
    assert p.reservations == ()
    assert p.reason_of("hot").code is ReasonCode.WAITING_FOR_CAPACITY  # big holds all 8
    assert p.reason_of("hot").message.endswith("largest free block is 0")
    check_plan(p, snap)
    assert p.stats.objective > 0


def test_gang_reserves_its_k_closest_nodes():
    nodes = [make_node(n, "A100", 4) for n in "abc"]
    busy = [make_allocation("old-a", nodes[0], (0, 1)), make_allocation("old-b", nodes[1], (0,)),
            make_allocation("old-c", nodes[2], (0, 1, 2))]
    gang = make_request("gang", 4, nodes=2, waited=timedelta(hours=2))
    smalls = [make_request("s0", 1), make_request("s1", 2), make_request("s2", 1)]
    snap = make_snapshot(nodes, [gang, *smalls], allocations=busy)
    p = plan(snap)
    (held,) = p.reservations
    assert held.request_name == "gang" and sorted(held.nodes) == ["a", "b"]
    assert [(x.request_name, x.assignments[0].node) for x in p.placements] == [("s0", "c")]
    assert p.reason_of("gang").code is ReasonCode.WAITING_FOR_CAPACITY
    assert "needs 2 nodes each with 4 free GPUs" in p.reason_of("gang").message
    assert p.reason_of("s1").code is ReasonCode.NODE_RESERVED  # 2 GPUs: only on a or b
    # c's last GPU went to s0: what s2 could still take is b's, which the gang holds.
    assert p.reason_of("s2").code is ReasonCode.NODE_RESERVED
    assert p.reason_of("s2").message.startswith("fits only on b, reserved for gang")
    check_plan(p, snap)


def test_max_reservations_and_distinct_rows():
    nodes = [make_node(n, "A100", 8) for n in "abc"]
    busy = [make_allocation(f"old-{n.name}", n, (0,)) for n in nodes]
    bigs = [make_request(f"big{i}", 8, waited=timedelta(hours=2 + i)) for i in range(3)]
    snap = make_snapshot(nodes, bigs, allocations=busy,
                         policy=Policy(max_reservations=2))
    p = plan(snap)
    assert [x.request_name for x in p.reservations] == ["big2", "big1"]  # oldest first
    held = [n for x in p.reservations for n in x.nodes]
    assert len(held) == len(set(held)) == 2


@pytest.mark.parametrize(("field", "value"), [
    ("reserve_after", timedelta(seconds=-1)), ("reserve_after", 3600),
    ("max_reservations", -1), ("max_reservations", 1.5), ("max_reservations", True)])
def test_knob_validation(field, value):
    with pytest.raises(SpecError) as err:
        Policy(**{field: value})
    assert err.value.field == field
    assert f"{field}: got {value!r}; expected" in str(err.value)


def test_zero_turns_the_rule_off():
    assert not Policy(reserve_after=timedelta(0)).reserves
    assert not Policy(max_reservations=0).reserves
    assert Policy().reserves


@pytest.mark.parametrize("seed", range(25))
def test_starving_snapshots_keep_every_rule_and_leave_the_caller_state(seed):
    rng = random.Random(seed)
    snap = random_snapshot(rng, nodes=4, requests=8, extras=seed % 2 == 1)
    waits = [timedelta(hours=rng.choice([0, 0.5, 2, 5])) for _ in snap.requests]
    reqs = tuple(dataclasses.replace(r, submitted_at=NOW - w)
                 for r, w in zip(snap.requests, waits, strict=True))
    snap = dataclasses.replace(snap, requests=reqs,
                               policy=dataclasses.replace(snap.policy, max_reservations=2))
    state = FleetState.from_snapshot(snap)
    before = [a.copy() for a in (state.gpu_free, state.cpu_free, state.mem_free, state.up,
                                 state.whole_free)]
    p = plan_on_state(state, snap.requests, quotas=snap.quotas,
                      allocations_usage=snap.allocations, policy=snap.policy, now=snap.now)
    after = (state.gpu_free, state.cpu_free, state.mem_free, state.up, state.whole_free)
    assert all(np.array_equal(x, y) for x, y in zip(before, after, strict=True))
    check_plan(p, snap)
    # Reserved nodes get nothing but starving requests placed ahead of the reservation.
    reserved = {n for x in p.reservations for n in x.nodes}
    starving = {r.name for r, w in zip(reqs, waits, strict=True) if w >= timedelta(hours=1)}
    assert not reserved & {a.node for x in p.placements if x.request_name not in starving
                           for a in x.assignments}
    # Nobody starving: exactly the plan without the rule.
    fresh = dataclasses.replace(snap, requests=tuple(
        dataclasses.replace(r, submitted_at=NOW) for r in snap.requests))
    _same(plan(fresh), plan(dataclasses.replace(fresh, policy=dataclasses.replace(
        fresh.policy, max_reservations=0))))


def test_large_cycle_keeps_the_reserved_node_closed():
    # Over FGD_DECISIONS requests: the best-fit chooser and fit masks plan this cycle.
    nodes = [make_node(n, "A100", 8) for n in "abc"]
    busy = [make_allocation("old-a", nodes[0], (0,)),
            *[make_allocation(f"old-{n.name}", n, (0, 1)) for n in nodes[1:]]]
    big = make_request("big", 8, waited=timedelta(hours=2))
    smalls = [make_request(f"s{i:03d}", 1) for i in range(250)]
    snap = make_snapshot(nodes, [big, *smalls], allocations=busy)
    p = plan(snap)
    assert p.reservations[0].nodes == ("a",)
    assert len(p.placements) == 12  # the free GPUs of b and c, none of a's 7
    assert all(x.assignments[0].node in {"b", "c"} for x in p.placements)
    check_plan(p, snap)
    fresh = dataclasses.replace(snap, requests=(dataclasses.replace(big, submitted_at=NOW),
                                                *smalls))
    _same(plan(fresh), plan(dataclasses.replace(fresh, policy=OFF)))


def test_one_starving_request_is_served_per_cycle_by_default():
    """Two starving 1-GPU requests and a fresh high-priority 3-GPU one on a 4-GPU node:
    serving only the most urgent starving request leaves room for the high one; serving
    both (max_reservations=2) forces them in ahead of it and it waits."""
    node = make_node("a", "A100", 4)
    reqs = [make_request("old1", 1, waited=timedelta(hours=3)),
            make_request("old2", 1, waited=timedelta(hours=2)),
            make_request("hot", 3, priority=PriorityClass.HIGH)]
    one = plan(make_snapshot([node], reqs))
    assert sorted(x.request_name for x in one.placements) == ["hot", "old1"]
    two = plan(make_snapshot([node], reqs, policy=Policy(max_reservations=2)))
    assert sorted(x.request_name for x in two.placements) == ["old1", "old2"]
    assert two.reason_of("hot").code is not None
