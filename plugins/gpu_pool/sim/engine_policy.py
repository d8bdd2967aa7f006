"""The placement engine as a simulator policy: trace rows become domain objects, one
:func:`gpu_pool.engine.plan_on_state` call is one placement cycle.

Mapping
-------
* A trace node becomes a :class:`~gpu_pool.model.Node` with ``gpu`` GPUs of its model and
  its CPU and RAM. Card memory is left unknown (0): the trace does not give it (G1-G3 are
  undisclosed models) and no trace task asks for it, so the engine's right-size preference
  (smallest card a request accepts first) has nothing real to act on and is neutral.
  ``card_memory=True`` takes it from :attr:`Policy.gpu_models` instead (measured on openb
  default, seeds 42-44: 0.02 to 0.2 point more unallocated GPU per seed).
* A trace task becomes a :class:`~gpu_pool.model.Request`: ``num_gpu`` GPUs of ``gpu_milli``
  each (a share when one GPU and under 1000), ``gpu_spec`` as accepted models, CPU and RAM.
  CPU-only tasks (``num_gpu == 0``) are requests for zero GPUs: they take CPU and RAM only.
* The engine keeps its own :class:`~gpu_pool.engine.FleetState` across cycles, as the live
  executor keeps the store; the simulator's fleet referees every placement independently.

The engine is given :func:`~gpu_pool.sim.packing.engine_mix` as ``workload_mix``: every task
shape of the trace with its memory, where the ``fgd`` baseline keeps the paper's measure
(CPU and GPU only).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np

from gpu_pool.engine import FleetState, plan_on_state
from gpu_pool.engine.fragmentation import MILLI, WorkloadMix
from gpu_pool.engine.types import NodeAssignment, Placement
from gpu_pool.model import Gpu, Node, Policy, PriorityClass, Request
from gpu_pool.sim.fleet import SimFleet
from gpu_pool.sim.packing import BatchPlacer
from gpu_pool.sim.trace import TraceNode, TraceTask

SIM_EPOCH = datetime(2023, 1, 1, tzinfo=UTC)
SIM_TEAM = "trace"


def domain_node(node: TraceNode, policy: Policy, card_memory: bool = False) -> Node:
    memory = 0
    if card_memory and node.model is not None:
        info = policy.model_info(node.model)
        memory = info.memory_mib if info is not None else 0
    gpus = tuple(Gpu(i, node.model or "", memory) for i in range(node.gpus))
    return Node(node.name, gpus, node.cpu_milli, node.memory_mib)


def domain_request(task: TraceTask, name: str, priority: PriorityClass = PriorityClass.NORMAL,
                   submitted_at: datetime | None = None,
                   time_limit: float | None = None) -> Request:
    return Request(
        name=name, team=SIM_TEAM, priority=priority,
        gpus=task.num_gpu, gpu_milli=task.gpu_milli if task.num_gpu else MILLI,
        gpu_models=task.gpu_spec, cpu_milli=task.cpu_milli, memory_mib=task.memory_mib,
        submitted_at=submitted_at or SIM_EPOCH,
        time_limit=None if time_limit is None else timedelta(seconds=time_limit),
    )


class EnginePlacer(BatchPlacer):
    """Each call of :meth:`choose_batch` is one engine cycle over the tasks given."""

    name = "engine"

    def __init__(self, fleet: SimFleet, mix: WorkloadMix, policy: Policy | None = None,
                 use_solver: bool = True) -> None:
        self.fleet = fleet
        self.policy = policy or Policy()
        self.mix = mix
        self.use_solver = use_solver
        self.nodes = tuple(domain_node(n, self.policy) for n in fleet.nodes)
        self.state = FleetState.from_nodes(self.nodes)
        self.row_of = {n.name: i for i, n in enumerate(self.nodes)}
        self._count = 0
        self.solve_seconds: list[float] = []

    def choose_batch(self, tasks: Sequence[TraceTask]) -> list[tuple[int, tuple[int, ...]] | None]:
        # Arrival k is submitted at SIM_EPOCH + k microseconds: the engine sees the arrival
        # order (its oldest-first order follows it) and no aging to speak of.
        first = self._count
        names = [f"t{first + k}" for k in range(len(tasks))]
        self._count += len(tasks)
        requests = [domain_request(t, n, submitted_at=SIM_EPOCH + timedelta(microseconds=first + k))
                    for k, (t, n) in enumerate(zip(tasks, names, strict=True))]
        now = SIM_EPOCH + timedelta(microseconds=self._count)
        plan = plan_on_state(self.state, requests, policy=self.policy, now=now,
                             workload_mix=self.mix, use_solver=self.use_solver)
        self.solve_seconds.append(plan.stats.wall_seconds)
        out: list[tuple[int, tuple[int, ...]] | None] = []
        for name in names:
            placement = plan.placement_of(name)
            if placement is None:
                out.append(None)
                continue
            (part,) = placement.assignments  # trace tasks are never gangs
            out.append((self.row_of[part.node], tuple(part.gpu_indices)))
        return out

    def taken(self, task: TraceTask, node: int, columns: tuple[int, ...]) -> None:
        part = NodeAssignment(self.nodes[node].name, tuple(columns),
                              task.gpu_milli if task.num_gpu else 0, task.cpu_milli,
                              task.memory_mib)
        self.state.apply(Placement(f"applied-{node}", (part,)))


def engine_factory(mix: WorkloadMix, use_solver: bool = True, policy: Policy | None = None):
    def make(fleet: SimFleet, rng: np.random.Generator) -> EnginePlacer:
        return EnginePlacer(fleet, mix, policy=policy, use_solver=use_solver)
    return make
