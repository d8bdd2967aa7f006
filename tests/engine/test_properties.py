"""Properties every plan keeps, on random snapshots with every rule switched on; purity."""

from __future__ import annotations

import copy
import random

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

from gpu_pool.engine import FleetState, plan, plan_on_state
from gpu_pool.model import Policy


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), nodes=st.integers(1, 10), requests=st.integers(1, 40),
       max_gpus=st.sampled_from([2, 4, 8]))
def test_no_plan_breaks_a_rule(seed: int, nodes: int, requests: int, max_gpus: int) -> None:
    snap = random_snapshot(random.Random(seed), nodes=nodes, requests=requests,
                           max_gpus=max_gpus, extras=True)
    result = plan(snap)
    check_plan(result, snap)  # capacity, gangs, models, quotas, down nodes, data, headroom
    assert result.stats.objective >= result.stats.greedy_objective
    if result.stats.upper_bound is not None:
        assert result.stats.upper_bound >= result.stats.objective


def test_check_plan_catches_a_broken_plan() -> None:
    """The property above can fail: a hand-broken plan is refused by the same checker."""
    import dataclasses

    import pytest

    from gpu_pool.engine.types import NodeAssignment, Placement

    snap = make_snapshot([make_node("a", "A100", 2)], [make_request("x", 2), make_request("y", 1)])
    good = plan(snap)
    bad = dataclasses.replace(good, placements=good.placements + (
        Placement("y", (NodeAssignment("a", (0,), 1000, 0, 0),)),), pending=())
    with pytest.raises(AssertionError):
        check_plan(bad, snap)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_plan_is_pure_and_deterministic(seed: int) -> None:
    snap = random_snapshot(random.Random(seed), nodes=6, requests=25, extras=True)
    before = copy.deepcopy(snap)
    first, second = plan(snap), plan(snap)
    assert snap == before
    assert first.placements == second.placements and first.pending == second.pending
    assert first.stats.objective == second.stats.objective


# One request: greedy places it on the start cycle itself (best_greedy's in_place).
@pytest.mark.parametrize(("seed", "requests"), [(5, 12), (0, 1), (4, 1)])
def test_plan_on_state_leaves_the_state_alone(seed: int, requests: int) -> None:
    snap = random_snapshot(random.Random(seed), nodes=5, requests=requests)
    state = FleetState.from_snapshot(snap)
    free = state.gpu_free.copy(), state.cpu_free.copy(), state.mem_free.copy()
    result = plan_on_state(state, snap.requests, policy=Policy(), now=NOW)
    assert result.placements  # something was placed, on the planner's copy
    assert (state.gpu_free == free[0]).all() and (state.cpu_free == free[1]).all()
    assert (state.mem_free == free[2]).all()
    for p in result.placements:  # and the caller can apply the plan incrementally
        state.apply(p)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_class_model_bound_covers_greedy(seed: int) -> None:
    """Cycles too big for the exact model go through the class relaxation: its bound must
    cover every concrete plan, greedy's included (a pruned-away pair would break this)."""
    snap = random_snapshot(random.Random(seed), nodes=30, requests=70, max_gpus=8)
    result = plan(snap)
    check_plan(result, snap)
    assert "exact" not in result.stats.detail
    if result.stats.upper_bound is not None:
        assert result.stats.upper_bound >= result.stats.objective >= result.stats.greedy_objective


def _check_hints(monkeypatch) -> list[int]:
    """Make every class-model search check that its hint (a concrete plan) satisfies
    every constraint of the model; returns the list of hint sizes seen."""
    from gpu_pool.engine import cpsat, lp

    # Without the LP every class cycle goes to CP-SAT, hinted with greedy's plan; the LP and
    # CP-SAT read the same rows, so the hint checks the rows of both.
    monkeypatch.setattr(lp.LinearModel, "relax_in_background", lambda self, limit: lambda: None)
    seen: list[int] = []
    real_hint = cpsat._hint

    def checked_hint(model, *args) -> None:
        real_hint(model, *args)
        proto = model.proto
        hint = dict(zip(proto.solution_hint.vars, proto.solution_hint.values, strict=True))
        for ct in proto.constraints:
            if not ct.has_linear():
                continue
            value = sum(c * hint[v] for v, c in zip(ct.linear.vars, ct.linear.coeffs,
                                                   strict=True))
            dom = list(ct.linear.domain)
            assert any(dom[i] <= value <= dom[i + 1] for i in range(0, len(dom), 2))
        seen.append(len(hint))

    monkeypatch.setattr(cpsat, "_hint", checked_hint)
    return seen


@pytest.mark.parametrize("extras", [False, True])
def test_greedy_plan_satisfies_every_class_model_constraint(monkeypatch, extras) -> None:
    """The class model is a relaxation: greedy's plan, given as the hint, must satisfy it;
    ``extras`` adds headroom, quotas (some over-used), down nodes."""
    seen = _check_hints(monkeypatch)
    for seed in range(6):
        plan(random_snapshot(random.Random(seed), nodes=30, requests=70, max_gpus=8,
                             extras=extras))
    assert seen and min(seen) > 0


def test_class_model_headroom_counts_whole_gpus_not_shares(monkeypatch) -> None:
    """One whole GPU may go to non-critical work (4 free, 3 whole, headroom 2); it takes
    it, and two quarter shares fill the half-used card: the plan keeps the headroom, so
    the relaxation must allow it (shares never count against the headroom)."""
    from gpu_pool.engine import exact

    seen = _check_hints(monkeypatch)
    monkeypatch.setattr(exact, "affordable", lambda *a: None)  # the class model, not exact
    node = make_node("a", "A100", 4)
    busy = make_allocation("old", node, (3,), milli=500)
    reqs = [make_request("one", 1), make_request("s1", 1, milli=250),
            make_request("s2", 1, milli=250)]
    snap = make_snapshot([node], reqs, allocations=[busy],
                         policy=Policy(critical_headroom_gpus=2))
    result = plan(snap)
    assert sorted(p.request_name for p in result.placements) == ["one", "s1", "s2"]
    assert seen
