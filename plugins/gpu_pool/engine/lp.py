"""The linear relaxation of a CP-SAT model, solved with GLOP (OR-Tools' simplex).

:func:`solve_relaxation` reads the model's proto (integer variables with their bounds,
linear constraints, a linear objective) and solves it with every variable continuous. Its
optimum is an upper bound (maximisation) on the model's integer optimum, found in a
fraction of the time CP-SAT needs to close the same gap; :mod:`gpu_pool.engine.cpsat`
rounds the solution down into a plan (see there).

Only what the class model uses is read: linear constraints and the objective. Any other
constraint kind makes the function return None, so a caller never trusts a bound of a
model it did not fully read. Objective coefficients are scaled down before GLOP sees them
(they reach 1e11 in objective units, where simplex tolerances misbehave) and back up after.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

_SCALE = 1e-6  # objective units per GLOP unit
_INFINITE = 1 << 62  # CP-SAT writes unbounded sides as int64 extremes


@dataclass(frozen=True)
class Relaxation:
    values: list[float]  # per model variable, by index
    objective: float  # in the model's objective units


def solve_relaxation(model: cp_model.CpModel, time_limit_s: float) -> Relaxation | None:
    """The LP optimum of ``model`` (maximisation), or None when GLOP does not prove one
    within ``time_limit_s`` or the model holds a constraint that is not linear."""
    proto = model.proto
    if not proto.has_objective():
        return None
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:
        return None
    solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
    inf = solver.infinity()
    variables = []
    for i, var in enumerate(proto.variables):
        domain = list(var.domain)
        variables.append(solver.NumVar(float(domain[0]), float(domain[-1]), f"v{i}"))
    for ct in proto.constraints:
        if not ct.has_linear() or len(ct.enforcement_literal):
            return None
        domain = list(ct.linear.domain)
        low, high = domain[0], domain[-1]
        row = solver.Constraint(-inf if low <= -_INFINITE else float(low),
                                inf if high >= _INFINITE else float(high))
        for v, c in zip(ct.linear.vars, ct.linear.coeffs, strict=True):
            row.SetCoefficient(variables[v], float(c))
    objective = solver.Objective()
    # CP-SAT keeps a maximisation as the minimisation of the negated objective, scaled -1.
    sign = proto.objective.scaling_factor or 1.0
    for v, c in zip(proto.objective.vars, proto.objective.coeffs, strict=True):
        objective.SetCoefficient(variables[v], float(c) * sign * _SCALE)
    objective.SetMaximization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    offset = proto.objective.offset * sign
    return Relaxation([v.solution_value() for v in variables],
                      objective.Value() / _SCALE + offset)
