"""The LP relaxation of a CP-SAT model (GLOP), against optima worked out by hand."""

from __future__ import annotations

import random

import pytest
from engine_factories import random_snapshot
from ortools.sat.python import cp_model

from gpu_pool.engine import plan
from gpu_pool.engine.lp import solve_relaxation


def test_relaxation_of_a_knapsack_is_the_fractional_optimum() -> None:
    # max 5a + 4b, 6a + 4b <= 9, a, b in [0, 1]: fractional optimum b = 1, a = 5/6.
    m = cp_model.CpModel()
    a, b = m.new_int_var(0, 1, "a"), m.new_int_var(0, 1, "b")
    m.add(6 * a + 4 * b <= 9)
    m.maximize(5 * a + 4 * b)
    r = solve_relaxation(m, 1.0)
    assert r is not None
    assert r.objective == pytest.approx(4 + 5 * 5 / 6)
    assert r.values == pytest.approx([5 / 6, 1.0])
    solver = cp_model.CpSolver()
    assert solver.solve(m) == cp_model.OPTIMAL
    assert r.objective >= solver.objective_value  # the LP bounds the integer optimum (5)


def test_equalities_ranges_and_large_coefficients() -> None:
    m = cp_model.CpModel()
    x, y = m.new_int_var(0, 100, "x"), m.new_int_var(0, 100, "y")
    m.add(x + y == 10)
    m.add_linear_constraint(x - y, -4, 4)
    m.maximize(40_000_000_000 * x + 10_000_000_000 * y)
    r = solve_relaxation(m, 1.0)
    assert r is not None and r.values == pytest.approx([7.0, 3.0])
    assert r.objective == pytest.approx(310_000_000_000, rel=1e-9)


def test_a_model_it_cannot_read_gives_no_bound() -> None:
    m = cp_model.CpModel()
    x, y = m.new_int_var(0, 5, "x"), m.new_int_var(0, 5, "y")
    m.add_max_equality(x, [y, 2])
    m.maximize(x)
    assert solve_relaxation(m, 1.0) is None
    m2 = cp_model.CpModel()
    b = m2.new_bool_var("b")
    z = m2.new_int_var(0, 5, "z")
    m2.add(z <= 2).only_enforce_if(b)
    m2.maximize(z)
    assert solve_relaxation(m2, 1.0) is None


@pytest.mark.parametrize("seed", range(8))
def test_class_cycles_are_planned_from_the_lp(seed: int) -> None:
    snap = random_snapshot(random.Random(seed), nodes=30, requests=70, max_gpus=8)
    result = plan(snap)
    if "LP" in result.stats.detail:
        assert result.stats.upper_bound >= result.stats.objective >= result.stats.greedy_objective
