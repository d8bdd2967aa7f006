"""Node choice under FGD: the score decides clear differences, a fixed node order the rest."""

from __future__ import annotations

import numpy as np
from engine_factories import NOW, make_node, make_request

from gpu_pool.engine import FleetState, plan_on_state
from gpu_pool.engine.fragmentation import TaskShape, WorkloadMix
from gpu_pool.engine.greedy import ORDER_POINTS, node_order
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
