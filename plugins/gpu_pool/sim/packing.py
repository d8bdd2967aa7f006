"""The packing benchmark of the FGD paper (Weng et al., ATC'23), as its README states it.

Protocol
--------
1. Sample tasks with replacement from the trace's task list until their GPU request would pass
   ``ratio`` (130%) of the fleet's GPUs; shuffle the order. Both use the run's seed.
2. Place the tasks one at a time as they arrive; nothing ever leaves. A task that fits nowhere
   is skipped. CPU and memory count as node resources; GPU model constraints count; shares of
   one GPU share it.
3. At every ``step`` (10%) of arrived GPU demand (as a share of capacity) record the allocation
   ratio: GPU milli allocated / GPU milli of the fleet. The headline is the unallocated GPU %
   (100 - allocation %) when arrived demand reaches 100%.

With ``batch > 1`` arrivals are grouped ``batch`` at a time and a batch-capable policy (the
engine) places each group in one cycle, as the live executor does between heartbeats; the
allocation at a level counts only the tasks arrived by then, so a batch gains from seeing
its group together, never from counting tasks that have not yet arrived.

Every proposal goes through :meth:`gpu_pool.sim.fleet.SimFleet.take`, which refuses an
infeasible one, so the figures cannot rest on an over-allocation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from gpu_pool.engine.fragmentation import MILLI, TaskShape, WorkloadMix
from gpu_pool.sim.baselines import Placer
from gpu_pool.sim.fleet import SimFleet
from gpu_pool.sim.trace import Trace, TraceTask

DEFAULT_RATIO = 1.3
DEFAULT_STEP = 0.1
HEADLINE_LEVEL = 1.0


@dataclass(frozen=True)
class Arrival:
    index: int
    task: TraceTask
    node: str | None  # None: skipped, fitted nowhere
    gpu_indices: tuple[int, ...]


@dataclass(frozen=True)
class PackingRun:
    """One seed of one policy on one trace."""

    policy: str
    seed: int
    batch: int
    levels: tuple[float, ...]  # arrived demand, share of capacity
    allocation: tuple[float, ...]  # allocation ratio at each level
    arrivals: tuple[Arrival, ...]
    decision_seconds: tuple[float, ...]  # per placement decision (per task, or per batch)
    capacity_milli: int

    @property
    def unallocated_pct(self) -> float:
        """Unallocated GPU % when arrived demand reached 100% of capacity."""
        i = min(range(len(self.levels)), key=lambda k: abs(self.levels[k] - HEADLINE_LEVEL))
        return 100.0 * (1.0 - self.allocation[i])

    @property
    def placed(self) -> int:
        return sum(1 for a in self.arrivals if a.node is not None)


def typical_mix(tasks: Sequence[TraceTask], coverage: float = 1.0) -> WorkloadMix:
    """The workload mix FGD measures against: task shapes of the trace (CPU, GPUs, milli,
    models; not memory, as in the paper) covering ``coverage`` of its tasks."""
    return WorkloadMix.from_shapes(
        (TaskShape(t.num_gpu, t.gpu_milli, t.cpu_milli, 0, t.gpu_spec) for t in tasks), coverage
    )


def engine_mix(tasks: Sequence[TraceTask]) -> WorkloadMix:
    """The mix the engine measures against: every task shape of the trace, memory included.

    The paper's measure ignores memory; on openb that hides that some 8-GPU tasks (120 cores,
    640+ GB) fit only the few G3 nodes, which an FGD placer then fills with small tasks.
    """
    return WorkloadMix.from_shapes((t.shape for t in tasks), 1.0)


def sample_arrivals(tasks: Sequence[TraceTask], capacity_milli: int, seed: int,
                    ratio: float = DEFAULT_RATIO) -> list[TraceTask]:
    """Tasks drawn with replacement until the next would pass ``ratio`` x capacity, shuffled."""
    rng = np.random.default_rng(seed)
    target = ratio * capacity_milli
    demand = np.array([t.total_gpu_milli for t in tasks], dtype=np.int64)
    if demand.sum() <= 0:
        raise ValueError("the task list asks for no GPU at all")
    chosen: list[int] = []
    total = 0
    while True:
        for i in rng.integers(0, len(tasks), size=4096):
            if total + demand[i] > target:
                order = rng.permutation(len(chosen))
                return [tasks[chosen[k]] for k in order]
            total += int(demand[i])
            chosen.append(int(i))


class BatchPlacer:
    """A policy that places several arrivals in one cycle (the engine with ``--batch K``)."""

    name: str

    def choose_batch(self, tasks: Sequence[TraceTask]) -> list[tuple[int, tuple[int, ...]] | None]:
        raise NotImplementedError

    def taken(self, task: TraceTask, node: int, columns: tuple[int, ...]) -> None:
        raise NotImplementedError


PlacerFactory = Callable[[SimFleet, np.random.Generator], "Placer | BatchPlacer"]


def run_packing(trace: Trace, make_placer: PlacerFactory, seed: int, *, batch: int = 1,
                ratio: float = DEFAULT_RATIO, step: float = DEFAULT_STEP) -> PackingRun:
    """Run the protocol for one seed; ``make_placer`` builds the policy on the run's fleet."""
    fleet = SimFleet(trace.nodes)
    arrivals = sample_arrivals(trace.tasks, fleet.capacity_milli, seed, ratio)
    placer = make_placer(fleet, np.random.default_rng([seed, 1]))
    n_levels = int(round(ratio / step))
    levels = tuple(round(step * (k + 1), 6) for k in range(n_levels))
    records: list[Arrival] = []
    timings: list[float] = []
    groups = [arrivals[i : i + batch] for i in range(0, len(arrivals), max(1, batch))]
    index = 0
    for group in groups:
        started = time.perf_counter()
        if isinstance(placer, BatchPlacer):
            choices = placer.choose_batch(group)
            timings.append(time.perf_counter() - started)
            for task, choice in zip(group, choices, strict=True):
                records.append(_apply(fleet, placer, index, task, choice))
                index += 1
        else:
            for task in group:
                started = time.perf_counter()
                choice = placer.choose(task)
                timings.append(time.perf_counter() - started)
                records.append(_apply(fleet, placer, index, task, choice))
                index += 1
    allocation = _curve(records, levels, fleet.capacity_milli)
    if sum(a.task.total_gpu_milli for a in records if a.node) != fleet.allocated_milli:
        raise RuntimeError("placements and fleet disagree")  # the referee's own check
    return PackingRun(placer.name, seed, batch, levels, tuple(allocation), tuple(records),
                      tuple(timings), fleet.capacity_milli)


def _curve(records: Sequence[Arrival], levels: Sequence[float], capacity: int) -> tuple[float, ...]:
    """Allocation ratio when arrived demand first reaches each level, counting only tasks
    arrived by then (with ``batch > 1`` a group's later tasks are placed in the same cycle,
    but do not count before they arrive). Nothing leaves, so this is the fleet's allocation."""
    out: list[float] = []
    arrived = allocated = 0
    k = 0
    for a in records:
        arrived += a.task.total_gpu_milli
        if a.node is not None:
            allocated += a.task.total_gpu_milli
        while k < len(levels) and arrived >= levels[k] * capacity:
            out.append(allocated / capacity)
            k += 1
    out.extend([allocated / capacity] * (len(levels) - k))  # the sample stops just short
    return tuple(out)


def _apply(fleet: SimFleet, placer: Placer | BatchPlacer, index: int, task: TraceTask,
           choice: tuple[int, tuple[int, ...]] | None) -> Arrival:
    if choice is None:
        return Arrival(index, task, None, ())
    node, columns = choice
    fleet.take(task, node, columns)
    placer.taken(task, node, columns)
    return Arrival(index, task, fleet.names[node], tuple(columns))


def median(values: Sequence[float]) -> float:
    return float(np.median(np.asarray(values, dtype=np.float64))) if values else float("nan")


def allocation_at(run: PackingRun, level: float) -> float:
    i = min(range(len(run.levels)), key=lambda k: abs(run.levels[k] - level))
    return run.allocation[i]


__all__ = ["MILLI", "Arrival", "BatchPlacer", "PackingRun", "allocation_at", "median",
           "run_packing", "sample_arrivals", "typical_mix"]
