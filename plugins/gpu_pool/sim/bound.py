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

It relaxes what a node is (a group pools its nodes, a share may span cards), so it is a bound,
not a plan; it is solved with OR-Tools' GLOP.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ortools.linear_solver import pywraplp

from gpu_pool.engine.fragmentation import MILLI
from gpu_pool.sim.trace import TraceNode, TraceTask


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


def allocation_bound(tasks: Sequence[TraceTask], nodes: Sequence[TraceNode]) -> int:
    """The most GPU milli of ``tasks`` any placement on ``nodes`` could allocate (LP bound,
    rounded down: the true optimum is a whole number of milli)."""
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
    for k, n in groups.items():
        if not terms[k]:
            continue
        _model, node_gpus, node_cpu, node_mem = k
        for r, cap in enumerate((node_gpus * MILLI, node_cpu, node_mem), start=1):
            row = solver.Constraint(0.0, float(n * cap))
            for term in terms[k]:
                row.SetCoefficient(term[0], float(term[r]))
    objective.SetMaximization()
    if solver.Solve() != pywraplp.Solver.OPTIMAL:  # pragma: no cover - bounded, y = 0 feasible
        raise RuntimeError("the packing bound LP did not solve to optimality")
    # GLOP works in floating point: a hair of tolerance, then down to whole milli.
    return int(objective.Value() * (1 + 1e-9) + 1e-6)


def unallocated_bound_pct(tasks: Sequence[TraceTask], nodes: Sequence[TraceNode],
                          level: float = 1.0) -> float:
    """The least unallocated GPU % any policy could reach at ``level`` on this arrival order."""
    capacity = sum(n.gpus for n in nodes) * MILLI
    best = allocation_bound(arrived_at(tasks, capacity, level), nodes)
    return 100.0 * (1.0 - min(best, capacity) / capacity)
