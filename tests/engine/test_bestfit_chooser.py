"""The best-fit chooser of large cycles gives exactly the choices of :func:`fit`, and the
class model's disaggregation keeps a gang's parts to the solver's count per node group."""

from __future__ import annotations

import random

import pytest
from engine_factories import random_snapshot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_pool.engine import greedy as greedy_mod
from gpu_pool.engine import greedy_plan
from gpu_pool.engine.capacity import FleetState
from gpu_pool.engine.greedy import BestFitChooser, Cycle
from gpu_pool.model import PriorityClass


def _greedy(snap, chooser: bool, monkeypatch) -> object:
    """The greedy plan with best-fit node choice (no FGD measure, as in a large cycle),
    by the chooser or by :func:`fit`."""
    monkeypatch.setattr(greedy_mod, "FGD_DECISIONS", -1)
    monkeypatch.setattr(greedy_mod, "fgd_off", (lambda c: True) if chooser else (lambda c: False))
    return greedy_plan(snap)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 2**32 - 1), nodes=st.integers(1, 30), requests=st.integers(1, 80),
       max_gpus=st.sampled_from([2, 4, 8]))
def test_chooser_places_exactly_like_fit(seed, nodes, requests, max_gpus, monkeypatch) -> None:
    snap = random_snapshot(random.Random(seed), nodes=nodes, requests=requests,
                           max_gpus=max_gpus, extras=True)
    fast = _greedy(snap, True, monkeypatch)
    slow = _greedy(snap, False, monkeypatch)
    assert fast.placements == slow.placements
    assert fast.pending == slow.pending



def test_chooser_sees_commits_of_other_request_types(monkeypatch) -> None:
    """A row that a commit of one type tightens becomes the best fit of another type."""
    from engine_factories import make_node, make_request, make_snapshot

    nodes = [make_node("a", "A100", 4), make_node("b", "A100", 4)]
    reqs = [make_request("big", 2, priority=PriorityClass.HIGH),
            make_request("small", 1, priority=PriorityClass.NORMAL),
            make_request("share", 1, milli=500, priority=PriorityClass.LOW),
            make_request("share2", 1, milli=500, priority=PriorityClass.LOW)]
    snap = make_snapshot(nodes, reqs)
    fast = _greedy(snap, True, monkeypatch)
    where = {p.request_name: (p.assignments[0].node, p.assignments[0].gpu_indices)
             for p in fast.placements}
    # best-fit: everything consolidates on the node the first placement tightened
    assert where["big"][0] == where["small"][0] == where["share"][0]
    assert where["share"] == where["share2"]  # the second half-GPU fills the same card
    assert fast.placements == _greedy(snap, False, monkeypatch).placements


def test_run_greedy_with_chooser_matches_on_a_stateful_cycle() -> None:
    snap = random_snapshot(random.Random(11), nodes=12, requests=40, max_gpus=8, extras=True)
    from gpu_pool.engine.objective import aged_weight, build_view
    from gpu_pool.engine.quota import QuotaBook

    state = FleetState.from_snapshot(snap)
    book = QuotaBook.build(snap.quotas, snap.allocations, snap.policy, snap.now)
    reqs = [r for r in snap.requests if r.data_ready]
    weights = {r.name: aged_weight(r, snap.policy, snap.now) for r in reqs}
    views = {r.name: build_view(r, state.layout, snap.policy) for r in reqs}
    groups = {r.name: book.groups_by_row(r, state.layout.models) for r in reqs}
    ordered = greedy_mod.greedy_order(reqs, weights)
    cycle = Cycle(state.copy(), book.remaining(), snap.policy.critical_headroom_gpus, None)
    chooser = BestFitChooser(cycle)
    for r in ordered:
        a = chooser.fit(r, weights[r.name], views[r.name], groups[r.name])
        chooser.sync()  # the chooser commits on its lists; fit reads the state
        b = greedy_mod.fit(cycle, r, weights[r.name], views[r.name], groups[r.name])
        assert a == b, r.name
        if a is not None:
            chooser.commit(r, a)
    chooser.sync()
    after = FleetState.from_snapshot(snap)
    for p in run_greedy_placements(snap, ordered, weights, views, groups, book):
        after.apply(p)
    assert (after.gpu_free == cycle.state.gpu_free).all()
    assert (after.cpu_free == cycle.state.cpu_free).all()
    assert (after.whole_free == cycle.state.whole_free).all()


def run_greedy_placements(snap, ordered, weights, views, groups, book):
    """The placements of a plain (fit-based) greedy pass over ``ordered``."""
    state = FleetState.from_snapshot(snap)
    cycle = Cycle(state, book.remaining(), snap.policy.critical_headroom_gpus, None)
    out = []
    for r in ordered:
        c = greedy_mod.fit(cycle, r, weights[r.name], views[r.name], groups[r.name])
        if c is not None:
            out.append(cycle.commit(r, c))
    return out


def test_chooser_commit_refuses_an_over_allocation() -> None:
    from engine_factories import make_node, make_request, make_snapshot

    from gpu_pool.engine.greedy import Choice

    snap = make_snapshot([make_node("a", "A100", 2, cpu=4000)], [make_request("x", 1)])
    state = FleetState.from_snapshot(snap)
    cycle = Cycle(state, __import__("numpy").zeros(0, dtype=int), 0, None)
    chooser = BestFitChooser(cycle)
    r = make_request("x", 1, cpu=3000)
    chooser.commit(r, Choice((0,), ((0,),), (-1,), 1, False, 0.0))
    with pytest.raises(ValueError, match="CPU or RAM over-allocated"):
        chooser.commit(make_request("y", 1, cpu=3000), Choice((0,), ((1,),), (-1,), 1, False,
                                                              0.0))
    with pytest.raises(ValueError, match="out of range"):
        chooser.commit(make_request("z", 1), Choice((0,), ((0,),), (-1,), 1, False, 0.0))
    chooser.sync()
    assert state.gpu_free[0].tolist() == [0, 1000] and state.cpu_free[0] == 1000


def test_disaggregation_keeps_a_gang_to_the_solver_count_per_group() -> None:
    """The solver put one part of a 2x4 gang in each zone and an 8-GPU job on the free
    node of z1: the gang may not take both z1 nodes (its data is in z1, so without the
    per-group count it would), or the 8-GPU job no longer fits."""
    from engine_factories import make_allocation, make_node, make_request, make_snapshot

    from gpu_pool.engine.cpsat import disaggregate, node_groups
    from gpu_pool.engine.objective import aged_weight, build_view
    from gpu_pool.engine.quota import QuotaBook

    a1, a2 = make_node("a1", "A100", 8, zone="z1"), make_node("a2", "A100", 8, zone="z1")
    b1 = make_node("b1", "A100", 8, zone="z2")
    busy = make_allocation("old", a1, (0, 1, 2, 3))
    gang = make_request("gang", 4, nodes=2, data_zone="z1", size_gib=1.0)
    big = make_request("big", 8)
    snap = make_snapshot([a1, a2, b1], [gang, big], allocations=[busy])
    state = FleetState.from_snapshot(snap)
    book = QuotaBook.build(snap.quotas, snap.allocations, snap.policy, snap.now)
    reqs = [gang, big]
    weights = {r.name: aged_weight(r, snap.policy, snap.now) for r in reqs}
    views = {r.name: build_view(r, state.layout, snap.policy) for r in reqs}
    groups = {r.name: book.groups_by_row(r, state.layout.models) for r in reqs}
    cycle = Cycle(state, book.remaining(), 0, None)
    grp = node_groups(cycle)
    z1, z2 = (int(grp.group_of_row[state.layout.row_of[n]]) for n in ("a1", "b1"))
    type_list = [(("gang",), [gang]), (("big",), [big])]
    placements, _ = disaggregate(cycle, type_list, {0: [gang], 1: [big]},
                                 {(0, z1): 1, (0, z2): 1, (1, z1): 1}, grp, reqs, weights,
                                 views, groups)
    nodes = {p.request_name: sorted(a.node for a in p.assignments) for p in placements}
    assert nodes == {"gang": ["a1", "b1"], "big": ["a2"]}
