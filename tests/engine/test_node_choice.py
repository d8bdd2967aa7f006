"""Node choice under FGD: the score decides clear differences, a fixed node order the rest."""

from __future__ import annotations

import numpy as np
import pytest
from engine_factories import NOW, make_node, make_request

from gpu_pool.engine import FleetState, plan_on_state
from gpu_pool.engine.fragmentation import TaskShape, WorkloadMix
from gpu_pool.engine.greedy import FGD_CELLS, ORDER_POINTS, node_order
from gpu_pool.engine.types import NodeAssignment, Placement
from gpu_pool.model import Policy

WHOLE = WorkloadMix((TaskShape(1, 1000),), (1.0,))


def _place(state: FleetState, mix: WorkloadMix, milli: int = 1000) -> str:
    plan = plan_on_state(state, [make_request("r", milli=milli)], policy=Policy(), now=NOW,
                         workload_mix=mix)
    (p,) = plan.placements
    return p.assignments[0].node


def test_equal_scores_go_to_the_first_node_of_the_fixed_order() -> None:
    nodes = [make_node(f"n{i}", "T4", 4) for i in range(6)]
    state = FleetState.from_nodes(nodes)
    rank = node_order(state)
    assert ((rank >= 0) & (rank < 1)).all()
    expected = nodes[int(np.argmin(rank))].name
    assert _place(state, WHOLE) == expected
    # The order is a property of the names, not of the list order.
    again = FleetState.from_nodes(list(reversed(nodes)))
    assert _place(again, WHOLE) == expected


def test_a_clearly_better_fgd_score_beats_the_order() -> None:
    # One card each; the node later in the order has its card half used. For a mix of whole
    # GPUs that half is a fragment already: a 500-milli share there lowers fragmentation by
    # 500 (score 62), on the other node it breaks a whole card (+500, score 37).
    a, b = make_node("a", "T4", 1), make_node("b", "T4", 1)
    state = FleetState.from_nodes([a, b])
    rank = node_order(state)
    later = [a, b][int(np.argmax(rank))]
    state.apply(Placement("x", (NodeAssignment(later.name, (0,), 500, 0, 0),)))
    assert ORDER_POINTS < 100
    assert _place(state, WHOLE, milli=500) == later.name


def test_nodes_that_alone_hold_a_scarce_shape_are_filled_last() -> None:
    # 24 small nodes and one big one, named so that the big node comes first in the
    # scrambled order. The mix has a rare 8-GPU, 120-core shape only the big node can hold.
    # A 20-core CPU-only task blocks it there, and blocks a rare 50-core shape on a small
    # node: FGD scores both one point down (49), so the order decides, and without the
    # scarce tier it would put the task on the big node (as in the openb replay).
    small = [make_node(f"s{i}", "T4", 4, cpu=64_000) for i in range(24)]
    for i in range(10_000):
        state = FleetState.from_nodes([*small, make_node(f"big{i}", "T4", 8, cpu=128_000)])
        crc_rank = node_order(state)
        if np.argmin(crc_rank) == len(small):
            break
    big = state.layout.names[-1]
    mix = WorkloadMix((TaskShape(1, 1000, 4_000), TaskShape(0, 0, 20_000),
                       TaskShape(1, 1000, 50_000), TaskShape(8, 1000, 120_000)),
                      (0.8985, 0.1, 0.0005, 0.001))
    tiered = node_order(state, mix)
    assert tiered[-1] == tiered.max()  # the big node is last ...
    small_rows = np.arange(len(small))
    # ... and the others keep their scrambled order among themselves.
    assert (np.argsort(tiered[small_rows]) == np.argsort(crc_rank[small_rows])).all()
    task = make_request("cpu", gpus=0, cpu=20_000)
    plan = plan_on_state(state, [task], policy=Policy(), now=NOW, workload_mix=mix)
    assert plan.placements[0].assignments[0].node != big
    # Without the scarce shape in the mix the scrambled order stands: the big node first.
    plain = WorkloadMix(mix.shapes[:3], (0.899, 0.1, 0.001))
    assert (np.argsort(node_order(state, plain)) == np.argsort(crc_rank)).all()
    plan = plan_on_state(state, [task], policy=Policy(), now=NOW, workload_mix=plain)
    assert plan.placements[0].assignments[0].node == big


def test_a_long_lived_state_keeps_its_fgd_measure_for_a_mix_beyond_one_decisions_cells(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 1,000 nodes x 501 shapes exceed the cells one decision may score (FGD_CELLS); trace
    # mixes where a third of GPU requests name a model have 520 shapes over 1,213 nodes.
    # A request naming a scarce model scores few candidates, so the measure is used every
    # cycle: it must be built once on the caller's state, not once per cycle.
    from gpu_pool.engine import fragmentation

    nodes = [make_node(f"t{i:04d}", "T4", 4) for i in range(999)] + [make_node("v", "V100", 4)]
    shapes = tuple(TaskShape(1, 1 + k % 1000, 1000 * (k // 1000)) for k in range(501))
    assert len(nodes) * len(shapes) > FGD_CELLS >= len(shapes)
    mix = WorkloadMix(shapes, (1 / len(shapes),) * len(shapes))
    built: list[int] = []
    original = fragmentation.FleetFragmentation.__init__

    def counting(self, *args, **kwargs) -> None:
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(fragmentation.FleetFragmentation, "__init__", counting)
    state = FleetState.from_nodes(nodes)
    for k in range(3):
        request = make_request(f"r{k}", milli=500, models=("V100",))
        plan = plan_on_state(state, [request], policy=Policy(), now=NOW, workload_mix=mix)
        (p,) = plan.placements
        assert p.assignments[0].node == "v"
        state.apply(p)
    assert len(built) == 1
