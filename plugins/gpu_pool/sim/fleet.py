"""The simulator's own account of a fleet's free capacity, as numpy arrays.

This is the referee: every policy (the baselines and the engine alike) only *proposes* a node
and GPU columns; :meth:`SimFleet.take` checks the proposal against capacity and constraints and
refuses it with :class:`InfeasiblePlacement` if it does not fit, so no policy can cheat.

Invariants
----------
* ``free_milli[n, g]`` is in 0..1000 for the ``gpus[n]`` real GPUs of node ``n`` and 0 for the
  padding columns beyond them, which nothing can take (a share needs >= 1 milli free, a whole GPU
  needs 1000).
* ``whole_free[n] == (free_milli[n] == 1000).sum()`` and ``max_free[n] == free_milli[n].max()``.
* ``free_cpu`` and ``free_memory`` never go below zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpu_pool.engine.fragmentation import MILLI
from gpu_pool.sim.trace import TraceNode, TraceTask


class InfeasiblePlacement(RuntimeError):
    """A policy proposed a placement that breaks capacity or a constraint."""


class SimFleet:
    """Free GPU milli per GPU, CPU and RAM per node, with fast feasibility masks."""

    def __init__(self, nodes: Sequence[TraceNode]) -> None:
        self.nodes = tuple(nodes)
        self.names = tuple(n.name for n in nodes)
        self.models: tuple[str | None, ...] = tuple(n.model for n in nodes)
        width = max(1, max(n.gpus for n in nodes))
        self.gpus = np.array([n.gpus for n in nodes], dtype=np.int64)
        self.free_milli = np.zeros((len(nodes), width), dtype=np.int64)
        for i, n in enumerate(nodes):
            self.free_milli[i, : n.gpus] = MILLI
        self.cpu_total = np.array([n.cpu_milli for n in nodes], dtype=np.int64)
        self.mem_total = np.array([n.memory_mib for n in nodes], dtype=np.int64)
        self.free_cpu = self.cpu_total.copy()
        self.free_memory = self.mem_total.copy()
        self.whole_free = self.gpus.copy()
        self.max_free = np.where(self.gpus > 0, MILLI, 0).astype(np.int64)
        self.capacity_milli = int(self.gpus.sum()) * MILLI
        self._model_masks: dict[frozenset[str], np.ndarray] = {}

    def model_mask(self, spec: frozenset[str]) -> np.ndarray:
        mask = self._model_masks.get(spec)
        if mask is None:
            mask = np.array([not spec or m in spec for m in self.models], dtype=bool)
            self._model_masks[spec] = mask
        return mask

    def feasible(self, task: TraceTask) -> np.ndarray:
        """Mask of the nodes that could host ``task`` now."""
        ok = (self.free_cpu >= task.cpu_milli) & (self.free_memory >= task.memory_mib)
        if task.num_gpu == 0:
            return ok
        ok &= self.model_mask(task.gpu_spec)
        if task.gpu_milli < MILLI:
            return ok & (self.max_free >= task.gpu_milli)
        return ok & (self.whole_free >= task.num_gpu)

    def whole_columns(self, node: int, count: int) -> tuple[int, ...]:
        """The lowest ``count`` fully free GPU columns of ``node``."""
        cols = np.flatnonzero(self.free_milli[node] == MILLI)[:count]
        return tuple(int(c) for c in cols)

    def take(self, task: TraceTask, node: int, columns: Sequence[int]) -> None:
        """Hold ``task`` on ``node`` / ``columns``; :class:`InfeasiblePlacement` if it cannot."""
        name = self.names[node]
        if self.free_cpu[node] < task.cpu_milli or self.free_memory[node] < task.memory_mib:
            raise InfeasiblePlacement(f"{task.name} on {name}: CPU or RAM short")
        if task.num_gpu == 0:
            if columns:
                raise InfeasiblePlacement(f"{task.name} on {name}: CPU-only task given GPUs")
        else:
            if task.gpu_spec and self.models[node] not in task.gpu_spec:
                raise InfeasiblePlacement(f"{task.name} on {name}: model {self.models[node]} "
                                          f"not in {sorted(task.gpu_spec)}")
            cols = list(columns)
            if len(cols) != task.num_gpu or len(set(cols)) != len(cols):
                raise InfeasiblePlacement(f"{task.name} on {name}: GPUs {cols}")
            if any(c < 0 or c >= self.gpus[node] for c in cols):
                raise InfeasiblePlacement(f"{task.name} on {name}: no GPU column in {cols}")
            if (self.free_milli[node, cols] < task.gpu_milli).any():
                raise InfeasiblePlacement(f"{task.name} on {name}: GPUs {cols} lack milli")
            self.free_milli[node, cols] -= task.gpu_milli
            row = self.free_milli[node]
            self.whole_free[node] = int((row == MILLI).sum())
            self.max_free[node] = int(row.max())
        self.free_cpu[node] -= task.cpu_milli
        self.free_memory[node] -= task.memory_mib

    def release(self, task: TraceTask, node: int, columns: Sequence[int]) -> None:
        """Give back what :meth:`take` held."""
        if columns:
            cols = list(columns)
            self.free_milli[node, cols] += task.gpu_milli
            row = self.free_milli[node]
            self.whole_free[node] = int((row == MILLI).sum())
            self.max_free[node] = int(row.max())
        self.free_cpu[node] += task.cpu_milli
        self.free_memory[node] += task.memory_mib

    @property
    def allocated_milli(self) -> int:
        return self.capacity_milli - int(self.free_milli.sum())
