"""Critical work that cannot fit may preempt preemptible allocations.

Rule: after the plan, each critical single-node request still pending, in greedy order,
looks at the nodes it could use (compatible, data move allowed, up). On each it frees the
node's active allocations that are preemptible and not critical, smallest first, until the
request fits; it takes the node that needed the fewest GPU milli freed (ties: fewest
allocations, then row order). Those allocations become :class:`Preemption` entries of
the plan; nothing else is ever preempted, and a request whose quota or data blocks it is
not helped by preemption. Gangs do not preempt (all-or-nothing across nodes would need a
search this rule does not make).

Invariant: works on the plan's final cycle only (its private copy of free capacity); an
allocation is preempted at most once.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from gpu_pool.engine.greedy import Cycle, fit
from gpu_pool.engine.objective import RequestView
from gpu_pool.engine.types import NodeAssignment, Placement, Preemption
from gpu_pool.model import Allocation, PriorityClass, Request


def _part(a: Allocation) -> NodeAssignment:
    return NodeAssignment(a.node, a.gpu_indices, a.gpu_milli, a.cpu_milli, a.memory_mib)


def preempt_for_critical(cycle: Cycle, pending: Sequence[Request], weights: dict[str, int],
                         views: dict[str, RequestView], groups: dict[str, np.ndarray],
                         allocations: Sequence[Allocation]
                         ) -> tuple[list[Placement], list[Preemption]]:
    """Placements won by preemption (applied to ``cycle``) and the preemptions they need."""
    victims: dict[int, list[Allocation]] = defaultdict(list)
    row_of = cycle.state.layout.row_of
    for a in allocations:
        if a.preemptible and a.priority is not PriorityClass.CRITICAL and a.node in row_of:
            victims[row_of[a.node]].append(a)
    for row in victims:
        victims[row].sort(key=lambda a: (a.gpu_milli_total, a.request_name))
    placements: list[Placement] = []
    preemptions: list[Preemption] = []
    for r in pending:
        if r.priority is not PriorityClass.CRITICAL or r.is_gang:
            continue
        view, g = views[r.name], groups[r.name]
        best: tuple[tuple[int, int, int], Cycle, list[Allocation]] | None = None
        for row in sorted(victims):
            if not (view.compatible[row] and view.zone_ok[row] and cycle.state.up[row]):
                continue
            trial = cycle.clone()
            freed: list[Allocation] = []
            rows = np.array([row])
            for a in victims[row]:
                trial.release([_part(a)])
                freed.append(a)
                if fit(trial, r, weights[r.name], view, g, rows) is not None:
                    cost = (sum(x.gpu_milli_total for x in freed), len(freed), row)
                    if best is None or cost < best[0]:
                        best = (cost, trial, freed)
                    break
        if best is None:
            continue
        _, trial, freed = best
        choice = fit(trial, r, weights[r.name], view, g, np.array([best[0][2]]))
        assert choice is not None  # found feasible on this very trial state above
        for a in freed:
            cycle.release([_part(a)])
            victims[best[0][2]].remove(a)
            preemptions.append(Preemption(
                a.id or f"{a.request_name}@{a.node}", a.request_name, r.name,
                f"preempted for critical request {r.name}: it needs {a.node} and nothing "
                "else fits"))
        placements.append(cycle.commit(r, choice))
    return placements, preemptions
