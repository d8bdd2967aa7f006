"""GPU fragmentation as FGD measures it (Weng et al., "Beware of Fragmentation", USENIX ATC'23).

Terms
-----
task shape
    What one task asks of a node: ``gpus`` GPUs with ``gpu_milli`` thousandths each (a share
    when ``gpus == 1`` and ``gpu_milli < 1000``; 0 GPUs for a CPU-only task), CPU millicores,
    memory MiB and the GPU models it accepts (empty: any).
fragment of a node for a shape
    The free GPU milli of the node that a task of that shape could not use. If the task
    cannot run on the node at all (model refused, CPU or memory short, not enough GPUs with
    ``gpu_milli`` free, or a CPU-only task) every free GPU milli is a fragment. If it can run,
    the fragments are the GPUs whose free milli is below ``gpu_milli`` (a 1-GPU task cannot
    use the 300 milli left on a shared card).
workload mix
    Task shapes with their frequencies (summing to 1): the "typical pods" of the paper.
expected fragmentation
    ``F(node) = sum_s weight_s * fragment(node, s)``; FGD places a task where ``F`` grows least.

Invariants
----------
* Only the free state of a node matters; the order of its GPUs does not.
* ``gpu_milli`` of a shape is in 1..1000 when ``gpus > 0``; whole-GPU tasks take fully free GPUs.
* :class:`FleetFragmentation` caches per-node partial sums, so a candidate's delta costs
  O(shapes) instead of O(shapes x GPUs); call :meth:`FleetFragmentation.refresh` for every node
  whose free state the caller changed.

The scalar functions are the definition; :class:`FleetFragmentation` is the same measure
vectorised with numpy over a whole fleet, tested against the scalar one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MILLI = 1000
_REFRESH_CELLS = 1 << 20  # (node, GPU, shape) cells one refresh gathers at most: 8 MB


@dataclass(frozen=True, order=True)
class TaskShape:
    """What one task asks of one node."""

    gpus: int
    gpu_milli: int  # per GPU; 0 when gpus == 0
    cpu_milli: int = 0
    memory_mib: int = 0
    gpu_models: frozenset[str] = frozenset()

    def accepts(self, model: str | None) -> bool:
        if not self.gpu_models:
            return True
        return model is not None and model in self.gpu_models


@dataclass(frozen=True)
class WorkloadMix:
    """Task shapes and their frequencies (weights sum to 1)."""

    shapes: tuple[TaskShape, ...]
    weights: tuple[float, ...]

    def __hash__(self) -> int:
        # Hashed on every state copy (the FGD cache is keyed by mix): hash hundreds of
        # shapes once, not per copy.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.shapes, self.weights))
            object.__setattr__(self, "_hash", cached)
        return cached

    @classmethod
    def from_shapes(cls, shapes: Iterable[TaskShape], coverage: float = 1.0) -> WorkloadMix:
        """The mix of the given task list: most frequent shapes first, cut once they cover
        ``coverage`` of the tasks (the paper keeps the top 95%), then renormalised."""
        return cls.from_counts(Counter(shapes), coverage)

    @classmethod
    def from_counts(cls, counts: Mapping[TaskShape, int], coverage: float = 1.0) -> WorkloadMix:
        """:meth:`from_shapes` of a task list given as a count per shape."""
        if not counts:
            return cls((), ())
        total = sum(counts.values())
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
        kept: list[tuple[TaskShape, int]] = []
        covered = 0
        for shape, n in ranked:
            kept.append((shape, n))
            covered += n
            if covered >= coverage * total - 1e-9:
                break
        return cls(tuple(s for s, _ in kept), tuple(n / covered for _, n in kept))

    @classmethod
    def from_snapshot(cls, mix: Iterable[tuple[tuple[int, int], float]]) -> WorkloadMix:
        """From :attr:`gpu_pool.engine.types.Snapshot.workload_mix` ((gpus, milli) -> weight)."""
        pairs = [(TaskShape(g, m if g else 0), float(w)) for (g, m), w in mix if w > 0]
        total = sum(w for _, w in pairs)
        if total <= 0:
            return cls((), ())
        return cls(tuple(s for s, _ in pairs), tuple(w / total for _, w in pairs))

    def __len__(self) -> int:
        return len(self.shapes)


def task_fragment(
    free_milli: Sequence[int],
    free_cpu: int,
    free_memory: int,
    model: str | None,
    shape: TaskShape,
) -> int:
    """GPU milli of a node (free GPU milli per GPU, free CPU and RAM) that ``shape`` cannot use."""
    total = sum(free_milli)
    if shape.gpus == 0 or not shape.accepts(model):
        return total
    if free_cpu < shape.cpu_milli or free_memory < shape.memory_mib:
        return total
    if sum(1 for f in free_milli if f >= shape.gpu_milli) < shape.gpus:
        return total
    return sum(f for f in free_milli if f < shape.gpu_milli)


def expected_fragment(
    free_milli: Sequence[int],
    free_cpu: int,
    free_memory: int,
    model: str | None,
    mix: WorkloadMix,
) -> float:
    """``F(node)``: the fragment of the node averaged over the workload mix."""
    return sum(
        w * task_fragment(free_milli, free_cpu, free_memory, model, s)
        for s, w in zip(mix.shapes, mix.weights, strict=True)
    )


def fragment_delta(
    free_milli: Sequence[int],
    free_cpu: int,
    free_memory: int,
    model: str | None,
    mix: WorkloadMix,
    take: Mapping[int, int],
    cpu_milli: int = 0,
    memory_mib: int = 0,
) -> float:
    """How much ``F(node)`` grows when a task takes ``take`` (GPU index -> milli), CPU and RAM."""
    after = list(free_milli)
    for index, milli in take.items():
        after[index] -= milli
    before = expected_fragment(free_milli, free_cpu, free_memory, model, mix)
    return expected_fragment(after, free_cpu - cpu_milli, free_memory - memory_mib, model, mix) - before


class FleetFragmentation:
    """The expected fragmentation of every node of a fleet, kept up to date incrementally.

    The caller owns the state arrays and mutates them in place: ``free_milli`` (nodes x max
    GPUs; absent or unhealthy GPUs read 0 or -1, as in :class:`gpu_pool.engine.capacity.
    FleetState`), ``free_cpu``, ``free_memory``; after each change it calls :meth:`refresh`
    with the nodes touched. Deltas are ``F(after) - F(before)``.
    """

    def __init__(
        self,
        free_milli: np.ndarray,
        free_cpu: np.ndarray,
        free_memory: np.ndarray,
        models: Sequence[str | None],
        mix: WorkloadMix,
    ) -> None:
        self.free_milli = free_milli
        self.free_cpu = free_cpu
        self.free_memory = free_memory
        self.mix = mix
        shapes = mix.shapes
        self.weight = np.asarray(mix.weights, dtype=np.float64)
        self.s_gpus = np.asarray([s.gpus for s in shapes], dtype=np.int64)
        self.s_milli = np.asarray([s.gpu_milli for s in shapes], dtype=np.int64)
        self.s_cpu = np.asarray([s.cpu_milli for s in shapes], dtype=np.int64)
        self.s_mem = np.asarray([s.memory_mib for s in shapes], dtype=np.int64)
        # access[n, s]: a GPU shape whose models the node's card satisfies (CPU-only: never Q3).
        # Computed once per distinct model (a fleet has a handful), then spread over rows.
        distinct = list(dict.fromkeys(models))
        per_model = np.asarray(
            [[s.gpus > 0 and s.accepts(m) for s in shapes] for m in distinct], dtype=bool
        ).reshape(len(distinct), len(shapes))
        position = {m: k for k, m in enumerate(distinct)}
        self.access = per_model[np.asarray([position[m] for m in models], dtype=np.int64)
                                ].reshape(len(models), len(shapes))
        # Per free value v in 0..1000: v if v < milli_s else 0, and [v >= milli_s].
        values = np.arange(MILLI + 1, dtype=np.int64)[:, None]
        # The per-node caches are whole numbers in narrow types (a node's free milli below a
        # share size is at most 1000 per GPU, its GPUs with enough free a few): a state copy
        # copies them every cycle, 6 bytes a cell instead of 16, and _combine reads them
        # into float64 exactly, so the measure is the same to the bit.
        self.t_lt = np.where(values < self.s_milli[None, :], values, 0).astype(np.int32)
        self.t_ge = (values >= self.s_milli[None, :]).astype(np.int16)
        n = free_milli.shape[0]
        self.total = np.zeros(n, dtype=np.float64)
        self.lt = np.zeros((n, len(shapes)), dtype=np.int32)
        self.ge = np.zeros((n, len(shapes)), dtype=np.int16)
        self.frag = np.zeros(n, dtype=np.float64)
        # In slices: one refresh gathers a (nodes x GPUs x shapes) table, 256 MB for
        # 10,000 nodes x 400 shapes at once.
        step = max(1, _REFRESH_CELLS // max(1, free_milli.shape[1] * len(shapes)))
        for first in range(0, n, step):
            self.refresh(np.arange(first, min(n, first + step)))

    def _combine(
        self,
        access: np.ndarray,
        total: np.ndarray,
        lt: np.ndarray,
        ge: np.ndarray,
        cpu: np.ndarray,
        mem: np.ndarray,
    ) -> np.ndarray:
        ok = (
            access
            & (cpu[:, None] >= self.s_cpu[None, :])
            & (mem[:, None] >= self.s_mem[None, :])
            & (ge >= self.s_gpus[None, :])
        )
        per_shape = np.where(ok, lt, total[:, None])
        return per_shape @ self.weight

    def refresh(self, nodes: np.ndarray | Sequence[int] | int) -> None:
        """Recompute the cached sums of ``nodes`` from the state arrays."""
        idx = np.atleast_1d(np.asarray(nodes, dtype=np.int64))
        free = np.maximum(self.free_milli[idx], 0)  # absent or unhealthy GPUs may read -1
        self.total[idx] = free.sum(axis=1)
        self.lt[idx] = self.t_lt[free].sum(axis=1)
        self.ge[idx] = self.t_ge[free].sum(axis=1)
        self.frag[idx] = self._combine(
            self.access[idx], self.total[idx], self.lt[idx], self.ge[idx],
            self.free_cpu[idx], self.free_memory[idx],
        )

    def delta_whole(
        self, nodes: np.ndarray, gpus: int, cpu_milli: int, memory_mib: int
    ) -> np.ndarray:
        """Growth of ``F`` on each of ``nodes`` if it hosts ``gpus`` whole GPUs (0: CPU-only).

        Whole GPUs come from fully free cards: each leaves ``total`` by 1000 and ``ge`` by one
        for every shape, and adds nothing below any share size.
        """
        after = self._combine(
            self.access[nodes],
            self.total[nodes] - MILLI * gpus,
            self.lt[nodes],
            self.ge[nodes] - gpus,
            self.free_cpu[nodes] - cpu_milli,
            self.free_memory[nodes] - memory_mib,
        )
        return after - self.frag[nodes]

    def delta_share(
        self, nodes: np.ndarray, gpus: np.ndarray, milli: int, cpu_milli: int, memory_mib: int
    ) -> np.ndarray:
        """Growth of ``F`` if a share of ``milli`` goes on GPU ``gpus[i]`` of node ``nodes[i]``."""
        before = self.free_milli[nodes, gpus]
        after_v = before - milli
        after = self._combine(
            self.access[nodes],
            self.total[nodes] - milli,
            self.lt[nodes] - self.t_lt[before] + self.t_lt[after_v],
            self.ge[nodes] - self.t_ge[before] + self.t_ge[after_v],
            self.free_cpu[nodes] - cpu_milli,
            self.free_memory[nodes] - memory_mib,
        )
        return after - self.frag[nodes]

    def fleet_fragment(self) -> float:
        """Sum of ``F`` over the fleet, in GPU milli."""
        return float(self.frag.sum())
