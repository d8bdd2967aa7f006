"""FleetState: free capacity derived from allocations; apply/release refuse over-allocation;
fit masks stay equal to their definition."""

from __future__ import annotations

import random

import numpy as np
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


def test_fit_masks_follow_every_update() -> None:
    def expected(st: FleetState, gpus: int, milli: int, cpu: int, mem: int) -> np.ndarray:
        ok = st.up & (st.cpu_free >= cpu) & (st.mem_free >= mem)
        if gpus and milli < 1000:
            return ok & (st.gpu_free >= milli).any(axis=1)
        return ok & (st.whole_free >= gpus) if gpus else ok

    rng = random.Random(3)
    nodes = [make_node(f"n{i}", gpus=rng.choice((1, 2, 4, 8)), cpu=32_000,
                       unhealthy=(0,) if i % 5 == 0 else ()) for i in range(12)]
    state = FleetState.from_nodes(nodes)
    shapes = [(0, 0, 4000, 0), (1, 250, 0, 0), (1, 500, 8000, 64), (2, 1000, 0, 0),
              (4, 1000, 16_000, 0), (8, 1000, 0, 0)]
    taken: list[NodeAssignment] = []
    for step in range(300):
        gpus, milli, cpu, mem = shapes[step % len(shapes)]
        assert (state.fits(gpus, milli, cpu, mem) == expected(state, gpus, milli, cpu, mem)).all()
        node = rng.choice(nodes)
        roll = rng.random()
        if roll < 0.1:
            state.set_schedulable(node.name, rng.random() < 0.7)
        elif roll < 0.3 and taken:
            state.release([taken.pop(rng.randrange(len(taken)))])
        elif roll < 0.35:
            state = state.copy()  # the copy carries the masks and keeps them up to date
        else:
            part = NodeAssignment(node.name, (rng.randrange(node.gpu_count),),
                                  rng.choice((250, 500, 1000)), rng.choice((0, 4000)), 0)
            try:
                state.apply([part])
                taken.append(part)
            except ValueError:
                pass
    for shape in shapes:
        assert (state.fits(*shape) == expected(state, *shape)).all()
