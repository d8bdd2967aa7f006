r"""CP-SAT over classes of equivalent nodes and requests, disaggregated to concrete GPUs.

Data
----
node group ``k``
    Up nodes with equal GPU model, GPU memory, zone and bandwidth: every request values
    them alike (penalty ``p_{t,k}``) and draws on the same quota group ``h(t,k)`` there.
    Free capacity is summed over the group: ``W_k`` whole-free GPUs, ``M_k`` free GPU
    milli, ``C_k`` CPU, ``R_k`` RAM, ``B_{k,s} = sum_n floor(W_n / s)`` for ``s`` from 2 to
    the largest whole-GPU part in the queue, and ``S_{k,m} = sum_{n,j} floor(F_{n,j} / m)``
    (``F_{n,j}``: free milli of GPU j of node n) for each share size ``m`` in the queue.
request type ``t``
    Eligible requests with equal shape (``K_t`` parts of ``g_t`` GPUs of ``m_t`` milli,
    CPU ``c_t``, RAM ``r_t`` per part), equal view (compatibility, data zone, penalties),
    equal criticality and equal quota-group-per-model map. A *bucket* ``b = (q, w)`` of a
    type holds its ``n_b`` requests drawing on quota group ``q`` with aged weight ``w``;
    ``e_t`` is the effective milli of a part.
fit ``f_{t,k}``
    ``sum over the group's nodes of the parts of t each could hold alone`` (its free
    whole GPUs, shares, CPU and RAM; a gang part at most one per node). Pairs with
    ``f_{t,k} = 0`` get no variable: that is the candidate pruning, and it loses nothing.

Variables
---------
``x_{t,k}`` in ``[0, min(f_{t,k}, K_t sum_b n_b)]``: parts of type ``t`` on group ``k``.
``y_{t,b}`` in ``[0, n_b]``: requests of bucket ``b`` of type ``t`` placed.

Model
-----
.. math::

    \max \; \sum_{t,b} y_{t,b} K_t e_t 1000 w_b - \sum_{t,k} x_{t,k} e_t p_{t,k}

    \text{s.t.}\quad \sum_k x_{t,k} = K_t \sum_b y_{t,b}                 \quad\forall t
    \qquad x_{t,k} \le f_{t,k} \sum_b y_{t,b}            \quad\forall t \text{ gang}, k
    \qquad \sum_{t \text{ whole}} g_t x_{t,k} \le W_k,\;
           \sum_t g_t m_t x_{t,k} \le M_k,\;
           \sum_t c_t x_{t,k} \le C_k,\;
           \sum_t r_t x_{t,k} \le R_k                           \quad\forall k
    \qquad \sum_{t \text{ whole}} \lfloor g_t / s \rfloor x_{t,k} \le B_{k,s}
           \quad\forall k, s
    \qquad \sum_{t \text{ share}} \lfloor m_t / m \rfloor x_{t,k}
           + \sum_{t \text{ whole}} g_t \lfloor 1000 / m \rfloor x_{t,k} \le S_{k,m}
           \quad\forall k, m
    \qquad \sum_{(t,b): q_b = q} y_{t,b} K_t g_t m_t
           + \sum_{t \text{ per-model}, k: h(t,k) = q} x_{t,k} g_t m_t \le Q_q  \quad\forall q
    \qquad \sum_{t \text{ whole, non-critical}, k} g_t x_{t,k} \le B          \text{(headroom)}
    \qquad \sum_{t \text{ whole, non-critical}, k \subseteq S} g_t x_{t,k} \le B_S
           \quad\forall \text{headroom scope } S \text{ (per model/group)}

Node groups are split by the headroom scopes covering their nodes, so every group lies
wholly inside or outside each scope and the scope constraint counts exactly its parts.

Every constraint holds for every concrete plan (per-node packing is only enforced in
aggregate; the block and share cuts hold per node and per GPU, hence summed: parts of
``g_i`` GPUs on one node give ``sum floor(g_i/s) <= floor(W_n/s)``; shares do not count
against the headroom), so the model is a relaxation and
the solver's bound is an upper bound on the true optimum.

Solving
-------
The model is built from the cycle's start before greedy runs (:func:`build_classes`), and
its LP solves in a background thread meanwhile (GLOP releases Python's GIL, so the simplex
and greedy's Python share the machine's cores); :func:`finish_classes` then waits for it.

1. The LP relaxation of the model (GLOP, :mod:`gpu_pool.engine.lp`), rounded down (every
   ``y`` and ``x`` floored) and made concrete: its optimum bounds the model's, hence every
   plan. On the bench fleets (``bench/placement_scale.py``, 100 x 50 to 20,000 x 10,000)
   this plan is within 0.01% of that bound, in a tenth of a second of LP, where CP-SAT
   alone did not beat greedy (1.5-2.4% below the bound) within its time limit.
   Greedy's plan already within ``Policy.solver_relative_gap`` (0.5%) of the bound is
   kept as it is, without rounding: a 20,000-request cycle saves a second pass. Otherwise
   the rounded LP is made concrete from scratch. (A repair of greedy's plan towards the
   rounded LP, moving only the requests that differ, was tried and dropped: at 20,000 x
   10,000 it cost as much as the full pass, 0.33-0.54 s against 0.39-0.43 s, ended
   0.08-0.83% below the bound where the full pass ends within 0.01%, and where it fell
   short of the gap the full pass ran after it anyway: bench seeds 1-20.)
2. When the best plan so far is further than that below the LP bound (small cycles over
   few node groups, where flooring loses whole requests), CP-SAT searches the same model
   warm-started from that plan; the better plan and the lower bound are kept.

A solution is made concrete by :func:`disaggregate`: chosen requests, largest first, are fitted by the greedy node
choice restricted to the groups the solver gave them (a gang's parts at most the solver's
count per group), then anywhere; then every request
still pending is offered a greedy fill. The caller keeps the result only if its concrete
value beats greedy's. Past :data:`MAX_PAIRS` (type, group) pairs the model is not built.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from gpu_pool.engine import lp
from gpu_pool.engine.capacity import FleetState
from gpu_pool.engine.greedy import (
    BestFitChooser,
    Choice,
    Cycle,
    fgd_off,
    fit,
    fit_key,
    group_codes,
)
from gpu_pool.engine.objective import VALUE_SCALE, RequestView, effective_milli
from gpu_pool.engine.types import Placement, SolveStatus
from gpu_pool.model import MILLI_PER_GPU, Policy, PriorityClass, Request

_PER_MODEL = -9  # bucket group of a type whose quota group depends on the node's model
_BIG = 1 << 40
# Past this many (type, class) pairs the model cannot be built and solved within a
# heartbeat in Python; the cycle keeps the greedy plan and says so in SolveStats.detail.
MAX_PAIRS = 6000
MAX_BLOCK_CUTS = 16  # block cuts for s = 2 .. this at most


@dataclass(frozen=True)
class SolverResult:
    placements: list[Placement]
    value: int
    cycle: Cycle | None
    status: SolveStatus
    upper_bound: float | None
    detail: str


@dataclass
class _Groups:
    """Node groups over the up rows, with per-group sums of free capacity."""

    members: list[np.ndarray]  # sorted rows of each group
    rep: np.ndarray  # one row per group (model, zone, bandwidth are the group's)
    group_of_row: np.ndarray  # -1 for rows in no group
    whole: np.ndarray  # sum of whole-free GPUs
    milli: np.ndarray
    cpu: np.ndarray
    mem: np.ndarray


def configured_solver(policy: Policy) -> cp_model.CpSolver:
    """A solver capped by ``policy`` whose answer does not depend on machine load.

    Wall-clock limits and parallel portfolios make CP-SAT's answer depend on timing, and
    a plan should be the same for the same snapshot; so the limit is deterministic time
    (CP-SAT's work units, close to seconds), searched by one worker (its default search,
    single-threaded) or, with ``policy.solver_workers`` above 1, by that many subsolvers
    interleaved deterministically rather than threads racing. A wall-clock cap of
    twice the limit guards the scheduler heartbeat: CP-SAT counts its LP workers' time
    poorly (measured on two loaded cores: 1.4-1.7 s of wall time booked as 0.09
    deterministic seconds), so on a busy machine the cap, not the deterministic limit, ends
    large solves. When it does, the plan may differ between runs; it is never below the
    greedy plan, which seeds the search and is kept when the solver does not beat it.
    """
    solver = cp_model.CpSolver()
    solver.parameters.max_deterministic_time = policy.solver_time_limit_s
    solver.parameters.max_time_in_seconds = 2 * policy.solver_time_limit_s
    workers = max(1, policy.solver_workers)
    solver.parameters.num_workers = workers
    solver.parameters.interleave_search = workers > 1
    solver.parameters.random_seed = policy.solver_seed
    return solver


def node_groups(cycle: Cycle) -> _Groups:
    st = cycle.state
    layout = st.layout
    codes = group_codes(layout)  # static per layout: model, GPU memory, zone, bandwidth
    if cycle.scopes:  # split groups by the headroom scopes covering them
        codes = codes * (1 << len(cycle.scopes)) + sum(
            x.rows.astype(np.int64) << i for i, x in enumerate(cycle.scopes))
    rows = np.flatnonzero(st.up)
    _, first, inverse = np.unique(codes[rows], return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    n_groups = len(first)
    order = np.argsort(inverse, kind="stable")
    members = np.split(rows[order], np.cumsum(np.bincount(inverse, minlength=n_groups))[:-1])
    group_of_row = np.full(st.size, -1, dtype=np.int64)
    group_of_row[rows] = inverse

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=values[rows], minlength=n_groups).astype(np.int64)

    return _Groups(members, rows[first], group_of_row, total(st.whole_free),
                   total(np.maximum(st.gpu_free, 0).sum(axis=1)), total(st.cpu_free),
                   total(st.mem_free))


def _fit_per_row(r: Request, st: FleetState, rows: np.ndarray) -> np.ndarray:
    """Parts of ``r`` each of ``rows`` could hold alone, given its free capacity."""
    if r.gpus == 0:
        f = np.full(len(rows), _BIG, dtype=np.int64)
    elif r.is_share:
        f = (np.maximum(st.gpu_free[rows], 0) // r.gpu_milli).sum(axis=1)
    else:
        f = st.whole_free[rows] // r.gpus
    if r.cpu_milli:
        f = np.minimum(f, st.cpu_free[rows] // r.cpu_milli)
    if r.memory_mib:
        f = np.minimum(f, st.mem_free[rows] // r.memory_mib)
    if r.is_gang:
        f = np.minimum(f, 1)
    return f


@dataclass
class ClassModel:
    """The class model of a cycle, built from its start, with GLOP already solving its LP
    relaxation in the background (:meth:`gpu_pool.engine.lp.LinearModel.relax_in_background`):
    the caller runs greedy meanwhile, then :func:`finish_classes` waits for the LP."""

    lm: lp.LinearModel
    relaxing: Callable[[], lp.Relaxation | None]
    x: dict[tuple[int, int], int]
    y: dict[tuple[int, tuple[int, int]], int]
    type_list: list
    bucket_members: dict
    grp: _Groups
    size: str


def build_classes(start: Cycle, ordered: Sequence[Request], weights: dict[str, int],
                  views: dict[str, RequestView], groups: dict[str, np.ndarray],
                  policy: Policy) -> ClassModel | SolverResult:
    """The class model of the cycle from ``start`` (which it only reads), its LP already
    solving; a result instead when the model is too large to build."""
    st = start.state
    grp = node_groups(start)
    n_groups = len(grp.rep)
    up_rows = np.flatnonzero(st.up)
    up_group = grp.group_of_row[up_rows]
    # Data: types, and per type the parts each group could hold (pruning: 0 = no variable).
    types: dict[tuple, list[Request]] = defaultdict(list)
    # Quota signature per (quota groups, view): shared arrays, so computed once per pair.
    quota_sig: dict[tuple[int, int], tuple[bool, int]] = {}
    for r in ordered:
        g, view = groups[r.name], views[r.name]
        sig = quota_sig.get((id(g), id(view)))
        if sig is None:
            comp = g[view.compatible]
            const = comp.size == 0 or bool((comp == comp[0]).all())
            sig = quota_sig[(id(g), id(view))] = (
                const, int(comp[0]) if const and comp.size else hash(g.tobytes()))
        const, gsig = sig
        types[(r.gpus, r.gpu_milli, r.nodes, r.cpu_milli, r.memory_mib,
               view.signature, r.priority is PriorityClass.CRITICAL, const, gsig)
              ].append(r)
    type_list = list(types.items())
    fits: list[np.ndarray] = []
    # Per request shape, the parts each up row holds; per view, the up rows it allows:
    # types differ in view or quota more often than in shape.
    shape_fit: dict[tuple, np.ndarray] = {}
    view_rows: dict[int, np.ndarray] = {}
    for key, reqs in type_list:
        r0 = reqs[0]
        view, g = views[r0.name], groups[r0.name]
        gk = g[grp.rep]
        part = r0.gpus * r0.gpu_milli
        ok = (gk >= 0) | (gk == -1)
        if part and len(start.remaining):
            ok &= (gk < 0) | (start.remaining[np.maximum(gk, 0)] >= part)
        # Static compatibility varies inside a group (GPU count, CPU and RAM totals).
        allowed = view_rows.get(id(view))
        if allowed is None:
            allowed = view_rows[id(view)] = (view.compatible & view.zone_ok)[up_rows]
        shape = key[:5]  # GPUs, milli, nodes (a gang: at most one part a row), CPU, RAM
        held = shape_fit.get(shape)
        if held is None:
            held = shape_fit[shape] = _fit_per_row(r0, st, up_rows)
        per_row = np.where(allowed, held, 0)
        per_group = np.bincount(up_group, weights=np.minimum(per_row, 1 << 20),
                                minlength=n_groups).astype(np.int64)
        fits.append(np.where(ok, per_group, 0))
    pairs = sum(int((f > 0).sum()) for f in fits)
    size = f"{len(type_list)} types x {n_groups} node groups, {pairs} pairs"
    if pairs > MAX_PAIRS:
        return SolverResult([], -1, None, SolveStatus.GREEDY, None,
                            f"solver skipped: {size} > {MAX_PAIRS}")
    # Block cuts: per node, parts of g whole GPUs hold sum floor(g/s) <= floor(W/s) for
    # any s, so a group holds at most B_{k,s} = sum_n floor(W_n/s) of them: one cut per
    # s from 2 to the largest part (1 is the whole-GPU row).
    largest = max((r.gpus for _, reqs in type_list for r in reqs[:1] if not r.is_share),
                  default=0)
    sizes = list(range(2, min(largest, MAX_BLOCK_CUTS + 1) + 1))
    blocks = {s_: np.bincount(up_group, weights=st.whole_free[up_rows] // s_,
                              minlength=n_groups).astype(np.int64) for s_ in sizes}
    # Share cuts: per GPU, shares of m_i milli hold sum floor(m_i/m) <= floor(F/m) and a
    # whole-GPU part takes a free GPU (floor(1000/m) units), for each share size m.
    shares = sorted({r.gpu_milli for _, reqs in type_list for r in reqs[:1] if r.is_share})
    free_gpu = st.gpu_free[up_rows]
    slots = {m: np.bincount(up_group, weights=(np.where(free_gpu > 0, free_gpu, 0) // m
                                                ).sum(axis=1), minlength=n_groups
                            ).astype(np.int64) for m in shares}
    lm = lp.LinearModel()
    x: dict[tuple[int, int], int] = {}  # variable indices
    y: dict[tuple[int, tuple[int, int]], int] = {}
    bucket_members: dict[tuple[int, tuple[int, int]], list[Request]] = {}
    cap: dict[str, dict[int, list]] = defaultdict(lambda: defaultdict(list))
    quota_terms: dict[int, list] = defaultdict(list)
    headroom_terms: list = []
    scope_terms: dict[int, list] = defaultdict(list)
    scope_of = start.scope_of if start.scopes else None
    for t, (key, reqs) in enumerate(type_list):
        r0 = reqs[0]
        view, g = views[r0.name], groups[r0.name]
        const, gsig = key[7], key[8]
        part = r0.gpus * r0.gpu_milli
        e = effective_milli(r0)
        whole = r0.gpus > 0 and not r0.is_share
        # y: requests placed per bucket (quota group, weight).
        buckets: dict[tuple[int, int], list[Request]] = defaultdict(list)
        for r in reqs:
            buckets[(gsig if const else _PER_MODEL, weights[r.name])].append(r)
        ys = []
        for b, members in buckets.items():
            var = lm.var(0, len(members), ("y", t, b[0], b[1]))
            y[(t, b)] = var
            bucket_members[(t, b)] = members
            ys.append(var)
            lm.maximize((var, r0.nodes * e * VALUE_SCALE * b[1]))
            if const and b[0] >= 0 and part:
                quota_terms[b[0]].append((var, r0.nodes * part))
        # x: parts per node group where at least one fits.
        xs = []
        # A whole-GPU part's rows in the block and share cuts: (cut, units it takes).
        cuts = ([(f"block{s_}", r0.gpus // s_) for s_ in sizes if r0.gpus >= s_]
                + [(f"slots{m}", r0.gpus * (MILLI_PER_GPU // m)) for m in shares]
                if whole else [])
        for k in np.flatnonzero(fits[t]):
            k = int(k)
            var = lm.var(0, int(min(fits[t][k], r0.nodes * len(reqs))), ("x", t, k))
            x[(t, k)] = var
            xs.append(var)
            pen = int(view.penalty[grp.rep[k]])
            if pen:
                lm.maximize((var, -e * pen))
            if whole:
                cap["whole"][k].append((var, r0.gpus))
                for name, units in cuts:
                    cap[name][k].append((var, units))
                if r0.priority is not PriorityClass.CRITICAL and start.headroom:
                    headroom_terms.append((var, r0.gpus))
                if r0.priority is not PriorityClass.CRITICAL and scope_of is not None:
                    for i in scope_of[int(grp.rep[k])]:
                        scope_terms[i].append((var, r0.gpus))
            elif r0.is_share:
                for m in shares:
                    if r0.gpu_milli >= m:
                        cap[f"slots{m}"][k].append((var, r0.gpu_milli // m))
            if part:
                cap["milli"][k].append((var, part))
                gq = int(g[grp.rep[k]])
                if not const and gq >= 0:
                    quota_terms[gq].append((var, part))
            if r0.cpu_milli:
                cap["cpu"][k].append((var, r0.cpu_milli))
            if r0.memory_mib:
                cap["mem"][k].append((var, r0.memory_mib))
            if r0.is_gang:  # one part per node: a gang count times the nodes that fit one
                lm.add([(var, 1), *((v, -int(fits[t][k])) for v in ys)], high=0)
        # parts placed = K x requests placed (none placed where no group fits one)
        lm.add([*((v, 1) for v in xs), *((v, -r0.nodes) for v in ys)], 0, 0)
    # Capacity per node group, summed over its nodes.
    limits = {"whole": grp.whole, "milli": grp.milli, "cpu": grp.cpu, "mem": grp.mem,
              **{f"block{s_}": blocks[s_] for s_ in sizes},
              **{f"slots{m}": slots[m] for m in shares}}
    for name, per_group in cap.items():
        for k, terms in per_group.items():
            lm.add(terms, high=int(limits[name][k]))
    for q, terms in quota_terms.items():
        # Over-used already (a quota cut below its use): nothing more, not an infeasible model.
        lm.add(terms, high=max(int(start.remaining[q]), 0))
    if headroom_terms:
        lm.add(headroom_terms, high=max(int(start.budget or 0), 0))
    for i, terms in scope_terms.items():
        lm.add(terms, high=max(int(start.scopes[i].budget), 0))
    return ClassModel(lm, lm.relax_in_background(2 * policy.solver_time_limit_s), x, y,
                      type_list, bucket_members, grp, size)


def finish_classes(built: ClassModel | SolverResult, start: Cycle, ordered: Sequence[Request],
                   weights: dict[str, int], views: dict[str, RequestView],
                   groups: dict[str, np.ndarray], greedy: Sequence[Placement], policy: Policy,
                   greedy_value: int | None = None) -> SolverResult:
    """The plan of the class model ``built`` from ``start``, against greedy's plan."""
    if isinstance(built, SolverResult):
        return built
    lm, x, y, grp, size = built.lm, built.x, built.y, built.grp, built.size
    type_list, bucket_members, st = built.type_list, built.bucket_members, start.state
    # 1. The LP relaxation, rounded down: the plan and the bound of large cycles.
    relaxed = built.relaxing()
    rounded: SolverResult | None = None
    close = 1 - policy.solver_relative_gap
    if relaxed is not None:
        # The LP optimum bounds the class model, hence every plan; a relative 1e-6 covers
        # the simplex tolerances, so the bound is never below a plan the LP allows.
        bound = float(math.ceil(relaxed.objective * (1 + 1e-6)))
        if greedy_value is not None and greedy_value >= bound * close:
            return SolverResult([], -1, None, SolveStatus.FEASIBLE, bound,
                                f"{size}; LP {relaxed.objective:.0f}: greedy within "
                                f"{policy.solver_relative_gap:.2%}")
        rounded = _rounded(relaxed, bound, start, x, y, type_list, bucket_members, grp,
                           ordered, weights, views, groups, greedy_value, size)
        if max(rounded.value, greedy_value if greedy_value is not None else -1) >= bound * close:
            return rounded
    # 2. CP-SAT on the same model when the LP left room (small cycles, few node groups, where
    #    rounding down loses whole requests), warm-started from the better plan so far.
    model, cp_vars = lm.cp_model()
    hint = rounded.placements if rounded is not None and rounded.value > (
        greedy_value if greedy_value is not None else -1) else greedy
    _hint(model, cp_vars, x, y, type_list, bucket_members, hint, grp, st.layout.row_of)
    searched = _search(model, cp_vars, start, x, y, type_list, bucket_members, grp, ordered,
                       weights, views, groups, policy,
                       max(greedy_value if greedy_value is not None else -1,
                           rounded.value if rounded else -1), size)
    if rounded is None:
        return searched
    bounds = [b for b in (rounded.upper_bound, searched.upper_bound) if b is not None]
    best_result = searched if searched.value > rounded.value else rounded
    return SolverResult(best_result.placements, best_result.value, best_result.cycle,
                        best_result.status, min(bounds),
                        f"{rounded.detail}; CP-SAT: {searched.detail}")


def _search(model: cp_model.CpModel, cp_vars: list[cp_model.IntVar], start: Cycle, x: dict,
            y: dict, type_list: list, bucket_members: dict, grp: _Groups,
            ordered: Sequence[Request], weights: dict[str, int],
            views: dict[str, RequestView], groups: dict[str, np.ndarray], policy: Policy,
            floor_value: int, size: str) -> SolverResult:
    """CP-SAT on the class model; a plan only when its relaxation beats ``floor_value``."""
    solver = configured_solver(policy)
    # Presolve rewrites this model for longer than it then searches: at 20,000 x 10,000 it
    # took over a second and the solve ended UNKNOWN with no bound; without it the search
    # starts from the hint at once and proves a bound (bench/placement_scale.py).
    solver.parameters.cp_model_presolve = False
    status = solver.solve(model)
    if status == cp_model.OPTIMAL:
        kind = SolveStatus.OPTIMAL
    elif status == cp_model.FEASIBLE:
        kind = SolveStatus.FEASIBLE
    else:
        return SolverResult([], -1, None, SolveStatus.GREEDY, None,
                            f"solver {solver.status_name(status)} ({size})")
    bound = float(solver.best_objective_bound)
    if solver.objective_value <= floor_value:
        # The relaxation found nothing better than the plan in hand: disaggregating it (a
        # full greedy pass over the classes) would almost surely not win.
        return SolverResult([], -1, None, kind, bound,
                            f"{size}; relaxation {solver.objective_value:.0f} <= plan in hand")
    chosen: dict[int, list[Request]] = {}
    for (t, b), var in y.items():
        n = solver.value(cp_vars[var])
        if n:
            chosen.setdefault(t, []).extend(bucket_members[(t, b)][:n])
    allot = {key: n for key, var in x.items() if (n := solver.value(cp_vars[var]))}
    cycle = start.clone()
    placements, value = disaggregate(cycle, type_list, chosen, allot, grp, ordered, weights,
                                     views, groups)
    return SolverResult(placements, value, cycle, kind, bound,
                        f"{size}; relaxation {solver.objective_value:.0f}")


def _rounded(relaxed: lp.Relaxation, bound: float, start: Cycle, x: dict, y: dict,
             type_list: list, bucket_members: dict, grp: _Groups, ordered: Sequence[Request],
             weights: dict[str, int], views: dict[str, RequestView],
             groups: dict[str, np.ndarray], greedy_value: int | None,
             size: str) -> SolverResult:
    """The plan of the LP optimum rounded down (see the module docstring)."""
    values = relaxed.values

    def count(var: int) -> int:
        return int(math.floor(values[var] + 1e-6))

    chosen: dict[int, list[Request]] = {}
    for (t, b), var in y.items():
        n = count(var)
        if n:
            chosen.setdefault(t, []).extend(bucket_members[(t, b)][:n])
    allot = {key: n for key, var in x.items() if (n := count(var))}
    cycle = start.clone()
    placements, value = disaggregate(cycle, type_list, chosen, allot, grp, ordered, weights,
                                     views, groups)
    detail = f"{size}; LP {relaxed.objective:.0f}, rounded {value}"
    if greedy_value is not None and value <= greedy_value:
        return SolverResult([], -1, None, SolveStatus.FEASIBLE, bound,
                            f"{detail} <= greedy")
    return SolverResult(placements, value, cycle, SolveStatus.FEASIBLE, bound, detail)


def _hint(model: cp_model.CpModel, cp_vars: list[cp_model.IntVar], x: dict, y: dict,
          type_list: list, bucket_members: dict, placed_plan: Sequence[Placement],
          grp: _Groups, row_of) -> None:
    placed = {p.request_name: p for p in placed_plan}
    type_of = {r.name: t for t, (_, reqs) in enumerate(type_list) for r in reqs}
    xs: dict[tuple[int, int], int] = defaultdict(int)
    for p in placed_plan:
        t = type_of.get(p.request_name)
        if t is None:
            continue
        for a in p.assignments:
            xs[(t, int(grp.group_of_row[row_of[a.node]]))] += 1
    for key, var in x.items():
        model.add_hint(cp_vars[var], xs.get(key, 0))
    for key, var in y.items():
        model.add_hint(cp_vars[var], sum(1 for r in bucket_members[key] if r.name in placed))


def disaggregate(cycle: Cycle, type_list: list, chosen: dict[int, list[Request]],
                 allot: dict[tuple[int, int], int], grp: _Groups, ordered: Sequence[Request],
                 weights: dict[str, int], views: dict[str, RequestView],
                 groups: dict[str, np.ndarray]) -> tuple[list[Placement], int]:
    """Concrete placements for the solver's choice (see the module docstring)."""
    # Per type, the groups it still has parts in (group -> parts left), and the node-group
    # codes of those groups with how many of them carry each (groups split by headroom
    # scope share a code): kept as parts are taken, not rebuilt per request.
    rooms: dict[int, dict[int, int]] = defaultdict(dict)
    for (t, k), n in allot.items():
        if n > 0:
            rooms[t][k] = n
    code_of = group_codes(cycle.state.layout)[grp.rep].tolist()
    codes: dict[int, Counter[int]] = {t: Counter(code_of[k] for k in room)
                                      for t, room in rooms.items()}
    group_of_row = grp.group_of_row.tolist()
    todo = [(t, r) for t, reqs in chosen.items() for r in reqs]
    todo.sort(key=lambda tr: (-tr[1].nodes * tr[1].gpus * tr[1].gpu_milli, -weights[tr[1].name]))
    # Without the FGD measure (a large cycle) the best-fit chooser decides, restricted to
    # the groups' codes instead of their rows: same choices, no pass over the fleet.
    chooser = BestFitChooser(cycle) if fgd_off(cycle) else None
    placements: list[Placement] = []
    done: set[str] = set()
    value = 0

    def place(r: Request, choice: Choice) -> None:
        nonlocal value
        if chooser is None:
            placements.append(cycle.commit(r, choice))
        else:
            placements.append(chooser.commit(r, choice))
        done.add(r.name)
        value += choice.value

    for t, r in todo:
        room = rooms.get(t, {})
        choice = _fit_in_groups(cycle, chooser, grp, code_of, r, weights[r.name],
                                views[r.name], groups[r.name], room, codes.get(t, {}))
        if choice is None:
            continue
        for row in choice.rows:
            k = group_of_row[row]
            n = room.get(k, 0)
            if n > 1:
                room[k] = n - 1
            elif n == 1:
                del room[k]
                left_codes = codes[t]
                left_codes[code_of[k]] -= 1
                if not left_codes[code_of[k]]:
                    del left_codes[code_of[k]]
        place(r, choice)
    _fill(cycle, chooser, ordered, done, weights, views, groups, place)
    if chooser is not None:
        chooser.sync()
    return placements, value


def _fit_in_groups(cycle: Cycle, chooser: BestFitChooser | None, grp: _Groups,
                   code_of: list[int], r: Request, w: int, view: RequestView, g: np.ndarray,
                   room: dict[int, int], codes: Container[int]) -> Choice | None:
    """The greedy choice for ``r`` inside the node groups ``room`` still gives its type
    parts in (group -> parts left; a gang's parts at most that many per group, as the
    solver counted them), else anywhere. ``codes``: the node-group codes of ``room``'s
    groups (:func:`group_codes`)."""
    choice = None
    if room and chooser is not None:
        caps: dict[int, int] | None = None
        if r.nodes > 1:
            caps = {}
            for k, n in room.items():
                caps[code_of[k]] = caps.get(code_of[k], 0) + n
        choice = chooser.fit(r, w, view, g, only=codes, caps=caps)
    elif room:
        rows = np.sort(np.concatenate([grp.members[k] for k in room]))
        caps_k = (grp.group_of_row, dict(room)) if r.nodes > 1 else None
        choice = fit(cycle, r, w, view, g, rows, caps=caps_k)
    if choice is None:
        choice = (chooser.fit(r, w, view, g) if chooser is not None
                  else fit(cycle, r, w, view, g))
    return choice


def _fill(cycle: Cycle, chooser: BestFitChooser | None, ordered: Sequence[Request],
          placed: Container[str], weights: dict[str, int], views: dict[str, RequestView],
          groups: dict[str, np.ndarray], commit: Callable[[Request, Choice], None]) -> None:
    """Offer every request of ``ordered`` not yet ``placed`` a greedy choice, in order;
    ``commit`` books each one that fits (a type that failed once is not tried again)."""
    failed: set[tuple] = set()
    for r in ordered:
        if r.name in placed:
            continue
        key = fit_key(r, views[r.name], groups[r.name])
        if key in failed:
            continue
        w, view, g = weights[r.name], views[r.name], groups[r.name]
        choice = (chooser.fit(r, w, view, g, key) if chooser is not None
                  else fit(cycle, r, w, view, g))
        if choice is None:
            failed.add(key)
        else:
            commit(r, choice)
