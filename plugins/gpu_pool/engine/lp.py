"""A small integer linear model, solved as an LP (GLOP) or handed to CP-SAT.

:class:`LinearModel` holds integer variables with bounds, linear constraints with a range
and a linear objective to maximise: what the class model of :mod:`gpu_pool.engine.cpsat`
is made of. :meth:`LinearModel.relax` solves it with every variable continuous (GLOP,
OR-Tools' simplex): its optimum bounds the integer optimum from above, and comes in a
fraction of the time CP-SAT needs to close the same gap. :meth:`LinearModel.cp_model`
builds the same model for CP-SAT when a search is worth it.

Objective coefficients are scaled down before GLOP sees them (they reach 1e11 objective
units, where simplex tolerances misbehave) and back up after.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ortools.linear_solver import pywraplp
from ortools.sat.python import cp_model

_SCALE = 1e-6  # GLOP units per objective unit

Terms = list[tuple[int, int]]  # (variable index, coefficient)


@dataclass(frozen=True)
class Relaxation:
    values: list[float]  # per variable, by index
    objective: float  # in objective units


@dataclass
class LinearModel:
    lower: list[int] = field(default_factory=list)
    upper: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    rows: list[tuple[Terms, float, float]] = field(default_factory=list)  # terms, low, high
    objective: Terms = field(default_factory=list)

    def var(self, low: int, high: int, name: str) -> int:
        self.lower.append(low)
        self.upper.append(high)
        self.names.append(name)
        return len(self.lower) - 1

    def add(self, terms: Terms, low: float = float("-inf"), high: float = float("inf")) -> None:
        """``low <= sum(coef * var) <= high``."""
        self.rows.append((terms, low, high))

    def maximize(self, term: tuple[int, int]) -> None:
        self.objective.append(term)

    def relax(self, time_limit_s: float) -> Relaxation | None:
        """The LP optimum, or None when GLOP does not prove one within the limit."""
        solver = pywraplp.Solver.CreateSolver("GLOP")
        if solver is None:
            return None
        solver.SetTimeLimit(max(1, int(time_limit_s * 1000)))
        inf = solver.infinity()
        variables = [solver.NumVar(float(lo), float(hi), "")
                     for lo, hi in zip(self.lower, self.upper, strict=True)]
        for terms, low, high in self.rows:
            row = solver.Constraint(max(low, -inf), min(high, inf))
            for v, c in terms:
                row.SetCoefficient(variables[v], float(c))
        objective = solver.Objective()
        for v, c in self.objective:
            objective.SetCoefficient(variables[v], objective.GetCoefficient(variables[v])
                                     + float(c) * _SCALE)
        objective.SetMaximization()
        if solver.Solve() != pywraplp.Solver.OPTIMAL:
            return None
        return Relaxation([v.solution_value() for v in variables],
                          objective.Value() / _SCALE)

    def cp_model(self) -> tuple[cp_model.CpModel, list[cp_model.IntVar]]:
        """The same model for CP-SAT, with its variables by index."""
        model = cp_model.CpModel()
        variables = [model.new_int_var(lo, hi, name)
                     for lo, hi, name in zip(self.lower, self.upper, self.names, strict=True)]
        for terms, low, high in self.rows:
            expr = cp_model.LinearExpr.weighted_sum([variables[v] for v, _ in terms],
                                                    [c for _, c in terms])
            if low == high:
                model.add(expr == int(low))
            else:
                if low != float("-inf"):
                    model.add(expr >= int(low))
                if high != float("inf"):
                    model.add(expr <= int(high))
        model.maximize(cp_model.LinearExpr.weighted_sum(
            [variables[v] for v, _ in self.objective], [c for _, c in self.objective]))
        return model, variables
