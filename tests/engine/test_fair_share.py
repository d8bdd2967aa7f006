"""Fair share: among requests of equal aged weight the team with less decayed use goes
first; it never lifts a request over a more urgent class or a longer (aged) wait."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from engine_factories import NOW, make_node, make_request, make_snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_pool.engine.greedy import greedy_order, other_greedy_orders
from gpu_pool.engine.objective import aged_weights
from gpu_pool.engine.plan import greedy_plan, plan
from gpu_pool.model import Policy, PriorityClass

POLICY = Policy(solver_time_limit_s=0.05)


def _winner(planner, reqs, usage, policy=POLICY):
    snap = replace(make_snapshot([make_node("a", gpus=4)], reqs, policy=policy),
                   team_usage=usage)
    result = planner(snap)
    return sorted(p.request_name for p in result.placements)


@pytest.mark.parametrize("planner", [greedy_plan, plan])
@pytest.mark.parametrize("usage, policy, placed", [
    ({"ml": 10.0, "cv": 1.0}, POLICY, ["cv-job"]),
    ({"ml": 1.0, "cv": 10.0}, POLICY, ["ml-job"]),
    ({}, POLICY, ["cv-job"]),  # no use recorded: by name
    # Fair share off: the light team gets no head start.
    ({"ml": 1.0, "cv": 10.0}, replace(POLICY, fair_share_half_life=timedelta(0)), ["cv-job"]),
])
def test_less_used_team_goes_first_among_equals(planner, usage, policy, placed):
    reqs = [make_request("ml-job", 4, team="ml"), make_request("cv-job", 4, team="cv")]
    assert _winner(planner, reqs, usage, policy) == placed


@pytest.mark.parametrize("planner", [greedy_plan, plan])
def test_never_above_a_more_urgent_class(planner):
    reqs = [make_request("heavy-high", 4, team="ml", priority=PriorityClass.HIGH),
            make_request("light-normal", 4, team="cv")]
    assert _winner(planner, reqs, {"ml": 1e6, "cv": 0.0}) == ["heavy-high"]


@pytest.mark.parametrize("planner", [greedy_plan, plan])
def test_never_above_a_longer_wait(planner):
    reqs = [make_request("heavy-old", 4, team="ml", waited=timedelta(hours=3)),
            make_request("light-new", 4, team="cv")]
    assert _winner(planner, reqs, {"ml": 1e6, "cv": 0.0}) == ["heavy-old"]


_REQ = st.tuples(st.sampled_from(list(PriorityClass)), st.sampled_from(["ml", "cv", "nlp"]),
                 st.integers(0, 300), st.integers(1, 4))


@settings(max_examples=80, deadline=None)
@given(st.lists(_REQ, min_size=1, max_size=20),
       st.dictionaries(st.sampled_from(["ml", "cv", "nlp"]), st.floats(0, 1e4)))
def test_order_is_weight_then_fair_share(specs, usage):
    reqs = [make_request(f"r{i}", gpus, team=team, priority=prio,
                         waited=timedelta(minutes=mins))
            for i, (prio, team, mins, gpus) in enumerate(specs)]
    weights = aged_weights(reqs, POLICY, NOW)
    others = [order for order, _ in other_greedy_orders(reqs, weights, usage)]
    for order in (greedy_order(reqs, weights, usage), *others):
        assert sorted(r.name for r in order) == sorted(r.name for r in reqs)
        for a, b in zip(order, order[1:], strict=False):
            assert weights[a.name] >= weights[b.name]  # class and aging first, always
            if weights[a.name] == weights[b.name]:
                assert usage.get(a.team, 0.0) <= usage.get(b.team, 0.0)
    plain = greedy_order(reqs, weights)
    assert [weights[r.name] for r in plain] == sorted((weights[r.name] for r in reqs),
                                                       reverse=True)
