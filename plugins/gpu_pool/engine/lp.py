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

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from ortools.linear_solver import linear_solver_pb2
from ortools.linear_solver.python import model_builder_helper
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
    # A tuple name is joined with "_" only when CP-SAT needs it (formatting ten thousand
    # names per cycle for an LP that never reads them cost more than the LP's model).
    names: list[str | tuple] = field(default_factory=list)
    rows: list[tuple[Terms, float, float]] = field(default_factory=list)  # terms, low, high
    objective: Terms = field(default_factory=list)

    def var(self, low: int, high: int, name: str | tuple) -> int:
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
        return self.relax_in_background(time_limit_s)()

    def relax_in_background(self, time_limit_s: float) -> Callable[[], Relaxation | None]:
        """Start GLOP on the model as it is now and return the call that waits for
        :meth:`relax`'s answer.

        The simplex runs in a thread and without Python's GIL
        (``ModelSolverHelper.solve_serialized_request`` releases it; ``pywraplp``'s
        ``SolveWithProto`` held it for the whole solve), so the caller's own Python, the
        greedy pass of a cycle, runs beside it on a second core. Later changes to the
        model do not reach the running solve.

        The model goes to GLOP as one ``MPModelRequest`` built with repeated-field
        ``extend`` calls: setting tens of thousands of coefficients one wrapper call at a
        time (``pywraplp``) took longer than the simplex itself at 20,000 x 10,000.
        """
        objective = [0.0] * len(self.lower)
        for v, c in self.objective:
            objective[v] += float(c) * _SCALE
        model = linear_solver_pb2.MPModelProto(maximize=True)
        add_var = model.variable.add
        for lo, hi, c in zip(self.lower, self.upper, objective, strict=True):
            add_var(lower_bound=lo, upper_bound=hi, objective_coefficient=c)
        add_row = model.constraint.add
        for terms, low, high in self.rows:
            row = add_row(lower_bound=low, upper_bound=high)
            row.var_index.extend([v for v, _ in terms])
            row.coefficient.extend([float(c) for _, c in terms])
        request = linear_solver_pb2.MPModelRequest(
            model=model, solver_type=linear_solver_pb2.MPModelRequest.GLOP_LINEAR_PROGRAMMING,
            solver_time_limit_seconds=max(time_limit_s, 1e-3)).SerializeToString()
        answer: list[bytes] = []
        failure: list[BaseException] = []

        def solve() -> None:
            try:
                answer.append(model_builder_helper.ModelSolverHelper("glop")
                              .solve_serialized_request(request))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
                failure.append(exc)

        worker = threading.Thread(target=solve, name="gpu-pool-glop", daemon=True)
        worker.start()

        def wait() -> Relaxation | None:
            worker.join()
            if failure:
                raise failure[0]
            response = linear_solver_pb2.MPSolutionResponse.FromString(answer[0])
            if response.status != linear_solver_pb2.MPSOLVER_OPTIMAL:
                return None
            return Relaxation(list(response.variable_value), response.objective_value / _SCALE)

        return wait

    def cp_model(self) -> tuple[cp_model.CpModel, list[cp_model.IntVar]]:
        """The same model for CP-SAT, with its variables by index."""
        model = cp_model.CpModel()
        variables = [
            model.new_int_var(lo, hi, name if isinstance(name, str) else "_".join(map(str, name)))
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
