"""The greedy order within equal weight: larger whole-GPU requests first, GPU shares by age;
of the other orders a small cycle tries, larger-first wins only by placing more."""

from __future__ import annotations

from datetime import timedelta

from engine_checks import check_plan
from engine_factories import make_allocation, make_node, make_request, make_snapshot

from gpu_pool.engine import greedy_plan
from gpu_pool.engine.greedy import greedy_order, other_greedy_orders
from gpu_pool.engine.objective import aged_weights


def test_whole_gpus_largest_first_then_shares_and_cpu_by_age() -> None:
    reqs = [make_request("share-new-big", milli=750, waited=timedelta(minutes=5)),
            make_request("one-gpu", 1, waited=timedelta(hours=3)),
            make_request("share-old-small", milli=250, waited=timedelta(hours=2)),
            make_request("cpu-only", 0, milli=0, cpu=4000, waited=timedelta(hours=1)),
            make_request("two-gpus", 2, waited=timedelta(minutes=1))]
    weights = {r.name: 100 for r in reqs}
    assert [r.name for r in greedy_order(reqs, weights)] == [
        "two-gpus", "one-gpu", "share-old-small", "cpu-only", "share-new-big"]
    orders = other_greedy_orders(reqs, weights)
    # oldest first, smallest first (may win on fragmentation), larger first (only on value)
    assert [flag for _, flag in orders] == [True, True, False]
    assert [r.name for r in orders[2][0]][:2] == ["two-gpus", "one-gpu"]
    assert [r.name for r in orders[2][0]][2] == "share-new-big"


def test_shares_keep_their_age_order_when_larger_first_only_fragments_less() -> None:
    # One node, GPU 0 has 750 milli free. The older quarter takes the tightest card that
    # holds it (GPU 0), the newer three quarters GPU 1. Larger first (the three quarters on
    # GPU 0, the quarter on GPU 1) places the same and leaves the cards less fragmented by
    # FGD's measure, but that alone no longer wins: over whole runs it packed worse
    # (greedy_order's docstring).
    node = make_node("a", gpus=2)
    used = make_allocation("old", node, (0,), milli=250)
    reqs = [make_request("quarter", milli=250, waited=timedelta(seconds=30)),
            make_request("three-quarters", milli=750, waited=timedelta(seconds=10))]
    snap = make_snapshot([node], reqs, allocations=[used])
    weights = aged_weights(reqs, snap.policy, snap.now)
    assert weights["quarter"] == weights["three-quarters"]  # age orders them, not weight
    result = greedy_plan(snap)
    check_plan(result, snap)
    assert result.placement_of("quarter").assignments[0].gpu_indices == (0,)
    assert result.placement_of("three-quarters").assignments[0].gpu_indices == (1,)
