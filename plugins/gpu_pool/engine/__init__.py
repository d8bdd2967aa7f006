"""The placement engine: pure functions from a snapshot of the fleet to a plan.

Public API
----------
``plan(snapshot) -> Plan``
    One placement cycle: greedy, improved by a CP-SAT model over classes of nodes and
    requests when it can, with a reason for every request left pending.
``greedy_plan(snapshot) -> Plan``
    The greedy priority-order best-fit baseline alone.
``plan_on_state(state, requests, *, quotas, allocations_usage, policy, now, workload_mix)``
    The same cycle over a caller-kept :class:`FleetState` (the simulator's incremental path).
``never_fits(request, nodes, policy) -> str | None``
    Why no node or gang of the fleet could ever hold a request (refused at submission).
``FleetState``
    Free capacity as numpy arrays: ``from_snapshot``, ``from_nodes``, ``apply``, ``release``,
    ``copy``.

Nothing here imports Airflow or does I/O.
"""

from __future__ import annotations

from gpu_pool.engine.capacity import FleetState
from gpu_pool.engine.compat import never_fits
from gpu_pool.engine.plan import greedy_plan, mix_of, plan, plan_on_state

__all__ = ["FleetState", "greedy_plan", "never_fits", "plan", "plan_on_state", "mix_of"]
