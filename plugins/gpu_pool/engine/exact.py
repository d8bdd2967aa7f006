r"""An exact CP-SAT model per node and per GPU, for cycles small enough to afford it.

Data: requests ``r`` (eligible this cycle) with ``K_r`` parts of ``g_r`` GPUs of ``m_r``
milli, CPU ``c_r`` and RAM ``q_r`` per part, aged weight ``w_r``, effective milli ``e_r``;
candidate rows ``n`` (compatible, data move allowed, up); free milli ``F_{n,j}`` of GPU ``j``;
free CPU ``C_n`` and RAM ``R_n``; quota left ``Q_h`` per group ``h(r, n)``; the headroom
budget ``B`` (whole GPUs non-critical work may take); penalties ``p_{r,n}``.

Variables: ``z_r`` (placed), ``a_{r,n}`` (a part of r on n), ``u_{r,n,j}`` (that part uses GPU
j), ``t_{n,j}`` (whole-free GPU j of n used by non-critical work and by no critical work:
the GPUs that count against the headroom budget).

.. math::

    \max \sum_{r,n} a_{r,n}\, e_r (1000 w_r - p_{r,n})

    \sum_n a_{r,n} = K_r z_r, \qquad \sum_j u_{r,n,j} = g_r a_{r,n}
    \qquad \sum_r m_r u_{r,n,j} \le F_{n,j}, \quad
    \sum_r c_r a_{r,n} \le C_n, \quad \sum_r q_r a_{r,n} \le R_n
    \qquad \sum_{(r,n): h(r,n) = h} g_r m_r a_{r,n} \le Q_h, \quad
    t_{n,j} \ge u_{r,n,j} - \sum_{r' \text{ critical}} u_{r',n,j}
    \ (r \text{ non-critical}, F_{n,j} = 1000), \quad \sum t \le B,
    \quad \sum_{n \in S} t_{n,j} \le B_S \ \forall \text{headroom scope } S

This is the same problem greedy and the class model solve, written without aggregation,
so an OPTIMAL status here is the true optimum (what the brute-force oracle test checks).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from ortools.sat.python import cp_model

from gpu_pool.engine.cpsat import SolverResult, configured_solver
from gpu_pool.engine.greedy import Choice, Cycle, candidate_rows
from gpu_pool.engine.objective import RequestView, part_value
from gpu_pool.engine.types import Placement, SolveStatus
from gpu_pool.model import MILLI_PER_GPU, Policy, PriorityClass, Request

MAX_GPU_VARS = 3000


def _candidates(start: Cycle, ordered: Sequence[Request], views: dict[str, RequestView],
                groups: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {r.name: candidate_rows(start, r, views[r.name], groups[r.name]) for r in ordered}


def affordable(start: Cycle, ordered: Sequence[Request], views: dict[str, RequestView],
               groups: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """Candidate rows per request when the exact model stays small, else None."""
    if len(ordered) > 60:
        return None
    cand = _candidates(start, ordered, views, groups)
    width = start.state.gpu_free.shape[1]
    if sum(len(c) for c in cand.values()) * width > MAX_GPU_VARS:
        return None
    return cand


def solve_exact(start: Cycle, ordered: Sequence[Request], weights: dict[str, int],
                views: dict[str, RequestView], groups: dict[str, np.ndarray],
                greedy: Sequence[Placement], policy: Policy,
                cand: dict[str, np.ndarray]) -> SolverResult:
    st = start.state
    model = cp_model.CpModel()
    z = {r.name: model.new_bool_var(f"z_{i}") for i, r in enumerate(ordered)}
    a: dict[tuple[str, int], cp_model.IntVar] = {}
    u: dict[tuple[str, int, int], cp_model.IntVar] = {}
    per_gpu: dict[tuple[int, int], list] = {}
    per_cpu: dict[int, list] = {}
    per_mem: dict[int, list] = {}
    per_quota: dict[int, list] = {}
    by_critical: dict[tuple[int, int], list] = {}
    noncritical_uses: dict[tuple[int, int], list] = {}
    objective = []
    scope_of = start.scope_of if start.scopes else None
    for r in ordered:
        view, g, w = views[r.name], groups[r.name], weights[r.name]
        part = r.gpus * r.gpu_milli
        for n in cand[r.name]:
            n = int(n)
            var = model.new_bool_var(f"a_{r.name}_{n}")
            a[(r.name, n)] = var
            objective.append(var * part_value(w, r, int(view.penalty[n])))
            per_cpu.setdefault(n, []).append(var * r.cpu_milli)
            per_mem.setdefault(n, []).append(var * r.memory_mib)
            if g[n] >= 0 and part:
                per_quota.setdefault(int(g[n]), []).append(var * part)
            if not r.gpus:
                continue
            gpu_vars = []
            for j in np.flatnonzero(st.gpu_free[n] >= r.gpu_milli):
                j = int(j)
                uv = model.new_bool_var(f"u_{r.name}_{n}_{j}")
                u[(r.name, n, j)] = uv
                gpu_vars.append(uv)
                per_gpu.setdefault((n, j), []).append(uv * r.gpu_milli)
                if ((start.headroom or (scope_of is not None and scope_of[n]))
                        and st.gpu_free[n, j] == MILLI_PER_GPU and st.up[n]):
                    by_critical[(n, j)] = by_critical.get((n, j), []) + (
                        [uv] if r.priority is PriorityClass.CRITICAL else [])
                    if r.priority is not PriorityClass.CRITICAL:
                        noncritical_uses.setdefault((n, j), []).append(uv)
            model.add(sum(gpu_vars) == r.gpus * var)
        parts = [a[(r.name, int(n))] for n in cand[r.name]]
        model.add(sum(parts) == r.nodes * z[r.name])
    for (n, j), terms in per_gpu.items():
        model.add(sum(terms) <= int(st.gpu_free[n, j]))
    for n, terms in per_cpu.items():
        model.add(sum(terms) <= int(st.cpu_free[n]))
    for n, terms in per_mem.items():
        model.add(sum(terms) <= int(st.mem_free[n]))
    for q, terms in per_quota.items():
        model.add(sum(terms) <= int(start.remaining[q]))
    # Headroom: t_{n,j} >= u (non-critical) - c_{n,j}, c_{n,j} = some critical part uses j.
    # Per headroom scope (model/group) the same sum over the GPUs of the rows it covers.
    touched = []
    per_scope: dict[int, list] = {}
    for (n, j), uses in noncritical_uses.items():
        tv = model.new_bool_var(f"t_{n}_{j}")
        crit = by_critical.get((n, j), [])
        for uv in uses:
            model.add(tv >= uv - sum(crit)) if crit else model.add_implication(uv, tv)
        touched.append(tv)
        for i in scope_of[n] if scope_of is not None else ():
            per_scope.setdefault(i, []).append(tv)
    if touched and start.headroom:
        model.add(sum(touched) <= max(int(start.budget or 0), 0))
    for i, tvs in per_scope.items():
        model.add(sum(tvs) <= max(int(start.scopes[i].budget), 0))
    model.maximize(sum(objective))
    _hint(model, z, a, u, greedy, st)
    solver = configured_solver(policy)
    status = solver.solve(model)
    detail = f"exact: {len(a)} node and {len(u)} GPU variables"
    if status == cp_model.OPTIMAL:
        kind = SolveStatus.OPTIMAL
    elif status == cp_model.FEASIBLE:
        kind = SolveStatus.FEASIBLE
    else:
        return SolverResult([], -1, None, SolveStatus.GREEDY, None,
                            f"solver {solver.status_name(status)} ({detail})")
    cycle = start.clone()
    placements: list[Placement] = []
    value = 0
    for r in ordered:
        if not solver.value(z[r.name]):
            continue
        rows = tuple(int(n) for n in cand[r.name] if solver.value(a[(r.name, int(n))]))
        cols = tuple(tuple(j for j in range(st.gpu_free.shape[1])
                           if (r.name, n, j) in u and solver.value(u[(r.name, n, j)]))
                     for n in rows)
        view = views[r.name]
        choice = Choice(rows, cols, tuple(int(groups[r.name][n]) for n in rows),
                        sum(part_value(weights[r.name], r, int(view.penalty[n])) for n in rows),
                        bool(view.cross_zone[list(rows)].any()),
                        max(float(view.transfer[n]) for n in rows))
        placements.append(cycle.commit(r, choice))
        value += choice.value
    return SolverResult(placements, value, cycle, kind, float(solver.best_objective_bound),
                        detail)


def _hint(model: cp_model.CpModel, z: dict, a: dict, u: dict, greedy: Sequence[Placement],
          st) -> None:
    placed: dict[tuple[str, int], tuple[int, ...]] = {}
    for p in greedy:
        for part in p.assignments:
            row = st.layout.row_of[part.node]
            placed[(p.request_name, row)] = tuple(st.layout.column_of[row][i]
                                                  for i in part.gpu_indices)
    names = {p.request_name for p in greedy}
    for name, var in z.items():
        model.add_hint(var, name in names)
    for key, var in a.items():
        model.add_hint(var, key in placed)
    for (name, n, j), var in u.items():
        model.add_hint(var, j in placed.get((name, n), ()))
