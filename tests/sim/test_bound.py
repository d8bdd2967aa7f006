"""The packing benchmark's LP bound (gpu_pool.sim.bound): known answers on hand-made fleets,
what it counts as arrived, and that no policy ever allocates more than it on the trace excerpt."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_pool.sim.bound import (
    allocation_bound,
    arrived_at,
    card_patterns,
    unallocated_bound_pct,
)
from gpu_pool.sim.packing import HEADLINE_LEVEL, allocation_at
from gpu_pool.sim.runner import POLICIES, run_policy
from gpu_pool.sim.trace import TraceNode, TraceTask, load_trace

DATA = Path(__file__).resolve().parents[1] / "data"


def node(gpus: int, model: str = "G2", cpu: int = 96_000, mem: int = 393_216) -> TraceNode:
    return TraceNode(f"n{gpus}{model}{cpu}", cpu, mem, gpus, model)


def task(gpus: int = 1, milli: int = 1000, cpu: int = 1000, mem: int = 1024,
         spec: frozenset[str] = frozenset()) -> TraceTask:
    return TraceTask("t", cpu, mem, gpus, milli if gpus else 0, spec)


@pytest.mark.parametrize(("nodes", "tasks", "expected"), [
    # Room for everything: the bound is the demand.
    ([node(8)], [task(4), task(2), task(1, 500)], 6_500),
    # GPUs bind: 8 GPUs, 10 asked.
    ([node(8)], [task(8), task(2)], 8_000),
    # CPU binds: 96 cores, each 1-GPU task asks 48, so two of the eight GPUs can be used.
    ([node(8)], [task(1, cpu=48_000)] * 4, 2_000),
    # Memory binds the same way.
    ([node(8, mem=100)], [task(1, mem=50)] * 3, 2_000),
    # A task naming a model only goes where that model is: the V100 tasks fit 2 GPUs.
    ([node(8, "G2"), node(2, "V100M32")], [task(1, spec=frozenset({"V100M32"}))] * 5, 2_000),
    # A task bigger than every node is never counted (an 8-GPU task on 4-GPU nodes).
    ([node(4), node(4)], [task(8)], 0),
    # CPU-only tasks add nothing: a placer may skip them in the bound.
    ([node(2, cpu=1_000)], [task(0, cpu=1_000), task(1, cpu=1_000)], 1_000),
])
def test_known_bounds(nodes, tasks, expected) -> None:
    assert allocation_bound(tasks, nodes) == expected


@pytest.mark.parametrize(("nodes", "tasks", "cards", "pooled"), [
    # Three 810-milli shares on two cards: one each, the slivers stay free (the pooled
    # bound counted 2,000 of the 2,430 asked).
    ([node(2)], [task(1, 810)] * 3, 1_620, 2_000),
    # A 190 fills an 810's sliver: one card holds both.
    ([node(1)], [task(1, 810), task(1, 190)], 1_000, 1_000),
    # Two 600s and a 500 on two cards: any two of them, 1,200 placed; the LP may use half a
    # card of two 500s beside one and a half 600s (1,400): a relaxation, not a plan.
    ([node(2)], [task(1, 600)] * 2 + [task(1, 500)], 1_400, 1_700),
    # A whole GPU takes a card the shares cannot use: one card left for the 700s.
    ([node(2)], [task(1), task(1, 700), task(1, 700)], 1_700, 2_000),
    # Two groups: each card is of its own group, CPU still pooled per group.
    ([node(1), node(1, "V100M32")], [task(1, 700)] * 3, 1_400, 2_000),
])
def test_shares_are_packed_into_cards(nodes, tasks, cards, pooled) -> None:
    assert allocation_bound(tasks, nodes) == cards
    assert allocation_bound(tasks, nodes, cards=False) == pooled


def test_card_patterns_are_the_maximal_multisets() -> None:
    patterns = card_patterns([600, 400, 300])
    as_sets = sorted(tuple(sorted(p.items())) for p in patterns)
    # 600+300 (100 left: nothing fits), 400+300+300, 300+300+300, 600+400, 400+400 (200
    # left); 600 alone or 400+300 are not maximal (a 300 still fits).
    assert as_sets == [((300, 1), (600, 1)), ((300, 2), (400, 1)), ((300, 3),),
                       ((400, 1), (600, 1)), ((400, 2),)]
    with pytest.raises(ValueError, match="1..999 milli"):
        card_patterns([1000])
    # Many small sizes: too many patterns to enumerate, and the bound pools instead.
    assert card_patterns(list(range(10, 1000, 10)), limit=1_000) is None
    tasks = [task(1, m) for m in range(10, 1000, 10)]
    assert allocation_bound(tasks, [node(8)]) == allocation_bound(tasks, [node(8)], cards=False)


def test_arrived_counts_up_to_the_task_that_reaches_the_level() -> None:
    tasks = [task(1)] * 5  # 1,000 milli each
    assert len(arrived_at(tasks, 2_500, 1.0)) == 3  # 3,000 is the first total >= 2,500
    assert len(arrived_at(tasks, 3_000, 1.0)) == 3
    assert len(arrived_at(tasks, 100_000, 1.0)) == 5


def test_no_policy_allocates_more_than_the_bound_on_the_excerpt() -> None:
    trace = load_trace(DATA / "openb_nodes_excerpt.csv", DATA / "openb_pods_excerpt.csv")
    capacity = trace.total_gpus * 1000
    for policy in POLICIES:
        for run in run_policy(trace, policy, (1, 2)):
            arrivals = [a.task for a in run.arrivals]
            bound = unallocated_bound_pct(arrivals, trace.nodes, HEADLINE_LEVEL)
            reached = 100 * (1 - allocation_at(run, HEADLINE_LEVEL))
            assert bound <= reached + 1e-9, (policy, run.seed)
            arrived = arrived_at(arrivals, capacity, HEADLINE_LEVEL)
            placed = sum(a.task.total_gpu_milli for a in run.arrivals[:len(arrived)] if a.node)
            assert placed <= allocation_bound(arrived, trace.nodes)
