"""FleetState: free capacity derived from allocations; apply/release refuse over-allocation."""

from __future__ import annotations

import pytest
from engine_factories import make_allocation, make_node, make_snapshot

from gpu_pool.engine import FleetState
from gpu_pool.engine.types import NodeAssignment, Placement
from gpu_pool.model import NodeState


def test_from_snapshot_subtracts_allocations_and_skips_unhealthy() -> None:
    a = make_node("a", gpus=4, unhealthy=(3,))
    alloc = make_allocation("old", a, (0,), milli=300, cpu=1000, memory=10)
    state = FleetState.from_snapshot(make_snapshot([a], [], allocations=[alloc]))
    assert state.free_gpu_milli("a") == (700, 1000, 1000, 0)
    assert int(state.whole_free[0]) == 2
    assert int(state.cpu_free[0]) == 63_000 and int(state.mem_free[0]) == 512 * 1024 - 10


def test_apply_release_round_trip_and_refusal() -> None:
    state = FleetState.from_nodes([make_node("a", gpus=2), make_node("b", gpus=2)])
    p = Placement("r", (NodeAssignment("a", (1,), 600, 1000, 100),))
    state.apply(p)
    assert state.free_gpu_milli("a") == (1000, 400)
    with pytest.raises(ValueError):
        state.apply(Placement("q", (NodeAssignment("a", (1,), 600, 0, 0),)))
    assert state.free_gpu_milli("a") == (1000, 400)  # a refused update changes nothing
    with pytest.raises(ValueError):
        state.apply([NodeAssignment("b", (0,), 1000, 10**9, 0)])
    assert state.free_gpu_milli("b") == (1000, 1000)
    state.release(p.assignments)
    assert state.free_gpu_milli("a") == (1000, 1000)
    assert int(state.cpu_free[0]) == 64_000


def test_copy_is_independent_and_down_nodes_are_not_schedulable() -> None:
    state = FleetState.from_nodes([make_node("a", gpus=2, state=NodeState.DOWN),
                                   make_node("b", gpus=2)])
    twin = state.copy()
    twin.apply([NodeAssignment("b", (0, 1), 1000, 0, 0)])
    assert state.free_gpu_milli("b") == (1000, 1000)
    assert state.whole_free_up() == 2 and twin.whole_free_up() == 0
