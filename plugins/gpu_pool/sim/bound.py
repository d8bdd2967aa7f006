"""An upper bound on what any placer could allocate in the packing benchmark: an LP relaxation.

The tasks that have arrived when demand reaches a level (as :func:`gpu_pool.sim.packing.
run_packing` counts them) are grouped by shape, the nodes by (model, GPUs, CPU, memory).
A share ``y[s, k]`` of the tasks of shape ``s`` goes to node group ``k`` only where one task
of that shape fits one node of the group (its model accepted, enough GPUs, CPU and memory);
each group holds at most its total GPU milli, CPU and memory; at most the arrived count of a
shape is placed. The LP maximises the GPU milli placed. Every real placement of those tasks
is a feasible point of it (nothing ever leaves, and a placer may skip tasks), so its optimum
bounds the allocation of every policy from above; the unallocated GPU % a policy reaches
minus the bound's is the loss to fragmentation and arrival order, what no better placement
rule could lose less than.

With ``cards`` (the default) it also knows what a card is: a GPU of a group holds either one
whole-GPU part of a task or shares whose milli add up to at most 1,000. Each card that holds
shares follows one *card pattern* (a multiset of the arrived share sizes that no further size
fits beside; any real card's shares are contained in one), ``z[p, k]`` cards of group ``k``
follow pattern ``p``, the shares of each size placed on the group are at most the slots the
patterns give that size, and whole-GPU parts plus patterned cards are at most the group's
GPUs. Without it, an 810-milli share and a 190-milli sliver of free card counted as one
GPU's worth that nothing wasted; on openb most shares are 810, 650 or 470 milli, which
leave slivers only a few share sizes fill, so the pooled bound said 0% unallocated where
no placement comes near it.

It still relaxes what a node is (a group pools its nodes' cards, CPU and memory: a task's
GPUs need not sit on one node), so it is a bound, not a plan; it is solved with OR-Tools'
GLOP.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ortools.linear_solver import pywraplp

from gpu_pool.engine.fragmentation import MILLI
from gpu_pool.sim.trace import TraceNode, TraceTask

# Card patterns one bound may enumerate (openb's 20 share sizes give 1,871); beyond it (many
# small share sizes) the bound pools a group's GPU milli, which is still a bound.
MAX_PATTERNS = 20_000


def arrived_at(tasks: Sequence[TraceTask], capacity_milli: int, level: float) -> list[TraceTask]:
    """The arrivals counted at ``level``: up to and including the one whose GPU demand makes
    the arrived total reach ``level`` x capacity (as the allocation curve counts them)."""
    out: list[TraceTask] = []
    arrived = 0
    for t in tasks:
        out.append(t)
        arrived += t.total_gpu_milli
        if arrived >= level * capacity_milli:
            break
    return out


def card_patterns(sizes: Sequence[int], limit: int = MAX_PATTERNS) -> list[dict[int, int]] | None:
    """Every maximal multiset of share ``sizes`` (milli, each below 1,000) that fits on one
    card: per pattern, how many shares of each size. Maximal: not even the smallest size
    fits in what is left, so every set of shares one card can hold is contained in one of
    them. None when there are more than ``limit`` (many small sizes): the caller pools."""
    order = sorted(set(sizes), reverse=True)
    if not order or order[-1] <= 0 or order[0] >= MILLI:
        raise ValueError(f"share sizes must be 1..{MILLI - 1} milli, got {sorted(set(sizes))}")
    smallest = order[-1]
    out: list[dict[int, int]] = []
    counts: dict[int, int] = {}

    class _TooMany(Exception):
        pass

    def extend(i: int, left: int) -> None:
        if i == len(order):
            if left < smallest:
                if len(out) >= limit:
                    raise _TooMany
                out.append(dict(counts))
            return
        m = order[i]
        for k in range(left // m, -1, -1):
            if k:
                counts[m] = k
            else:
                counts.pop(m, None)
            extend(i + 1, left - k * m)
        counts.pop(m, None)

    try:
        extend(0, MILLI)
    except _TooMany:
        return None
    return out


def allocation_bound(tasks: Sequence[TraceTask], nodes: Sequence[TraceNode],
                     cards: bool = True) -> int:
    """The most GPU milli of ``tasks`` any placement on ``nodes`` could allocate (LP bound,
    rounded down: the true optimum is a whole number of milli); ``cards``: shares are packed
    into cards by pattern (see the module docstring), else a group's GPU milli is pooled."""
    shapes = Counter((t.num_gpu, t.gpu_milli, t.cpu_milli, t.memory_mib, t.gpu_spec)
                     for t in tasks if t.num_gpu)
    groups = Counter((n.model, n.gpus, n.cpu_milli, n.memory_mib) for n in nodes if n.gpus)
    solver = pywraplp.Solver.CreateSolver("GLOP")
    if solver is None:  # pragma: no cover - GLOP ships with every OR-Tools wheel
        raise RuntimeError("OR-Tools GLOP is not available")
    # Per group: (variable, GPU milli, CPU, memory) of each shape that may go there.
    terms: dict[tuple, list[tuple[pywraplp.Variable, int, int, int]]] = {k: [] for k in groups}
    objective = solver.Objective()
    for s, count in shapes.items():
        gpus, milli, cpu, mem, spec = s
        placed = []
        for k in groups:
            model, node_gpus, node_cpu, node_mem = k
            if gpus > node_gpus or cpu > node_cpu or mem > node_mem or (spec and model not in spec):
                continue
            y = solver.NumVar(0.0, float(count), "")
            placed.append(y)
            terms[k].append((y, gpus * milli, cpu, mem))
            objective.SetCoefficient(y, float(gpus * milli))
        if len(placed) > 1:
            row = solver.Constraint(0.0, float(count))
            for y in placed:
                row.SetCoefficient(y, 1.0)
    share_sizes = sorted({s[1] for s in shapes if s[1] < MILLI})
    # Card patterns know shares of one card and whole GPUs; a task of several part cards
    # (none in openb) keeps the pooled bound.
    split = any(s[0] > 1 and s[1] < MILLI for s in shapes)
    patterns = (card_patterns(share_sizes) or []) if cards and share_sizes and not split else []
    for k, n in groups.items():
        if not terms[k]:
            continue
        _model, node_gpus, node_cpu, node_mem = k
        for r, cap in enumerate((node_gpus * MILLI, node_cpu, node_mem), start=1):
            row = solver.Constraint(0.0, float(n * cap))
            for term in terms[k]:
                row.SetCoefficient(term[0], float(term[r]))
        if patterns:
            _card_rows(solver, terms[k], patterns, n * node_gpus)
    objective.SetMaximization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:  # pragma: no cover - bounded, y = 0 feasible
        raise RuntimeError("the packing bound LP did not solve to optimality")
    # GLOP works in floating point: a hair of tolerance, then down to whole milli.
    return int(objective.Value() * (1 + 1e-9) + 1e-6)


def _card_rows(solver: pywraplp.Solver, terms: list[tuple[pywraplp.Variable, int, int, int]],
               patterns: list[dict[int, int]], group_cards: int) -> None:
    """One group's card rows: whole-GPU parts plus patterned cards at most its cards, and the
    shares of each size at most the slots the patterns give it."""
    shares: dict[int, list[pywraplp.Variable]] = {}
    cards = solver.Constraint(0.0, float(group_cards))
    for y, milli, _cpu, _mem in terms:
        if milli < MILLI:  # a share (one GPU, less than a card)
            shares.setdefault(milli, []).append(y)
        else:  # whole GPUs: one card per GPU
            cards.SetCoefficient(y, float(milli // MILLI))
    if not shares:
        return
    slots = {m: solver.Constraint(0.0, solver.infinity()) for m in shares}
    for m, ys in shares.items():
        for y in ys:
            slots[m].SetCoefficient(y, -1.0)
    for pattern in patterns:
        if not any(m in shares for m in pattern):
            continue
        z = solver.NumVar(0.0, float(group_cards), "")
        cards.SetCoefficient(z, 1.0)
        for m, count in pattern.items():
            if m in slots:
                slots[m].SetCoefficient(z, float(count))


def unallocated_bound_pct(tasks: Sequence[TraceTask], nodes: Sequence[TraceNode],
                          level: float = 1.0) -> float:
    """The least unallocated GPU % any policy could reach at ``level`` on this arrival order."""
    capacity = sum(n.gpus for n in nodes) * MILLI
    best = allocation_bound(arrived_at(tasks, capacity, level), nodes)
    return 100.0 * (1.0 - min(best, capacity) / capacity)
