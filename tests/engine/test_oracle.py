"""The plan equals the brute-force optimum on small random instances, and never loses to greedy."""

from __future__ import annotations

import random

import pytest
from engine_checks import brute_force_optimum, check_plan, plan_value
from engine_factories import random_snapshot

from gpu_pool.engine import greedy_plan, plan
from gpu_pool.engine.types import SolveStatus


@pytest.mark.parametrize("seed", range(40))
def test_plan_equals_brute_force_optimum(seed: int) -> None:
    rng = random.Random(seed)
    snap = random_snapshot(rng, nodes=rng.randint(2, 4), requests=rng.randint(3, 8))
    result = plan(snap)
    check_plan(result, snap)
    optimum = brute_force_optimum(snap)
    assert plan_value(result, snap) == optimum
    assert result.stats.objective == optimum
    # Proven optimal, unless there was nothing or a single request to place (no solver run).
    assert result.stats.status in (SolveStatus.OPTIMAL, SolveStatus.TRIVIAL) or (
        result.stats.status is SolveStatus.GREEDY and len(result.placements) <= 1)


def test_oracle_instances_include_ones_greedy_gets_wrong() -> None:
    """The oracle test would catch a planner that only returned greedy's plan."""
    worse = 0
    for seed in range(40):
        rng = random.Random(seed)
        snap = random_snapshot(rng, nodes=rng.randint(2, 4), requests=rng.randint(3, 8))
        worse += plan_value(greedy_plan(snap), snap) < brute_force_optimum(snap)
    assert worse >= 1


@pytest.mark.parametrize("seed", range(25))
def test_never_worse_than_greedy_with_every_rule(seed: int) -> None:
    rng = random.Random(1000 + seed)
    snap = random_snapshot(rng, nodes=rng.randint(3, 8), requests=rng.randint(5, 30),
                           extras=True)
    result, base = plan(snap), greedy_plan(snap)
    check_plan(result, snap)
    check_plan(base, snap)
    assert result.stats.objective >= base.stats.objective
    assert result.stats.greedy_objective == base.stats.objective
