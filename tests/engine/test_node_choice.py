"""Node choice under FGD: the score decides clear differences, a fixed node order the rest."""

from __future__ import annotations

import numpy as np
import pytest
from engine_factories import NOW, make_node, make_request

from gpu_pool.engine import FleetState, greedy, plan_on_state
from gpu_pool.engine.fragmentation import TaskShape, WorkloadMix
from gpu_pool.engine.greedy import (
    FGD_CELLS,
    ORDER_POINTS,
    SIZE_POINTS,
    SOLE_HOST_SIZE,
    keep_whole,
    model_pressure,
    node_order,
    node_size,
    scarce_hosts,
)
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


def test_nodes_that_alone_hold_a_scarce_shape_are_filled_last(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 24 small nodes and one big one, named so that the big node comes first in the
    # scrambled order. The mix has a rare 8-GPU, 120-core shape only the big node can hold.
    # A 20-core CPU-only task blocks it there, and blocks a rare 50-core shape on a small
    # node: FGD scores both one point down (49), so the order decides, and without the
    # scarce tier it would put the task on the big node (as in the openb replay). The size
    # points would keep it off the big node too: off here, to see the tier alone.
    monkeypatch.setattr(greedy, "SIZE_POINTS", 0.0)
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


def _big_first(small: int, big_gpus: int, big_cpu: int) -> FleetState:
    """``small`` 2-GPU 32-core T4 nodes and one big T4 node named so that it comes first in
    the scrambled order."""
    nodes = [make_node(f"s{i}", "T4", 2, cpu=32_000) for i in range(small)]
    for i in range(10_000):
        state = FleetState.from_nodes([*nodes, make_node(f"big{i}", "T4", big_gpus,
                                                         cpu=big_cpu)])
        if np.argmin(node_order(state)) == small:
            return state
    raise AssertionError("no name puts the big node first")


def test_node_size_is_the_mean_of_gpu_and_cpu_shares_of_the_largest() -> None:
    state = _big_first(3, 8, 128_000)
    size = node_size(state.layout)
    assert size[-1] == 1.0
    assert size[:3].tolist() == [(2 / 8 + 32 / 128) / 2] * 3
    assert node_size(state.layout) is size  # kept with the layout


@pytest.mark.parametrize(("size_points", "expect_big"), [(SIZE_POINTS, False), (0.0, True)])
def test_of_nodes_fgd_rates_alike_the_smaller_takes_the_work(
        monkeypatch: pytest.MonkeyPatch, size_points: float, expect_big: bool) -> None:
    # As best-fit's does: a one-GPU task on the big node would leave it unable to take an
    # 8-GPU task for as long as it runs (the openb replay's hour-long waits). FGD sees both
    # alike (whole GPUs only), the scrambled order prefers the big node, the size the small.
    assert SIZE_POINTS > ORDER_POINTS
    monkeypatch.setattr(greedy, "SIZE_POINTS", size_points)
    state = _big_first(3, 8, 128_000)
    assert (_place(state, WHOLE) == state.layout.names[-1]) is expect_big


def test_a_clearly_better_fgd_score_beats_the_size() -> None:
    # The big node has a half-used card: a 500-milli share there fills a fragment (score
    # 62), on a small node it breaks a whole card (score 37), 25 points against the size's
    # few.
    state = _big_first(3, 8, 128_000)
    big = state.layout.names[-1]
    state.apply(Placement("x", (NodeAssignment(big, (0,), 500, 0, 0),)))
    assert SIZE_POINTS + ORDER_POINTS < 25
    assert _place(state, WHOLE, milli=500) == big


def test_the_one_node_that_can_hold_a_shape_is_kept_whole_before_the_biggest() -> None:
    # Three big A100 nodes and one small H100 node (same card memory: no right-size
    # difference); some tasks of the mix name H100. A task any model can run would go to
    # the small node for its size; it is the only one the H100 tasks can use (their sole
    # host), so it counts as twice the biggest and the task goes to an A100 node.
    nodes = [make_node(f"a{i}", "A100", 8, cpu=128_000) for i in range(3)]
    nodes.append(make_node("h", "H100", 2, cpu=32_000))
    state = FleetState.from_nodes(nodes)
    mix = WorkloadMix((TaskShape(1, 1000, 4_000),
                       TaskShape(1, 1000, 4_000, 0, frozenset({"H100"}))), (0.9, 0.1))
    assert node_size(state.layout)[-1] == (2 / 8 + 32 / 128) / 2
    assert keep_whole(state, mix).tolist() == [1.0] * 3 + [SOLE_HOST_SIZE]
    assert keep_whole(state).tolist() == node_size(state.layout).tolist()
    assert _place(state, mix) != "h"


def test_only_the_sole_host_of_a_shape_counts_as_the_largest() -> None:
    # Two small H100 nodes among 40 A100 nodes: rare (within SCARCE_HOSTS' 5%, last in
    # the order), but either can take the H100 tasks, so both keep their size.
    nodes = [make_node(f"a{i:02d}", "A100", 8, cpu=128_000) for i in range(40)]
    nodes += [make_node(f"h{i}", "H100", 2, cpu=32_000) for i in range(2)]
    state = FleetState.from_nodes(nodes)
    mix = WorkloadMix((TaskShape(1, 1000, 4_000),
                       TaskShape(1, 1000, 4_000, 0, frozenset({"H100"}))), (0.9, 0.1))
    assert scarce_hosts(state.layout, mix)[-2:].all()
    assert not scarce_hosts(state.layout, mix, 0.0).any()
    assert keep_whole(state, mix).tolist() == node_size(state.layout).tolist()


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


def _two_models() -> FleetState:
    # Two big A100 nodes and two small H100 nodes (same card memory: no right-size
    # difference), named so that the fixed order puts an H100 node first.
    nodes = [make_node("a1", "A100", 8), make_node("a2", "A100", 8),
             make_node("h1", "H100", 2, cpu=16_000), make_node("h2", "H100", 2, cpu=16_000)]
    state = FleetState.from_nodes(nodes)
    assert state.layout.names[int(np.argmin(node_order(state)))].startswith("h")
    return state


def test_model_pressure_is_the_named_share_of_demand_over_the_models_share_of_gpus() -> None:
    state = FleetState.from_nodes([make_node("a0", "A100", 8), make_node("a1", "A100", 8),
                                   make_node("a2", "A100", 8), make_node("h0", "H100", 8),
                                   make_node("h1", "H100", 8)])
    # Demand (weight x GPUs x milli): 500 for any model, 250 naming H100, 500 naming both,
    # split 24:16 by their GPUs. H100: (250 + 200) / 1250 over 16 / 40 = 0.9; A100: 300 /
    # 1250 over 24 / 40 = 0.4.
    mix = WorkloadMix((TaskShape(1, 1000), TaskShape(1, 1000, 0, 0, frozenset({"H100"})),
                       TaskShape(2, 1000, 0, 0, frozenset({"A100", "H100"}))),
                      (0.5, 0.25, 0.25))
    assert model_pressure(state, mix) == pytest.approx([0.4, 0.4, 0.4, 0.9, 0.9])
    # Capped at 1; nothing named: 0 everywhere; a model no node has is ignored.
    only = WorkloadMix((TaskShape(1, 1000, 0, 0, frozenset({"H100", "B200"})),), (1.0,))
    assert model_pressure(state, only).tolist() == [0.0] * 3 + [1.0] * 2
    assert model_pressure(state, WHOLE).tolist() == [0.0] * 5


def test_work_any_model_runs_leaves_a_named_models_cards_to_the_work_that_needs_them(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A fifth of the mix names H100, which has a fifth of the GPUs (pressure 1): a task any
    # model can run goes to an A100 node. Without the pressure it would take an H100 card:
    # those nodes are smaller and first in the fixed order, against FGD's four points for
    # the A100 node (there the H100 tasks could not have used the card anyway). A task
    # naming H100 still gets one.
    mix = WorkloadMix((TaskShape(1, 1000), TaskShape(1, 1000, 0, 0, frozenset({"H100"}))),
                      (0.8, 0.2))
    state = _two_models()
    assert model_pressure(state, mix).tolist() == pytest.approx([0, 0, 1, 1])
    assert _place(state, mix).startswith("a")
    plan = plan_on_state(state, [make_request("n", models=("H100",))], policy=Policy(),
                         now=NOW, workload_mix=mix)
    assert plan.placements[0].assignments[0].node.startswith("h")
    monkeypatch.setattr(greedy, "MODEL_POINTS", 0.0)
    assert _place(_two_models(), mix).startswith("h")


def _sole_host_fleet() -> tuple[FleetState, WorkloadMix]:
    # Two A100 nodes of 96 cores and one H100 node of 128, the only one an 8-GPU task asking
    # 120 cores fits. A few tasks name A100: the H100 node's cards are a fragment to them,
    # so FGD rates an 8-GPU task that drains a node's cards a few points better there.
    nodes = [make_node("a1", "A100", 8, cpu=96_000), make_node("a2", "A100", 8, cpu=96_000),
             make_node("h", "H100", 8, cpu=128_000)]
    mix = WorkloadMix((TaskShape(1, 1000, 4_000),
                       TaskShape(1, 1000, 4_000, 0, frozenset({"A100"})),
                       TaskShape(8, 1000, 120_000)), (0.87, 0.08, 0.05))
    return FleetState.from_nodes(nodes), mix


def test_the_sole_host_takes_work_others_hold_only_where_fgd_rates_it_clearly_better(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An 8-GPU task asking 88 cores, which every node holds, goes to an A100 node. Counted
    # as only the largest node (as before 2026-12-07) the H100 node took it, and the
    # 120-core tasks would have waited for its whole run.
    state, mix = _sole_host_fleet()
    assert scarce_hosts(state.layout, mix, 0.0).tolist() == [False, False, True]
    request = make_request("big", gpus=8, cpu=88_000)
    plan = plan_on_state(state, [request], policy=Policy(), now=NOW, workload_mix=mix)
    assert plan.placements[0].assignments[0].node.startswith("a")
    monkeypatch.setattr(greedy, "SOLE_HOST_SIZE", 1.0)
    state, mix = _sole_host_fleet()
    plan = plan_on_state(state, [request], policy=Policy(), now=NOW, workload_mix=mix)
    assert plan.placements[0].assignments[0].node == "h"
