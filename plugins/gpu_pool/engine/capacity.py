"""Free capacity of the fleet as numpy arrays, updated incrementally.

Terms
-----
row
    Node ``i`` of :attr:`FleetState.names`; ``gpu_free[i, j]`` is the free milli of the j-th
    GPU of that node (position in ``Node.gpus``; ``gpu_index[i, j]`` is its device index).
whole-free GPU
    A healthy GPU with all 1000 milli free. ``whole_free[i]`` counts them on row ``i``.
schedulable
    ``up[i]``: the node is up; draining and down nodes get nothing new, though their
    existing allocations still hold capacity.
fit mask
    Per part shape (CPU, RAM and either whole GPUs or a GPU share), the rows that could
    take one such part now: up, enough CPU and RAM, ``whole_free >= gpus`` or a GPU with
    the share free (:meth:`FleetState.fits`). Built on first use and kept up to date row
    by row as capacity changes, so a planner asking for it thousands of times a cycle
    pays O(touched rows), not O(fleet), per placement.

Invariants
----------
* ``gpu_free`` is -1 where a node has no GPU at that position or the GPU is unhealthy, so
  no comparison ``gpu_free >= m`` (m >= 1) ever selects it; otherwise 0 <= value <= 1000.
* ``cpu_free`` and ``mem_free`` never go below zero: :meth:`FleetState.apply` refuses an
  over-allocation with :class:`ValueError` and changes nothing.
* ``whole_free[i] == (gpu_free[i] == 1000).sum()`` after every public method.
* Every fit mask equals its definition over the current arrays after every public method.
* Free capacity is derived from allocations (:meth:`from_snapshot`), never stored apart.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from gpu_pool.engine.compat import node_gpu_memory
from gpu_pool.engine.fragmentation import FleetFragmentation, WorkloadMix
from gpu_pool.engine.types import NodeAssignment, Placement, Snapshot
from gpu_pool.model import MILLI_PER_GPU, Allocation, Node

_NO_GPU = -1


@dataclass(frozen=True)
class FleetLayout:
    """The static part shared by every copy of a state: names, models, zones, GPU indices."""

    nodes: tuple[Node, ...]
    names: tuple[str, ...]
    row_of: Mapping[str, int]
    models: tuple[str | None, ...]  # model of each row (None: no GPUs)
    zones: tuple[str, ...]
    gpu_index: np.ndarray  # (N, G) device index, -1 where absent
    gpu_count: np.ndarray  # (N,) GPUs of the node, healthy or not
    gpu_memory: np.ndarray  # (N,) MiB per GPU
    bandwidth: np.ndarray  # (N,) MB/s to the zone's storage
    cpu_total: np.ndarray
    mem_total: np.ndarray
    column_of: tuple[Mapping[int, int], ...]  # per row: device index -> column
    model_rows: Mapping[str | None, np.ndarray]  # model -> boolean row mask
    zone_rows: Mapping[str, np.ndarray]  # zone -> boolean row mask
    # Static per-request views, shared by every state over this layout (see objective.py).
    views: dict = field(default_factory=dict, compare=False, hash=False)

    def rows_named(self, names: Collection[str]) -> np.ndarray:
        """Boolean row mask of the nodes in ``names`` (names not in the fleet ignored)."""
        mask = np.zeros(len(self.names), dtype=bool)
        for name in names:
            row = self.row_of.get(name)
            if row is not None:
                mask[row] = True
        return mask


class FleetState:
    """Mutable free capacity over an immutable :class:`FleetLayout`.

    Cheap to :meth:`copy` (a few array copies), so a planner works on its own copy and
    callers (the simulator) keep one state across calls and :meth:`apply` each plan.
    """

    __slots__ = ("layout", "gpu_free", "cpu_free", "mem_free", "whole_free", "up", "_frag",
                 "_fits")

    def __init__(self, layout: FleetLayout, gpu_free: np.ndarray, cpu_free: np.ndarray,
                 mem_free: np.ndarray, up: np.ndarray) -> None:
        self.layout = layout
        self.gpu_free = gpu_free
        self.cpu_free = cpu_free
        self.mem_free = mem_free
        self.up = up
        self.whole_free = (gpu_free == MILLI_PER_GPU).sum(axis=1).astype(np.int64)
        # FGD caches over these very arrays, keyed by mix; refreshed on every update.
        self._frag: dict[WorkloadMix, FleetFragmentation] = {}
        self._fits: _FitMasks | None = None

    # construction ---------------------------------------------------------------------
    @classmethod
    def from_nodes(cls, nodes: Sequence[Node]) -> FleetState:
        """An empty fleet: every healthy GPU, all CPU and RAM free."""
        nodes = tuple(nodes)
        n = len(nodes)
        width = max((len(x.gpus) for x in nodes), default=0)
        index_rows: list[list[int]] = []
        free_rows: list[list[int]] = []
        columns: list[dict[int, int]] = []
        models: list[str | None] = []
        memory: list[int] = []
        pad = [_NO_GPU] * max(width, 1)
        for node in nodes:  # one pass over the nodes: a 10,000-node fleet is built per cycle
            gpus = node.gpus
            index = [g.index for g in gpus]
            index_rows.append(index + pad[len(index):])
            free_rows.append([MILLI_PER_GPU if g.healthy else _NO_GPU for g in gpus]
                             + pad[len(gpus):])
            columns.append({i: j for j, i in enumerate(index)})
            models.append(node.gpu_model)
            memory.append(node_gpu_memory(node))
        gpu_index = np.array(index_rows, dtype=np.int64).reshape(n, max(width, 1))
        gpu_free = np.array(free_rows, dtype=np.int64).reshape(n, max(width, 1))
        names = tuple(x.name for x in nodes)
        zones = tuple(x.zone for x in nodes)
        model_arr = np.array(models, dtype=object)
        zone_arr = np.array(zones, dtype=object)
        layout = FleetLayout(
            nodes=nodes,
            names=names,
            row_of={name: i for i, name in enumerate(names)},
            models=tuple(models),
            zones=zones,
            gpu_index=gpu_index,
            gpu_count=np.array([len(x.gpus) for x in nodes], dtype=np.int64),
            gpu_memory=np.array(memory, dtype=np.int64),
            bandwidth=np.array([x.bandwidth_mb_s for x in nodes], dtype=np.float64),
            cpu_total=np.array([x.cpu_milli for x in nodes], dtype=np.int64),
            mem_total=np.array([x.memory_mib for x in nodes], dtype=np.int64),
            column_of=tuple(columns),
            model_rows={m: model_arr == m for m in set(models)} if n else {},
            zone_rows={z: zone_arr == z for z in set(zones)} if n else {},
        )
        up = np.array([x.schedulable for x in nodes], dtype=bool)
        return cls(layout, gpu_free, layout.cpu_total.copy(), layout.mem_total.copy(), up)

    @classmethod
    def from_snapshot(cls, snapshot: Snapshot) -> FleetState:
        """The fleet of ``snapshot`` minus its active allocations."""
        state = cls.from_nodes(snapshot.nodes)
        state.hold_allocations(snapshot.allocations)
        return state

    def copy(self) -> FleetState:
        twin = FleetState(self.layout, self.gpu_free.copy(), self.cpu_free.copy(),
                          self.mem_free.copy(), self.up.copy())
        for mix, frag in self._frag.items():
            twin._frag[mix] = _rebind(frag, twin)
        if self._fits is not None:
            twin._fits = self._fits.copy()
        return twin

    def fragmentation(self, mix: WorkloadMix) -> FleetFragmentation:
        """The FGD measure of this state against ``mix``, built once and kept up to date."""
        # Identity first: hashing a mix of dozens of shapes costs more than the lookup.
        frag = next((f for m, f in self._frag.items() if m is mix), None) or self._frag.get(mix)
        if frag is None:
            if len(self._frag) >= 4:  # a long-lived state sees a drifting mix: keep a few
                self._frag.pop(next(iter(self._frag)))
            frag = FleetFragmentation(self.gpu_free, self.cpu_free, self.mem_free,
                                      self.layout.models, mix)
            self._frag[mix] = frag
        return frag

    def fits(self, gpus: int, gpu_milli: int, cpu_milli: int, memory_mib: int) -> np.ndarray:
        """The fit mask (see the module docstring) of a part of ``gpus`` GPUs of
        ``gpu_milli`` each (a share when below 1000), ``cpu_milli`` and ``memory_mib``:
        a read-only boolean row mask, valid until the next update of this state."""
        if gpus <= 0:
            kind, need = 0, 0
        elif gpu_milli < MILLI_PER_GPU:
            kind, need = 1, gpu_milli
        else:
            kind, need = 2, gpus
        if self._fits is None:
            self._fits = _FitMasks(self.size)
        return self._fits.mask(self, (kind, need, cpu_milli, memory_mib))

    def _touched(self, rows: Sequence[int]) -> None:
        for row in rows:
            self.whole_free[row] = self.gpu_free[row].tolist().count(MILLI_PER_GPU)
        if self._frag or self._fits is not None:
            idx = np.array(sorted(set(rows)), dtype=np.int64)
            for frag in self._frag.values():
                frag.refresh(idx)
            if self._fits is not None:
                self._fits.refresh(self, idx)

    # updates --------------------------------------------------------------------------
    def hold_allocations(self, allocations: Iterable[Allocation]) -> None:
        """Subtract existing allocations; those on unknown nodes are ignored (stale rows).

        Unlike :meth:`apply` this does not refuse over-allocation: the store is the truth,
        and a GPU that was re-marked unhealthy under a running job must not crash a cycle.
        """
        # Plain lists per touched row, written back once: a 10,000-node fleet holds
        # thousands of allocations, each a few numpy scalar updates otherwise.
        row_of, column_of = self.layout.row_of, self.layout.column_of
        gpus: dict[int, list[int]] = {}
        cpu: dict[int, int] = {}
        mem: dict[int, int] = {}
        for a in allocations:
            row = row_of.get(a.node)
            if row is None:
                continue
            free = gpus.get(row)
            if free is None:
                free = gpus[row] = self.gpu_free[row].tolist()
                cpu[row] = mem[row] = 0
            cols = column_of[row]
            for idx in a.gpu_indices:
                j = cols.get(idx)
                if j is not None and free[j] != _NO_GPU:
                    free[j] = max(0, free[j] - a.gpu_milli)
            cpu[row] += a.cpu_milli
            mem[row] += a.memory_mib
        if not gpus:
            return
        rows = list(gpus)
        idx = np.array(rows, dtype=np.int64)
        self.gpu_free[idx] = np.array([gpus[r] for r in rows], dtype=np.int64)
        self.cpu_free[idx] -= np.array([cpu[r] for r in rows], dtype=np.int64)
        self.mem_free[idx] -= np.array([mem[r] for r in rows], dtype=np.int64)
        self._touched(rows)

    def _delta(self, assignments: Iterable[NodeAssignment], sign: int) -> None:
        located = []
        for a in assignments:
            row = self.layout.row_of[a.node]
            cols_of = self.layout.column_of[row]
            located.append((row, [cols_of[idx] for idx in a.gpu_indices], a.gpu_milli,
                            a.cpu_milli, a.memory_mib))
        self._change(located, sign)

    def take_columns(self, rows: Sequence[int], columns: Sequence[Sequence[int]],
                     gpu_milli: int, cpu_milli: int, memory_mib: int) -> None:
        """:meth:`apply` by row and column (a planner's own choice): each of ``rows`` takes
        ``gpu_milli`` on each of its ``columns``, ``cpu_milli`` and ``memory_mib``."""
        self._change([(row, list(cols), gpu_milli, cpu_milli, memory_mib)
                      for row, cols in zip(rows, columns, strict=True)], +1)

    def _change(self, located: list[tuple[int, list[int], int, int, int]], sign: int) -> None:
        """Apply (``sign`` +1) or release (-1) parts ``(row, columns, gpu milli, cpu, mem)``,
        all or nothing: every part is checked before anything changes."""
        names = self.layout.names
        for row, cols, milli, cpu, mem in located:
            if cols:
                if len(set(cols)) != len(cols):
                    raise ValueError(f"{names[row]}: GPU index repeated in "
                                     f"{self._indices(row, cols)}")
                # Plain ints: a part holds a few GPUs, too few for numpy to pay off.
                free = self.gpu_free[row].tolist()
                now = [free[j] for j in cols]
                new = [v - sign * milli for v in now]
                if _NO_GPU in now:
                    raise ValueError(f"{names[row]}: GPU {self._indices(row, cols)} is "
                                     f"unhealthy or absent")
                if min(new) < 0 or max(new) > MILLI_PER_GPU:
                    raise ValueError(f"{names[row]}: GPU milli out of range after update: "
                                     f"{np.array(new)}")
            if sign > 0 and (self.cpu_free[row] < cpu or self.mem_free[row] < mem):
                raise ValueError(f"{names[row]}: CPU or RAM over-allocated")
        for row, cols, milli, cpu, mem in located:
            if cols:  # through a list: numpy fancy indexing costs 5x more for a few GPUs
                free = self.gpu_free[row].tolist()
                for j in cols:
                    free[j] -= sign * milli
                self.gpu_free[row] = free
            self.cpu_free[row] -= sign * cpu
            self.mem_free[row] -= sign * mem
        self._touched([row for row, *_ in located])

    def _indices(self, row: int, cols: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(self.layout.gpu_index[row, j]) for j in cols)

    def apply(self, placement: Placement | Iterable[NodeAssignment]) -> None:
        """Take the capacity of a placement; :class:`ValueError` if it does not fit."""
        parts = placement.assignments if isinstance(placement, Placement) else placement
        self._delta(parts, +1)

    def release(self, assignments: Iterable[NodeAssignment]) -> None:
        """Give back capacity taken by ``apply`` (a finished task, a preemption)."""
        self._delta(assignments, -1)

    def set_schedulable(self, node: str, schedulable: bool) -> None:
        row = self.layout.row_of[node]
        self.up[row] = schedulable
        if self._fits is not None:
            self._fits.refresh(self, np.array([row], dtype=np.int64))

    # queries --------------------------------------------------------------------------
    @property
    def size(self) -> int:
        return len(self.layout.names)

    def free_gpu_milli(self, node: str) -> tuple[int, ...]:
        """Free milli per GPU of ``node`` in device order (unhealthy GPUs read 0)."""
        row = self.layout.row_of[node]
        count = int(self.layout.gpu_count[row])
        return tuple(int(max(v, 0)) for v in self.gpu_free[row, :count])

    def whole_free_up(self) -> int:
        """Whole-free GPUs on schedulable nodes: what the critical headroom is kept from."""
        return int(self.whole_free[self.up].sum())

    def allocated_gpu_milli(self) -> int:
        """GPU milli in use on healthy GPUs (the simulator's allocation ratio numerator)."""
        healthy = self.gpu_free >= 0
        return int((MILLI_PER_GPU - self.gpu_free)[healthy].sum())


class _FitMasks:
    """The fit masks of one state: one row of ``masks`` per part shape
    ``(kind, need, cpu, mem)``, kind 0 (no GPU), 1 (a share of ``need`` milli) or 2
    (``need`` whole GPUs); refreshed for the touched rows only."""

    __slots__ = ("index", "masks", "params")

    def __init__(self, size: int) -> None:
        self.index: dict[tuple[int, int, int, int], int] = {}
        self.masks = np.zeros((0, size), dtype=bool)
        self.params = np.zeros((4, 0), dtype=np.int64)  # kind, need, cpu, mem per shape

    def copy(self) -> _FitMasks:
        twin = object.__new__(_FitMasks)
        twin.index = dict(self.index)
        twin.masks = self.masks.copy()
        twin.params = self.params
        return twin

    def mask(self, state: FleetState, shape: tuple[int, int, int, int]) -> np.ndarray:
        i = self.index.get(shape)
        if i is None:
            params = np.asarray(shape, dtype=np.int64).reshape(4, 1)
            row = self._compute(state, np.arange(state.size), params)[0]
            self.masks = np.vstack([self.masks, row[None, :]])
            self.params = np.hstack([self.params, params])
            i = self.index[shape] = len(self.index)
        return self.masks[i]

    def refresh(self, state: FleetState, rows: np.ndarray) -> None:
        if self.index and len(rows):
            self.masks[:, rows] = self._compute(state, rows, self.params)

    @staticmethod
    def _compute(state: FleetState, rows: np.ndarray, params: np.ndarray) -> np.ndarray:
        """(shapes, rows) fit of each shape of ``params`` on each of ``rows``."""
        kind, need, cpu, mem = (p[:, None] for p in params)
        # What each row offers per kind: nothing to check, its largest free share, its
        # whole-free GPUs; each shape compares its own kind's offer against its need.
        offer = np.zeros((3, len(rows)), dtype=np.int64)
        offer[1] = state.gpu_free[rows].max(axis=1, initial=_NO_GPU)
        offer[2] = state.whole_free[rows]
        return ((offer[kind[:, 0]] >= need) & (state.cpu_free[rows] >= cpu)
                & (state.mem_free[rows] >= mem) & state.up[rows])


def _rebind(frag: FleetFragmentation, state: FleetState) -> FleetFragmentation:
    """A copy of ``frag`` whose caches are its own and whose state arrays are ``state``'s.

    Cheaper than rebuilding (which reads every GPU of the fleet per shape): the caches are
    valid because ``state`` is an exact copy of the one ``frag`` watched.
    """
    twin = object.__new__(FleetFragmentation)
    twin.__dict__.update(frag.__dict__)
    twin.free_milli, twin.free_cpu, twin.free_memory = state.gpu_free, state.cpu_free, state.mem_free
    for name in ("total", "lt", "ge", "frag"):
        setattr(twin, name, getattr(frag, name).copy())
    return twin
