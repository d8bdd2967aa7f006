"""The baseline placement policies of the FGD paper, written from their published definitions.

Each policy proposes, for one task on a :class:`~gpu_pool.sim.fleet.SimFleet`, a node and the
GPU columns to take, or ``None`` when no node fits; the fleet itself checks and applies it.

random
    A node chosen uniformly among the feasible ones; a share goes on a random fitting GPU.
firstfit
    The first feasible node in node-list order; a share goes on the first fitting GPU.
bestfit
    The node left with the least weighted free CPU and GPU: score
    ``sum_r w_r (free_r - request_r) / max_r`` over r in (CPU, GPU) with w = (0.5, 0.5) and
    max = (128 cores, 8 GPUs); a share goes on the fitting GPU with the least free milli.
fgd
    Fragmentation gradient descent: the node (and, for a share, the GPU) whose expected
    fragmentation against the workload mix grows least
    (:mod:`gpu_pool.engine.fragmentation`).

Like the authors' Kubernetes scheduler plugins, bestfit and fgd score nodes as integers 0..100
(fgd: ``int(100 * sigmoid(-delta / 1000))``) and break ties between equal scores at random:
that is how the published figures were produced, and ``exact=True`` drops the rounding.
Whole GPUs are always the lowest-index fully free ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from gpu_pool.engine.fragmentation import MILLI, FleetFragmentation, WorkloadMix
from gpu_pool.sim.fleet import SimFleet
from gpu_pool.sim.trace import TraceTask

MAX_SPEC_CPU = 128_000
MAX_SPEC_GPU = 8_000

Choice = tuple[int, tuple[int, ...]]


class Placer(Protocol):
    name: str

    def choose(self, task: TraceTask) -> Choice | None:
        """A node row and GPU columns for ``task``, or None when nothing fits."""

    def taken(self, task: TraceTask, node: int, columns: tuple[int, ...]) -> None:
        """Told after the fleet applied a choice (policies with caches update them)."""


class _Base:
    name = "base"

    def __init__(self, fleet: SimFleet, rng: np.random.Generator) -> None:
        self.fleet = fleet
        self.rng = rng

    def taken(self, task: TraceTask, node: int, columns: tuple[int, ...]) -> None:
        return None

    def _pick_max(self, nodes: np.ndarray, scores: np.ndarray) -> int:
        best = np.flatnonzero(scores == scores.max())
        return int(nodes[best[0] if len(best) == 1 else self.rng.choice(best)])

    def _columns(self, task: TraceTask, node: int, share_rule: str) -> tuple[int, ...]:
        if task.num_gpu == 0:
            return ()
        if task.gpu_milli >= MILLI:
            return self.fleet.whole_columns(node, task.num_gpu)
        row = self.fleet.free_milli[node, : self.fleet.gpus[node]]
        fits = np.flatnonzero(row >= task.gpu_milli)
        if share_rule == "first":
            return (int(fits[0]),)
        if share_rule == "random":
            return (int(self.rng.choice(fits)),)
        return (int(fits[np.argmin(row[fits])]),)  # least free first; argmin keeps the first


class RandomPlacer(_Base):
    name = "random"

    def choose(self, task: TraceTask) -> Choice | None:
        nodes = np.flatnonzero(self.fleet.feasible(task))
        if len(nodes) == 0:
            return None
        node = int(self.rng.choice(nodes))
        return node, self._columns(task, node, "random")


class FirstFitPlacer(_Base):
    name = "firstfit"

    def choose(self, task: TraceTask) -> Choice | None:
        nodes = np.flatnonzero(self.fleet.feasible(task))
        if len(nodes) == 0:
            return None
        node = int(nodes[0])
        return node, self._columns(task, node, "first")


class BestFitPlacer(_Base):
    name = "bestfit"

    def __init__(self, fleet: SimFleet, rng: np.random.Generator, exact: bool = False) -> None:
        super().__init__(fleet, rng)
        self.exact = exact

    def choose(self, task: TraceTask) -> Choice | None:
        fleet = self.fleet
        nodes = np.flatnonzero(fleet.feasible(task))
        if len(nodes) == 0:
            return None
        gpu_free = fleet.free_milli[nodes].sum(axis=1)
        left = (0.5 * (fleet.free_cpu[nodes] - task.cpu_milli) / MAX_SPEC_CPU
                + 0.5 * (gpu_free - task.total_gpu_milli) / MAX_SPEC_GPU)
        scores = (1.0 - left) * 100.0
        if not self.exact:
            scores = np.trunc(scores)
        node = self._pick_max(nodes, scores)
        return node, self._columns(task, node, "best")


def fgd_score(delta: np.ndarray) -> np.ndarray:
    """The authors' node score for a growth ``delta`` of expected fragmentation (milli)."""
    return np.trunc(100.0 / (1.0 + np.exp(np.clip(delta / 1000.0, -50, 50))))


class FgdPlacer(_Base):
    name = "fgd"

    def __init__(self, fleet: SimFleet, rng: np.random.Generator, mix: WorkloadMix,
                 exact: bool = False) -> None:
        super().__init__(fleet, rng)
        self.exact = exact
        self.index = FleetFragmentation(fleet.free_milli, fleet.free_cpu, fleet.free_memory,
                                        fleet.models, mix)

    def _score(self, delta: np.ndarray) -> np.ndarray:
        return -delta if self.exact else fgd_score(delta)

    def choose(self, task: TraceTask) -> Choice | None:
        fleet = self.fleet
        nodes = np.flatnonzero(fleet.feasible(task))
        if len(nodes) == 0:
            return None
        if task.num_gpu == 0 or task.gpu_milli >= MILLI:
            delta = self.index.delta_whole(nodes, task.num_gpu, task.cpu_milli, task.memory_mib)
            node = self._pick_max(nodes, self._score(delta))
            return node, self._columns(task, node, "first")
        node_idx, gpu_idx = share_candidates(fleet, nodes, task.gpu_milli)
        delta = self.index.delta_share(node_idx, gpu_idx, task.gpu_milli, task.cpu_milli,
                                       task.memory_mib)
        score = self._score(delta)
        # Per node its best GPU (the first on ties), then the best node (random on ties).
        order = np.lexsort((gpu_idx, -score, node_idx))
        first = np.ones(len(order), dtype=bool)
        first[1:] = node_idx[order][1:] != node_idx[order][:-1]
        pick = order[first]
        chosen = pick[self._pick_max(np.arange(len(pick)), score[pick])]
        return int(node_idx[chosen]), (int(gpu_idx[chosen]),)

    def taken(self, task: TraceTask, node: int, columns: tuple[int, ...]) -> None:
        self.index.refresh([node])


def share_candidates(fleet: SimFleet, nodes: np.ndarray, milli: int) -> tuple[np.ndarray, np.ndarray]:
    """(node, GPU column) pairs on ``nodes`` where a share of ``milli`` fits, keeping only the
    first column of each distinct free value per node (equal cards give equal outcomes)."""
    free = fleet.free_milli[nodes]
    fits = free >= milli
    width = free.shape[1]
    dup = np.zeros_like(fits)
    for j in range(1, width):
        dup[:, j] = (free[:, :j] == free[:, j : j + 1]).any(axis=1)
    rows, cols = np.nonzero(fits & ~dup)
    return nodes[rows], cols


BASELINES: Sequence[str] = ("random", "firstfit", "bestfit", "fgd")


def make_baseline(name: str, fleet: SimFleet, rng: np.random.Generator,
                  mix: WorkloadMix, exact: bool = False) -> Placer:
    if name == "random":
        return RandomPlacer(fleet, rng)
    if name == "firstfit":
        return FirstFitPlacer(fleet, rng)
    if name == "bestfit":
        return BestFitPlacer(fleet, rng, exact)
    if name == "fgd":
        return FgdPlacer(fleet, rng, mix, exact)
    raise ValueError(f"unknown baseline {name!r}")
