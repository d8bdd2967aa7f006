"""Greedy priority-order placement: the baseline every plan must match or beat.

Terms
-----
cycle
    The working state of one planning pass (:class:`Cycle`): a private copy of the fleet's
    free capacity, the quota milli left per group, the whole-free GPUs on schedulable nodes
    non-critical work may still take (the critical headroom) and the FGD measure of the copy.
headroom scope
    One :class:`~gpu_pool.model.Headroom` of the policy over the rows it covers
    (:class:`HeadroomScope`): non-critical work may not leave fewer than its ``gpus``
    whole-free GPUs on the covered up nodes. Its budget starts at the covered whole-free
    GPUs minus ``gpus`` and drops by the whole-free GPUs non-critical work takes on a
    covered row (a share on a fully free GPU takes one). The fleet-wide
    ``critical_headroom_gpus`` is the cycle's ``headroom``/``budget`` pair, checked first; a
    cycle without scopes pays nothing for them.
candidate row
    A node a part of the request may take now: compatible model and memory, data move
    allowed, up, enough CPU, RAM and GPUs (``whole_free >= gpus`` for whole GPUs, one GPU
    with ``gpu_milli`` free for a share), and quota left on the row's group.
node choice
    Among candidate rows, the lowest ``penalty`` (right-size, data move) first, then the
    best FGD score against the workload mix weighed against a fixed scrambled node order
    (:func:`node_cost`, :func:`node_order`; best-fit on free GPU milli alone when there
    is no FGD measure). Whole GPUs take the lowest fully free indices;
    a share takes the tightest GPU that holds it. A gang takes its K best distinct rows.

Order: aged weight descending, then (fair share) the team with less decayed use first,
then larger whole-GPU requests first (GPU shares and CPU-only requests after them, by
age), then older, then by name: deterministic, so the same snapshot always yields the same
plan. Fair share only breaks ties of equal aged weight, so it never lifts a request above a
more urgent class or above a longer wait that aged its weight.

Invariants: :func:`fit` never changes the cycle; :meth:`Cycle.commit` applies through
:meth:`FleetState.apply`, which refuses any over-allocation, so a plan built here never
over-allocates a GPU, CPU or RAM.
"""

from __future__ import annotations

import bisect
import math
import zlib
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

import numpy as np

from gpu_pool.engine.capacity import FleetLayout, FleetState
from gpu_pool.engine.fragmentation import FleetFragmentation, WorkloadMix
from gpu_pool.engine.objective import VALUE_SCALE, RequestView, effective_milli, part_value
from gpu_pool.engine.quota import UNLIMITED
from gpu_pool.engine.types import NodeAssignment, Placement
from gpu_pool.model import MILLI_PER_GPU, Allocation, Headroom, PriorityClass, Request

# Scores rank penalty first: FGD deltas stay far below one penalty unit times this.
_PENALTY_RANK = 1e8
FGD_DECISIONS = 200
# Candidate nodes x mix shapes FGD may score for one decision (about 5 ms of numpy at the
# limit on this 2-core machine). openb's traces need 1,213 nodes x 145 to 332 shapes.
FGD_CELLS = 500_000
# Nodes x mix shapes the FGD measure may cover: it is built once over the whole fleet (a
# long-lived state keeps it, see plan_on_state) and kept up to date per placement; 6
# bytes per cell (int32 and int16 caches), 24 MB at the limit. A fleet and mix beyond it
# use best-fit.
FGD_CACHE_CELLS = 4_000_000
# FGD score points a node's place in the fixed fill order is worth (see node_cost).
ORDER_POINTS = 4.0
# FGD score points the biggest node's size is worth against the smallest's (see node_size).
SIZE_POINTS = 8.0
# The size a node that alone can hold some shape of the mix counts as, against the largest
# node's 1 (see keep_whole).
SOLE_HOST_SIZE = 2.0
# A mix shape at most this share of the nodes can hold is scarce (see node_order).
SCARCE_HOSTS = 0.05
# FGD score points the most a placement may lengthen a node's busy time is worth, and the
# busy time (seconds) that counts as that most (see node_cost and lifetime_points).
LIFETIME_POINTS = 5.0
LIFETIME_SPAN_S = 30 * 86400.0
# FGD score points a GPU model wholly claimed by the work that names it costs a placement
# there (see model_pressure).
MODEL_POINTS = 8.0
# From this many decisions a cycle keeps fit masks (see candidate_rows): building one costs
# a pass over the fleet, which a cycle of a few decisions never earns back.
FIT_MASK_DECISIONS = 64


@dataclass
class HeadroomScope:
    """One headroom of the policy over a layout (see *headroom scope* above)."""

    headroom: Headroom
    rows: np.ndarray  # bool per row: the nodes it covers (up or not)
    budget: int  # whole GPUs non-critical work may still take on covered up rows

    @property
    def label(self) -> str:
        """"4 A100 GPUs on group core" (what is kept free, and where)."""
        h = self.headroom
        what = f"{h.gpus} {h.gpu_model} GPUs" if h.gpu_model else f"{h.gpus} GPUs"
        return f"{what} on group {h.node_group}" if h.node_group else f"{what} fleet-wide"


def headroom_scopes(state: FleetState, headrooms: Sequence[Headroom]) -> list[HeadroomScope]:
    """The scopes of ``headrooms`` (those keeping at least one GPU) over ``state``."""
    out = []
    for h in headrooms:
        if h.gpus <= 0:
            continue
        rows = np.fromiter((h.covers(n) for n in state.layout.nodes), dtype=bool,
                           count=state.size)
        out.append(HeadroomScope(h, rows, int(state.whole_free[rows & state.up].sum()) - h.gpus))
    return out


@dataclass
class Cycle:
    """Mutable working state of one pass; owns its :class:`FleetState` copy.

    ``budget``: whole GPUs non-critical work may still take this cycle, starting at
    ``whole-free GPUs on up nodes - headroom``: non-critical work never takes the last
    ``headroom`` whole GPUs, critical work may take any.
    """

    state: FleetState
    remaining: np.ndarray
    headroom: int
    mix: WorkloadMix | None
    budget: int | None = None
    decisions: int = 1  # requests this cycle will place: sizes the FGD budget
    scopes: list[HeadroomScope] = field(default_factory=list)  # headroom per model/group
    # Per row: seconds from now until the last known work there ends (0: none runs; inf:
    # work without a time limit); None: not known, placement ignores lifetimes.
    ends: np.ndarray | None = None
    _frag: FleetFragmentation | None = field(default=None, repr=False)
    _blocks: tuple[int, int] | None = field(default=None, repr=False)

    _scope_of: list[tuple[int, ...]] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.budget is None:
            self.budget = self.state.whole_free_up() - self.headroom

    def clone(self) -> Cycle:
        return Cycle(self.state.copy(), self.remaining.copy(), self.headroom, self.mix,
                     self.budget, self.decisions,
                     [HeadroomScope(x.headroom, x.rows, x.budget) for x in self.scopes],
                     None if self.ends is None else self.ends.copy(), _scope_of=self._scope_of)

    @property
    def scope_of(self) -> list[tuple[int, ...]]:
        """Per row, the indices of the scopes covering it (static: built once, shared by
        clones)."""
        if self._scope_of is None:
            cover = [np.flatnonzero(x.rows) for x in self.scopes]
            table: list[tuple[int, ...]] = [()] * self.state.size
            for i, rows in enumerate(cover):
                for row in rows.tolist():
                    table[row] = (*table[row], i)
            self._scope_of = table
        return self._scope_of

    def scope_ok(self, request: Request, rows: np.ndarray,
                 share_cols: np.ndarray | None = None) -> np.ndarray:
        """Per row of ``rows``: one part of non-critical ``request`` there leaves every
        scope covering the row its headroom (all True without scopes or for critical work)."""
        ok = np.ones(len(rows), dtype=bool)
        if not self.scopes or request.priority is PriorityClass.CRITICAL or not request.gpus:
            return ok
        st = self.state
        if share_cols is not None:
            need = (st.gpu_free[rows, share_cols] == MILLI_PER_GPU).astype(np.int64)
        else:
            need = np.full(len(rows), request.gpus, dtype=np.int64)
        free = need == 0  # a share on a GPU already in use takes no whole GPU
        for x in self.scopes:
            ok &= ~(x.rows[rows] & st.up[rows]) | free | (x.budget >= need)
        return ok

    def adjust_budgets(self, row: int, sign: int) -> None:
        """Take (``sign=-1``) or give back (``+1``) a row's whole-free GPUs from every
        headroom budget covering it: a row closed to new work (a reservation) holds none of
        the GPUs kept free."""
        whole = int(self.state.whole_free[row])
        if self.budget is not None:
            self.budget += sign * whole
        for i in self.scope_of[row] if self.scopes else ():
            self.scopes[i].budget += sign * whole

    def fragmentation(self, candidates: int) -> FleetFragmentation | None:
        """The FGD measure, when the cycle can afford it (else best-fit decides).

        FGD costs O(candidates x shapes) per decision plus a refresh per placement: fine
        for the simulator's cycles (1 to 50 decisions over 1,213 nodes x up to 332 shapes),
        not for a heartbeat with thousands of decisions, which uses best-fit instead. The rule
        depends only on the cycle's size, so a given snapshot is always planned one way.
        """
        if self.mix is None or not len(self.mix) or self.decisions > FGD_DECISIONS:
            return None
        if candidates * len(self.mix) > FGD_CELLS:
            return None
        if self._frag is None:
            if len(self.mix) * self.state.size > FGD_CACHE_CELLS:
                return None
            self._frag = self.state.fragmentation(self.mix)
        return self._frag

    def release(self, parts: Sequence[NodeAssignment]) -> None:
        """Give capacity back (a preemption); quota and headroom budgets stay as they are."""
        self.state.release(parts)
        self._blocks = None

    def max_block(self, request: Request) -> int:
        """An upper bound on the GPUs one part of ``request`` could get on any up node now
        (0 when it cannot get its share anywhere): rejects hopeless requests in O(1).

        Computed once and kept across placements, which only take capacity away, so it
        stays an upper bound; :meth:`release` and a failed search refresh it.
        """
        if self._blocks is None:
            up = self.state.up
            whole = int(self.state.whole_free[up].max(initial=0))
            share = int(self.state.gpu_free[up].max(initial=0))
            self._blocks = (whole, share)
        whole, share = self._blocks
        if request.is_share:
            return 1 if share >= request.gpu_milli else 0
        return whole if request.gpus else 0

    def charge(self, request: Request, choice: Choice, whole_taken: int,
               per_row: Sequence[tuple[int, int]] = ()) -> None:
        """Book a commit on the budgets: ``whole_taken`` whole-free GPUs of up nodes against
        the headroom (non-critical work only), ``per_row`` (row, whole-free GPUs taken)
        against the scopes covering each row, the part's milli against each part's quota."""
        if request.priority is not PriorityClass.CRITICAL:
            assert self.budget is not None
            self.budget -= whole_taken
            if self.scopes:
                scope_of = self.scope_of
                for row, taken in per_row:
                    for i in scope_of[row]:
                        self.scopes[i].budget -= taken
        for g in choice.groups:
            if g >= 0:
                self.remaining[g] -= request.gpus * request.gpu_milli

    def commit(self, request: Request, choice: Choice) -> Placement:
        st = self.state
        parts = []
        up_rows = [r for r in choice.rows if st.up[r]]
        before = [int(st.whole_free[r]) for r in up_rows]
        whole_before = sum(before)
        gpu_index = st.layout.gpu_index
        milli = request.gpu_milli if request.gpus else 0
        for row, cols in zip(choice.rows, choice.cols, strict=True):
            index = gpu_index[row].tolist()
            idx = tuple(index[c] for c in cols)
            parts.append(NodeAssignment(
                node=st.layout.names[row], gpu_indices=idx, gpu_milli=milli,
                cpu_milli=request.cpu_milli, memory_mib=request.memory_mib))
        st.take_columns(choice.rows, choice.cols, milli, request.cpu_milli,
                        request.memory_mib)
        per_row = [(r, b - int(st.whole_free[r])) for r, b in zip(up_rows, before, strict=True)]
        if self.ends is not None:
            limit = (request.time_limit.total_seconds() if request.time_limit is not None
                     else math.inf)
            for row in choice.rows:
                self.ends[row] = max(self.ends[row], limit)
        self.charge(request, choice, whole_before - sum(int(st.whole_free[r]) for r in up_rows),
                    per_row)
        return Placement(request.name, tuple(parts), cross_zone=choice.cross_zone,
                         transfer_seconds=choice.transfer_seconds)


class Choice(NamedTuple):
    """Where a request would go: its rows and columns, the quota group of each part, its
    value and data move. A named tuple: a large cycle builds one per decision."""

    rows: tuple[int, ...]
    cols: tuple[tuple[int, ...], ...]
    groups: tuple[int, ...]
    value: int
    cross_zone: bool
    transfer_seconds: float


def candidate_rows(cycle: Cycle, request: Request, view: RequestView, groups: np.ndarray,
                   rows: np.ndarray | None = None, masks: bool = True) -> np.ndarray:
    """Rows (sorted) where one part of ``request`` fits now; ``rows`` restricts the search.

    Capacity is checked directly on ``rows`` in a small cycle; a cycle of at least
    :data:`FIT_MASK_DECISIONS` decisions reads it from the state's fit mask of the part's
    shape instead (built once over the fleet, then kept up to date as placements commit,
    see :meth:`FleetState.fits`). Quota is checked on what is left.
    """
    st = cycle.state
    if masks and cycle.decisions >= FIT_MASK_DECISIONS:
        fits = st.fits(request.gpus, request.gpu_milli, request.cpu_milli, request.memory_mib)
        if rows is None:
            rows = np.flatnonzero(view.compatible & view.zone_ok & fits)
        else:
            rows = rows[fits[rows]]
    else:
        if rows is None:
            rows = np.flatnonzero(view.compatible & view.zone_ok)
        ok = st.up[rows] & (st.cpu_free[rows] >= request.cpu_milli) & (
            st.mem_free[rows] >= request.memory_mib)
        if request.gpus > 0:
            if request.is_share:
                ok &= (st.gpu_free[rows] >= request.gpu_milli).any(axis=1)
            else:
                ok &= st.whole_free[rows] >= request.gpus
        rows = rows[ok]
    if request.gpus > 0 and len(rows):
        g = groups[rows]
        part = request.gpus * request.gpu_milli
        quota_ok = g == UNLIMITED
        if len(cycle.remaining):
            quota_ok |= (g >= 0) & (cycle.remaining[np.maximum(g, 0)] >= part)
        rows = rows[quota_ok]
    return rows


def _tightest_cols(st: FleetState, rows: np.ndarray, milli: int) -> np.ndarray:
    free = st.gpu_free[rows]
    return np.where(free >= milli, free, MILLI_PER_GPU + 1).argmin(axis=1)


def node_order(state: FleetState, mix: WorkloadMix | None = None) -> np.ndarray:
    """Per row a fixed rank in [0, 1): the order in which :func:`node_cost` prefers to fill
    nodes. Fixed, so placements keep going to the same nodes and leave the others whole
    (first-fit consolidation, as deterministic as the rest of the plan); scrambled by the
    CRC-32 of the node's name, so it favours no model and no node size.

    With a workload ``mix``, nodes that can hold a *scarce* shape of it come last: a shape
    that at most :data:`SCARCE_HOSTS` of the fleet's nodes could hold even when empty (an
    8-GPU task asking 120 cores and 700 GiB that only the biggest nodes take). Filling
    them last keeps them free for the work only they can run; within each tier the
    scrambled order stands. Measured in the openb replay (fleet share 0.004, the default
    trace): the longest waits of high and normal tasks fell from 563,157 and 923,723 s to
    63,117 and 38,304 s (a 20-core CPU-only task had taken the one node the big tasks fit,
    for ten days); online packing medians rose by at most 0.07 point
    (docs/benchmarks/openb.md).
    """
    layout = state.layout
    rank = layout.views.get("node_order")
    if rank is None:
        rank = np.array([zlib.crc32(n.encode()) for n in layout.names],
                        dtype=np.float64) / 2.0**32
        layout.views["node_order"] = rank
    if mix is None or not len(mix):
        return rank

    def tiered() -> np.ndarray:
        position = np.lexsort((rank, scarce_hosts(layout, mix).astype(np.float64)))
        out = np.empty(len(rank), dtype=np.float64)
        out[position] = np.arange(len(rank), dtype=np.float64) / max(len(rank), 1)
        return out

    return _per_mix(layout, "node_order_mix", mix, tiered)


def _per_mix(layout: FleetLayout, key: str, mix: WorkloadMix,
             compute: Callable[[], np.ndarray]) -> np.ndarray:
    """``compute()``, kept in ``layout.views[key]`` for one mix at a time (a queue's mix
    drifts: the last one is kept)."""
    cached = layout.views.get(key)
    if cached is not None and (cached[0] is mix or cached[0] == mix):
        return cached[1]
    value = compute()
    layout.views[key] = (mix, value)
    return value


def keep_whole(state: FleetState, mix: WorkloadMix | None = None) -> np.ndarray:
    """Per row, in (0, :data:`SOLE_HOST_SIZE`]: how much :func:`node_cost` wants the
    node kept whole, times :data:`SIZE_POINTS`: its size (:func:`node_size`), or
    :data:`SOLE_HOST_SIZE` where it is the only node that can hold some shape of ``mix``,
    however small: the one 2-GPU node of a model some tasks name must not take the work
    any node could run because it is small, and the one node an 8-GPU, 120-core task fits
    takes other work only where FGD rates it clearly better than every other node.

    The sole host counted as the largest node (1) until 2026-12-07. In the gpuspec10
    replay (seed 42) an 8-GPU, 88-core normal task with a 15-day limit then went to the
    one G3 node rather than to an empty G2 node that held it as well (costs 31.36 against
    32.31: FGD rated the G3 node 2 points better and the model pressure 0.5, the size and
    the order gave the G2 node 1.5 back), and the tasks
    only the G3 node can run waited up to 978,648 s behind it. At twice the largest
    (``bench/replay_seeds.py``, all three mixes, medians of seeds 42-51, longest wait
    high / normal / low, s): default high / normal 59 / 671 -> 59 / 58 (best-fit 59 /
    6,384); gpushare40 59 / 58 as before (best-fit's); gpuspec10 842,302 / 321,984 / 17,569 ->
    88,072 / 286,855 / 11,268 (best-fit 2,304,686 / 218,905 / 2,563,202). The full openb
    fleet has no sole host, so the packing benchmark is unchanged.

    Only the sole host, not every node of :data:`SCARCE_HOSTS`' tier (which
    :func:`node_order` puts last): measured on gpuspec10 (tasks that name a model), the
    size alone lengthened the replay's longest waits of high and low tasks (medians of
    seeds 42-51) from 978,648 / 128,524 s to 1,770,836 / 2,473,082 s, where the one node of
    a model in the fleet share took other work; counting the whole tier as the largest
    brought them to 826,598 / 567,416 s but left 4.89% of the GPUs unallocated in the
    packing benchmark, where 85 nodes of the full fleet are in the tier (4.70 without the
    size), and no node there is a sole host."""
    layout = state.layout
    if mix is None or not len(mix):
        return node_size(layout)
    return _per_mix(layout, "keep_whole_mix", mix,
                    lambda: np.maximum(node_size(layout),
                                       SOLE_HOST_SIZE * scarce_hosts(layout, mix, 0.0)))


def node_size(layout: FleetLayout) -> np.ndarray:
    """Per row, in (0, 1]: the node's size, the mean of its GPU count and its CPU cores as
    shares of the fleet's largest. :func:`node_cost` charges :data:`SIZE_POINTS` times it
    (see :func:`keep_whole`), so of two nodes FGD rates alike the smaller takes the work,
    as best-fit's does, and the big nodes stay whole for the big tasks only they can run.

    Measured with ``bench/replay_seeds.py`` (openb replay on 0.4% of the fleet, limits
    1-4x the run, medians of seeds 42-51, longest wait per class, s), without the size and
    with it at 8 points (as :func:`keep_whole` weighs it): default high / normal 31,588 /
    9,414 -> 59 / 671 (best-fit 59 / 6,384); gpushare40 63,117 / 58 -> 59 / 58 (best-fit
    59 / 58); gpuspec10 high / normal / low 978,648 / 321,984 / 128,524 -> 826,598 /
    321,984 / 567,416 (best-fit 2,304,686 / 218,905 / 2,563,202). Seeds where a class's
    longest wait exceeds best-fit's (and an hour): default 13 -> 8, gpushare40 10 -> 0.
    Mean allocation 52.98 / 47.62 / 52.95% (gpuspec10 52.94 before; best-fit 52.98 /
    47.62 / 52.98).
    """
    size = layout.views.get("node_size")
    if size is None:
        gpus = layout.gpu_count.astype(np.float64)
        cpus = layout.cpu_total.astype(np.float64)
        size = (gpus / max(float(gpus.max(initial=0.0)), 1.0)
                + cpus / max(float(cpus.max(initial=0.0)), 1.0)) / 2.0
        layout.views["node_size"] = size
    return size


def scarce_hosts(layout: FleetLayout, mix: WorkloadMix,
                 share: float = SCARCE_HOSTS) -> np.ndarray:
    """Per row: can the node, empty, hold a shape of ``mix`` that at most ``share`` of the
    nodes (at least one) could hold?"""
    n = len(layout.names)
    models = list(dict.fromkeys(layout.models))
    model_idx = np.array([models.index(m) for m in layout.models], dtype=np.int64)
    out = np.zeros(n, dtype=bool)
    for shape in mix.shapes:
        ok = (layout.cpu_total >= shape.cpu_milli) & (layout.mem_total >= shape.memory_mib)
        if shape.gpus:
            accepts = np.array([shape.accepts(m) for m in models], dtype=bool)
            ok &= (layout.gpu_count >= shape.gpus) & accepts[model_idx]
        hosts = int(ok.sum())
        if 0 < hosts <= max(1.0, share * n):
            out |= ok
    return out


def node_cost(cycle: Cycle, request: Request, rows: np.ndarray,
              share_cols: np.ndarray | None) -> np.ndarray:
    """Fragmentation cost per candidate row: lower is better, below :data:`_PENALTY_RANK`.

    ``(100 - FGD score) + ORDER_POINTS * order + SIZE_POINTS * size``: FGD's own node
    score ``trunc(100 * sigmoid(-delta / 1000))`` (delta: growth of expected fragmentation,
    milli; 0..100 points) against a fixed node order (:func:`node_order`, 0..1) worth up to
    :data:`ORDER_POINTS` points and the node's size (:func:`keep_whole`, 0..1) worth up
    to :data:`SIZE_POINTS`. A smaller node, then one earlier in the order, wins unless FGD
    rates another node that many points better: FGD's judgement where it sees a clear
    difference, best-fit's small nodes first and first-fit consolidation where it does
    not. Without an FGD measure (empty mix, or a cycle too large to afford it) best-fit on
    free GPU milli decides.

    Measured on the openb trace (unallocated GPU %, median of seeds 42-44; default /
    gpuspec10): the exact FGD delta alone packs worst (7.8 on default seed 42); FGD's score
    with best-fit ties 4.68 / 5.51 (best-fit leans to the nodes with the fewest GPUs and
    used up the 2-GPU T4 nodes that T4-only tasks need); with the fixed order as a mere
    tie-break 4.60 / 4.88; with the order worth about four points 4.47 / 4.65. With the
    size worth 8 points too, ten seeds (42-51; default / gpushare40 / multigpu20 /
    gpuspec10): 4.54 / 6.01 / 4.01 / 4.70 -> 4.53 / 5.97 / 3.95 / 4.50 online, and in
    batches of 50 4.39 / 5.89 / 3.74 / 4.68 -> 4.29 / 5.97 / 3.71 / 4.38. Every trace's
    figures are in docs/benchmarks/openb.md.

    A request with a time limit, in a cycle that knows its rows' busy times
    (:attr:`Cycle.ends`), also pays :func:`lifetime_points` (up to
    :data:`LIFETIME_POINTS`) for each row by how much it would lengthen that row's busy
    time. Without limits (the packing protocol, requests that declare none) nothing
    changes.
    """
    st = cycle.state
    frag = cycle.fragmentation(len(rows))
    if frag is None:
        return (np.maximum(st.gpu_free[rows], 0).sum(axis=1)
                - request.gpus * request.gpu_milli).astype(np.float64)
    if share_cols is not None:
        delta = frag.delta_share(rows, share_cols, request.gpu_milli,
                                       request.cpu_milli, request.memory_mib)
    else:
        delta = frag.delta_whole(rows, request.gpus, request.cpu_milli,
                                       request.memory_mib)
    score = np.trunc(100.0 / (1.0 + np.exp(np.clip(delta / 1000.0, -50.0, 50.0))))
    cost = (100.0 - score) + ORDER_POINTS * node_order(st, cycle.mix)[rows]
    if SIZE_POINTS:
        cost = cost + SIZE_POINTS * keep_whole(st, cycle.mix)[rows]
    if cycle.ends is not None and request.time_limit is not None:
        cost = cost + lifetime_points(cycle.ends[rows], request.time_limit.total_seconds())
    if MODEL_POINTS and request.gpus:
        cost = cost + MODEL_POINTS * model_pressure(st, cycle.mix)[rows]
    return cost


def model_pressure(state: FleetState, mix: WorkloadMix) -> np.ndarray:
    """Per row, in [0, 1]: how much of the node's GPU model the work that names it claims.

    Per model, the share of the mix's GPU demand (weight x GPUs x milli) that names it
    (a shape naming several models split over them by their GPUs in the fleet) over the
    model's share of the fleet's GPUs, capped at 1: 1 where the work bound to the model
    alone would fill it as fully as the whole mix fills the fleet, 0 where nothing names
    it. A shape naming every model adds the same to every model, as one naming none.

    Why (as Slurm's node ``Weight`` keeps special nodes for last): FGD alone saw too little
    of it. In the gpuspec10 replay (seed 42) long tasks that any card could run took seven
    of the eight T4 cards of the fleet share for months, so a burst of tasks naming T4
    queued behind them: a normal one waited 1,651,164 s where best-fit started it in
    12,504 s. Measured with ``bench/replay_seeds.py --mixes gpuspec10`` (medians of seeds
    42-51, longest wait high / normal / low, s) and ``gpu-pool simulate packing`` (online
    and ``--batch 50``, unallocated GPU %, seeds 42-51): 0 points 826,598 / 321,984 /
    567,416, packing 4.50 / 4.38; 4 points 978,648 / 321,984 / 72,372, packing 4.49;
    8 points 842,302 / 321,984 / 17,569, packing 4.58 / 4.46; 20 points 978,648 /
    321,984 / 7,054 (best-fit 2,304,686 / 218,905 / 2,563,202). The high and normal maxima
    left were tasks bound to the one G3 node of the share while an 8-GPU task ran there for
    eleven days; :func:`keep_whole`'s sole-host size took them down. The other traces name
    no model: their plans are unchanged."""
    layout = state.layout

    def compute() -> np.ndarray:
        out = np.zeros(len(layout.names), dtype=np.float64)
        gpus = layout.gpu_count.astype(np.float64)
        cap = {m: float(gpus[rows].sum()) for m, rows in layout.model_rows.items()
               if m is not None}
        cap = {m: c for m, c in cap.items() if c > 0}
        fleet = sum(cap.values())
        named = dict.fromkeys(cap, 0.0)
        total = 0.0
        for shape, weight in zip(mix.shapes, mix.weights, strict=True):
            if not shape.gpus:
                continue
            demand = weight * shape.gpus * shape.gpu_milli
            total += demand
            if shape.gpu_models:
                takers = [m for m in cap if m in shape.gpu_models]
                held = sum(cap[m] for m in takers)
                for m in takers:
                    named[m] += demand * cap[m] / held
        if total and fleet:
            for m, c in cap.items():
                out[layout.model_rows[m]] = min(named[m] / total / (c / fleet), 1.0)
        return out

    return _per_mix(layout, "model_pressure_mix", mix, compute)


def lifetime_points(ends: np.ndarray, limit_s: float) -> np.ndarray:
    """Per row: what a task of time limit ``limit_s`` costs for lengthening the row's busy
    time (``ends``, seconds from now until its last known work ends): 0 when it ends by
    then, up to :data:`LIFETIME_POINTS` when it lengthens it by
    :data:`LIFETIME_SPAN_S` or more, on a log scale (a minute, an hour and a day of
    lengthening differ as much as a day and a month).

    Lifetime-aware placement (as Google's LAVA, Barbalho et al., OSDI'23, places VMs by
    their predicted lifetimes): work placed beside work that outlasts it leaves no node
    pinned by one long task, and nodes empty together, so whole nodes come back for
    the big tasks; a long task on an empty node pins all of it for its whole run.

    Measured with ``bench/replay_seeds.py`` (openb replay on 0.4% of the fleet, limits
    1-4x the run, medians of seeds 42-51, longest wait high / normal, s): default 63,117 /
    38,304 without, 31,588 / 9,414 at 5 points, 63,117 / 6,384 at 10; gpushare40 63,117 /
    6,384 without, 63,117 / 58 at 5 and 10 (best-fit: 59 / 58). Seeds where a class's
    longest wait exceeds best-fit's (and an hour): default 18 -> 13, gpushare40 15 -> 10 at 5
    points. gpuspec10's low-priority longest wait rose (70,613 -> 128,524; best-fit's
    2,563,202), its high and normal stayed (978,648 / 321,984). Allocation unchanged.
    """
    longer = np.maximum(limit_s - ends, 0.0)
    return LIFETIME_POINTS * np.minimum(
        np.log1p(longer / 60.0) / math.log1p(LIFETIME_SPAN_S / 60.0), 1.0)


def row_ends(state: FleetState, allocations: Sequence[Allocation], now: datetime
             ) -> np.ndarray:
    """Per row: seconds from ``now`` until the last known work there ends (:attr:`Cycle.ends`):
    0 on an empty row; inf on a row with an allocation without ``ends_by``, or with
    capacity in use and no allocation at all; else the latest ``ends_by`` of its
    allocations."""
    layout = state.layout
    gpu = state.gpu_free
    used = ((state.cpu_free < layout.cpu_total) | (state.mem_free < layout.mem_total)
            | ((gpu >= 0) & (gpu < MILLI_PER_GPU)).any(axis=1))
    ends = np.where(used, math.inf, 0.0)
    latest: dict[int, float] = {}
    unknown: set[int] = set()
    row_of = layout.row_of
    for a in allocations:
        row = row_of.get(a.node)
        if row is None:
            continue
        if a.ends_by is None:
            unknown.add(row)
        else:
            latest[row] = max(latest.get(row, 0.0), (a.ends_by - now).total_seconds())
    for row, end in latest.items():
        if row not in unknown:
            ends[row] = max(end, 0.0)
    return ends


def fit(cycle: Cycle, request: Request, weight: int, view: RequestView, groups: np.ndarray,
        rows: np.ndarray | None = None, masks: bool = True,
        caps: tuple[np.ndarray, dict[int, int]] | None = None) -> Choice | None:
    """The greedy choice for ``request`` in ``cycle``, or None if it does not fit now.

    Searches the view's penalty levels lowest first and stops at the first level (with
    those below it) that yields a choice: the same answer as scoring every row, since the
    penalty ranks first in the score, at a fraction of the cost on large fleets.
    """
    if request.gpus > cycle.max_block(request):
        return None
    levels = view.levels if rows is None else (rows,)
    found: list[np.ndarray] = []
    count = 0
    for level in levels:
        cand = candidate_rows(cycle, request, view, groups, level, masks)
        if not len(cand):
            continue
        found.append(cand)
        count += len(cand)
        if count >= request.nodes:
            choice = _choose(cycle, request, weight, view, groups,
                             found[0] if len(found) == 1 else np.concatenate(found), caps)
            if choice is not None:
                return choice
    if rows is None:
        cycle._blocks = None  # the bound let a hopeless request through: tighten it
    return None


def _choose(cycle: Cycle, request: Request, weight: int, view: RequestView,
            groups: np.ndarray, cand: np.ndarray,
            caps: tuple[np.ndarray, dict[int, int]] | None = None) -> Choice | None:
    """The best rows of ``cand`` for ``request`` (see :func:`fit`); ``caps`` = (a code per
    row, the most parts per code) limits how many parts of a gang go to rows of one code."""
    st = cycle.state
    share_cols = _tightest_cols(st, cand, request.gpu_milli) if request.is_share else None
    if cycle.headroom and request.priority is not PriorityClass.CRITICAL and request.gpus:
        budget = cycle.budget or 0
        if share_cols is not None:
            breaks = st.gpu_free[cand, share_cols] == MILLI_PER_GPU
            keep = ~breaks | (budget >= 1) | ~st.up[cand]
            cand, share_cols = cand[keep], share_cols[keep]
        elif request.gpus * request.nodes > budget:
            return None
        if len(cand) < request.nodes:
            return None
    scoped = bool(cycle.scopes) and request.priority is not PriorityClass.CRITICAL and bool(
        request.gpus)
    if scoped:
        keep = cycle.scope_ok(request, cand, share_cols)
        cand = cand[keep]
        if share_cols is not None:
            share_cols = share_cols[keep]
        if len(cand) < request.nodes:
            return None
    score = view.penalty[cand] * _PENALTY_RANK + node_cost(cycle, request, cand, share_cols)
    part = request.gpus * request.gpu_milli
    if request.nodes == 1:
        # One part: candidate_rows already checked its quota, so the best row is the answer.
        chosen = [int(np.argmin(score))]
    else:
        chosen = []
        used: dict[int, int] = {}
        taken: dict[int, int] = {}
        spent: dict[int, int] = {}  # whole GPUs a gang's chosen parts take per scope
        for k in np.argsort(score, kind="stable"):
            g = int(groups[cand[k]])
            if g >= 0 and part and cycle.remaining[g] - used.get(g, 0) < part:
                continue
            if scoped and not _scopes_room(cycle, int(cand[k]), request.gpus, spent):
                continue
            if caps is not None:
                code = int(caps[0][cand[k]])
                if taken.get(code, 0) >= caps[1].get(code, 0):
                    continue
                taken[code] = taken.get(code, 0) + 1
            chosen.append(int(k))
            if scoped:
                _scopes_book(cycle, int(cand[k]), request.gpus, spent)
            if g >= 0:
                used[g] = used.get(g, 0) + part
            if len(chosen) == request.nodes:
                break
        if len(chosen) < request.nodes:
            return None
    rows_t = tuple(int(cand[k]) for k in chosen)
    share_t = None if share_cols is None else tuple(int(share_cols[k]) for k in chosen)
    return _make_choice(st, request, weight, view, groups, rows_t, share_t)


def _scopes_room(cycle: Cycle, row: int, gpus: int, spent: dict[int, int]) -> bool:
    """Whether a gang part of ``gpus`` whole GPUs on ``row`` fits every scope covering it
    after the parts already ``spent`` (:func:`_scopes_book` books it)."""
    return all(cycle.scopes[i].budget - spent.get(i, 0) >= gpus for i in cycle.scope_of[row])


def _scopes_book(cycle: Cycle, row: int, gpus: int, spent: dict[int, int]) -> None:
    for i in cycle.scope_of[row]:
        spent[i] = spent.get(i, 0) + gpus


def _make_choice(st: FleetState, request: Request, weight: int, view: RequestView,
                 groups: np.ndarray, rows_t: tuple[int, ...],
                 share_cols: tuple[int, ...] | None,
                 columns: tuple[tuple[int, ...], ...] | None = None) -> Choice:
    """The :class:`Choice` of ``rows_t`` (a share on each row's ``share_cols`` GPU; whole
    GPUs on the lowest fully free columns; ``columns`` when the caller chose them)."""
    if columns is not None:
        cols = columns
    elif share_cols is not None:
        cols = tuple((c,) for c in share_cols)
    elif request.gpus:
        cols = tuple(whole_columns(st.gpu_free[r].tolist(), request.gpus) for r in rows_t)
    else:
        cols = tuple(() for _ in rows_t)
    if len(rows_t) == 1:
        (r,) = rows_t
        return Choice(rows_t, cols, (int(groups[r]),),
                      part_value(weight, request, int(view.penalty[r])),
                      bool(view.cross_zone[r]), float(view.transfer[r]))
    value = sum(part_value(weight, request, int(view.penalty[r])) for r in rows_t)
    transfer = max(float(view.transfer[r]) for r in rows_t)
    return Choice(rows_t, cols, tuple(int(groups[r]) for r in rows_t), value,
                  any(bool(view.cross_zone[r]) for r in rows_t), transfer)


def fit_key(request: Request, view: RequestView, groups: np.ndarray) -> tuple:
    """Requests with equal keys fit, or not, in exactly the same states.

    A greedy pass only ever takes capacity, quota and headroom away, so a key that failed
    once fails for the rest of the pass: later requests with it are skipped unexamined.
    """
    return (request.gpus, request.gpu_milli, request.nodes, request.cpu_milli,
            request.memory_mib, view.signature, request.priority is PriorityClass.CRITICAL,
            id(groups))


def whole_columns(free: list[int], gpus: int) -> tuple[int, ...]:
    """The ``gpus`` lowest fully free columns of a node's free milli: where whole GPUs go."""
    return tuple([j for j, v in enumerate(free) if v == MILLI_PER_GPU][:gpus])


def part_columns(free: list[int], gpus: int, milli: int, share: bool) -> tuple[int, ...]:
    """The columns of a node's free milli one part takes: a share the tightest GPU that
    holds it, whole GPUs the lowest fully free ones, a CPU-only part none."""
    if share:
        return (tightest_column(free, milli),)
    if gpus == 1:
        return (free.index(MILLI_PER_GPU),)  # the lowest fully free column
    return whole_columns(free, gpus) if gpus else ()


def tightest_column(free: list[int], milli: int) -> int:
    """The column of a node's free milli with the least free at least ``milli`` (the
    lowest such column on ties): where a share goes."""
    best, col = MILLI_PER_GPU + 1, -1
    for j, v in enumerate(free):
        if milli <= v < best:
            best, col = v, j
    return col


def fgd_off(cycle: Cycle) -> bool:
    """True when no decision of ``cycle`` uses the FGD measure (best-fit decides)."""
    return cycle.mix is None or not len(cycle.mix) or cycle.decisions > FGD_DECISIONS


class BestFitChooser:
    """:func:`fit` and :meth:`Cycle.commit` for a pass without the FGD measure, without
    a pass over the fleet per decision.

    Without FGD the node choice for a part is the lowest ``(penalty, free GPU milli,
    row)`` among rows where it fits. Rows of one node group (GPU model, card memory, zone,
    bandwidth: :func:`group_codes`) share a request's penalty, data-move rule and quota
    group, so the chooser keeps each group's up rows sorted by ``(free milli, row)``. A
    decision walks the request's allowed groups lowest penalty first; in each group it
    starts at the first row with enough free milli and takes the first row the part fits
    (a gang: up to K per group, then the K best over the level, quota counted as it goes),
    skipping rows already seen not to fit this request type (within a greedy pass
    capacity, quota and the headroom budget only shrink, so such a row never fits that
    type again). Commits go to plain-list mirrors of the state, re-sorting only the rows
    they touch, and reach the state's arrays in :meth:`sync` (end of pass). Same answers
    as :func:`fit`; ``tests/engine/test_bestfit_chooser.py`` compares the two.
    """

    def __init__(self, cycle: Cycle) -> None:
        st = cycle.state
        self.cycle = cycle
        self.code = group_codes(st.layout)
        self.code_of = self.code.tolist()
        up = np.flatnonzero(st.up)
        free = np.maximum(st.gpu_free, 0).sum(axis=1)
        self.free_sum = free.tolist()
        # Plain-list mirrors of the state, kept in step by commit(): a decision reads a
        # few rows, where a list is several times cheaper than numpy scalar access.
        self.cpu = st.cpu_free.tolist()
        self.mem = st.mem_free.tolist()
        self.whole = st.whole_free.tolist()
        self.gpu = st.gpu_free.tolist()
        members: dict[int, list[tuple[int, int]]] = {}
        for row, c, f in zip(up.tolist(), self.code[up].tolist(), free[up].tolist(),
                             strict=True):
            members.setdefault(c, []).append((f, row))
        for lst in members.values():
            lst.sort()
        self.members = members
        self.rep = {c: lst[0][1] for c, lst in members.items()}
        self.levels: dict[tuple, list[list[tuple[int, int]]]] = {}  # see _levels
        # Per fit key (see _spec): the rows seen not to fit it, the codes of groups with no
        # row left that fits it (every row of enough free milli is dead: never scanned
        # again this pass), its penalty levels and shape.
        self.specs: dict[tuple, tuple] = {}
        # Per (view, quota groups, code): what a part on any row of the group is worth
        # to a request of that view: (penalty, quota group, cross zone, transfer seconds).
        self.facts: dict[tuple, tuple[int, int, bool, float]] = {}
        self.index: dict[int, list[int]] = {}  # per row: column -> device index
        self.dirty: set[int] = set()  # rows changed on the lists, not yet on the state

    def commit(self, request: Request, choice: Choice) -> Placement:
        """:meth:`Cycle.commit` of a choice of this chooser, on its lists: the state's
        arrays catch up in :meth:`sync`. Refuses an over-allocation like
        :meth:`FleetState.apply` (ValueError, nothing changed), checked on the lists."""
        cycle = self.cycle
        layout = cycle.state.layout
        milli = request.gpu_milli if request.gpus else 0
        after = []
        for row, cols in zip(choice.rows, choice.cols, strict=True):
            gpus = list(self.gpu[row])
            bad = False
            for j in cols:
                v = gpus[j] = gpus[j] - milli
                bad = bad or not 0 <= v <= MILLI_PER_GPU
            name = layout.names[row]
            if bad or (len(cols) > 1 and len(set(cols)) != len(cols)):
                raise ValueError(f"{name}: GPU milli out of range after update: "
                                 f"{[gpus[j] for j in cols]}")
            cpu = self.cpu[row] - request.cpu_milli
            mem = self.mem[row] - request.memory_mib
            if cpu < 0 or mem < 0:
                raise ValueError(f"{name}: CPU or RAM over-allocated")
            after.append((row, cols, name, gpus, cpu, mem))
        if len(after) > 1 and len({row for row, *_ in after}) != len(after):
            raise ValueError(f"{request.name}: two parts on one node")
        parts = []
        whole_taken = 0
        per_row: list[tuple[int, int]] = []
        free_sum, members, code_of, index_of = (self.free_sum, self.members, self.code_of,
                                                self.index)
        cpu_part, mem_part = request.cpu_milli, request.memory_mib
        for row, cols, name, gpus, cpu, mem in after:
            whole = gpus.count(MILLI_PER_GPU)
            whole_taken += self.whole[row] - whole
            per_row.append((row, self.whole[row] - whole))
            self.gpu[row], self.whole[row], self.cpu[row], self.mem[row] = gpus, whole, cpu, mem
            # Columns hold 0..1000 after the checks above: the node's free milli drops by
            # exactly what the part took; the row moves to its new place in its group.
            was = free_sum[row]
            now = free_sum[row] = was - milli * len(cols)
            lst = members.get(code_of[row])
            if lst is not None and now != was:
                del lst[bisect.bisect_left(lst, (was, row))]
                bisect.insort(lst, (now, row))
            self.dirty.add(row)
            index = index_of.get(row)
            if index is None:
                index = index_of[row] = layout.gpu_index[row].tolist()
            parts.append(NodeAssignment(name, tuple([index[c] for c in cols]), milli,
                                        cpu_part, mem_part))
        cycle.charge(request, choice, whole_taken, per_row)
        return Placement(request.name, tuple(parts), choice.cross_zone, choice.transfer_seconds)

    def sync(self) -> None:
        """Write the rows changed on the lists back to the state (and its caches)."""
        if not self.dirty:
            return
        st = self.cycle.state
        rows = sorted(self.dirty)
        self.dirty.clear()
        idx = np.array(rows, dtype=np.int64)
        st.gpu_free[idx] = np.array([self.gpu[r] for r in rows], dtype=np.int64)
        st.cpu_free[idx] = [self.cpu[r] for r in rows]
        st.mem_free[idx] = [self.mem[r] for r in rows]
        st._touched(rows)

    def _levels(self, view: RequestView, groups: np.ndarray
                ) -> list[list[tuple[int, int]]]:
        """Per penalty level, lowest first: the allowed groups as (code, quota group)."""
        key = (id(view), id(groups))
        levels = self.levels.get(key)
        if levels is None:
            st = self.cycle.state
            allowed = np.unique(self.code[view.compatible & view.zone_ok & st.up]).tolist()
            by_pen: dict[int, list[tuple[int, int]]] = {}
            for c in allowed:
                rep = self.rep[c]
                by_pen.setdefault(int(view.penalty[rep]), []).append((c, int(groups[rep])))
            levels = self.levels[key] = [by_pen[p] for p in sorted(by_pen)]
        return levels

    def _spec(self, request: Request, view: RequestView, groups: np.ndarray) -> tuple:
        """What every request of one fit key shares, read once per key: its dead rows and
        exhausted groups, its penalty levels and its shape."""
        gpus = request.gpus
        return (set(), set(), self._levels(view, groups), gpus, request.gpu_milli,
                request.cpu_milli, request.memory_mib, request.nodes, request.is_share,
                gpus * request.gpu_milli, request.priority is PriorityClass.CRITICAL,
                effective_milli(request))

    def fit(self, request: Request, weight: int, view: RequestView,
            groups: np.ndarray, key: tuple | None = None,
            only: Container[int] | None = None,
            caps: dict[int, int] | None = None) -> Choice | None:
        """:func:`fit`; ``key``: the request's :func:`fit_key` when the caller has it;
        ``only``: the node-group codes (:func:`group_codes`) its parts may take; ``caps``:
        the most parts of a gang per code."""
        key = key or fit_key(request, view, groups)
        spec = self.specs.get(key)
        if spec is None:
            spec = self.specs[key] = self._spec(request, view, groups)
        dead, exhausted, levels, gpus, milli, cpu, mem, k, share, part, critical, eff = spec
        cycle = self.cycle
        if gpus > cycle.max_block(request):
            return None
        headroom = cycle.headroom
        if (headroom and not critical and gpus and not share
                and gpus * k > (cycle.budget or 0)):
            return None
        guard = share and bool(headroom and not critical and (cycle.budget or 0) < 1)
        # Headroom per model/group: rows under a scope check its budget (None: no scopes).
        scope_of = cycle.scope_of if cycle.scopes and not critical and gpus else None
        scopes = cycle.scopes
        spent: dict[int, int] = {}  # a gang's chosen parts' whole GPUs per scope
        remaining = cycle.remaining
        quota = len(remaining) > 0
        cpu_free, mem_free, whole, gpu = self.cpu, self.mem, self.whole, self.gpu
        members = self.members
        low = (part if gpus else 0, -1)
        chosen: list[tuple[int, int]] = []  # a gang's parts so far, best first
        used: dict[int, int] = {}  # quota milli a gang's chosen parts take per quota group
        best_code = -1
        for level in levels:
            best: tuple[int, int] | None = None
            found: list[tuple[tuple[int, int], int, int]] = []  # gang: (entry, code, quota)
            for c, g in level:
                if c in exhausted or (only is not None and c not in only):
                    continue
                if gpus > 0 and g != UNLIMITED and not (g >= 0 and quota
                                                        and remaining[g] >= part):
                    continue
                lst = members[c]
                taken = 0
                for i in range(bisect.bisect_left(lst, low), len(lst)):
                    entry = lst[i]
                    if k == 1 and best is not None and entry >= best:
                        break
                    row = entry[1]
                    if row in dead:
                        continue
                    ok = cpu_free[row] >= cpu and mem_free[row] >= mem
                    if ok and gpus > 0:
                        if share:
                            fits = [v for v in gpu[row] if v >= milli]
                            ok = bool(fits) and not (guard and min(fits) == MILLI_PER_GPU)
                            if ok and scope_of is not None and scope_of[row]:
                                ok = min(fits) < MILLI_PER_GPU or all(
                                    scopes[i].budget >= 1 for i in scope_of[row])
                        else:
                            ok = whole[row] >= gpus
                            if ok and scope_of is not None and scope_of[row]:
                                ok = all(scopes[i].budget >= gpus for i in scope_of[row])
                    if not ok:
                        dead.add(row)
                        continue
                    if k == 1:
                        best, best_code = entry, c
                        break
                    found.append((entry, c, g))
                    taken += 1
                    if taken >= k:  # a gang never takes more than k rows of one group
                        break
                else:
                    if not taken:  # scanned to the end: no row of the group fits any more
                        exhausted.add(c)
            if k == 1 and best is not None:
                # One part on a row of group ``best_code``: the group's facts serve.
                row = best[1]
                cols = part_columns(gpu[row], gpus, milli, share)
                fkey = (id(view), id(groups), best_code)
                facts = self.facts.get(fkey)
                if facts is None:
                    facts = self.facts[fkey] = (int(view.penalty[row]), int(groups[row]),
                                                bool(view.cross_zone[row]),
                                                float(view.transfer[row]))
                penalty, g, cross, transfer = facts
                return Choice((row,), (cols,), (g,), eff * (VALUE_SCALE * weight - penalty),
                              cross, transfer)
            for entry, c, g in sorted(found):
                if g >= 0 and part and remaining[g] - used.get(g, 0) < part:
                    continue
                if scope_of is not None and not _scopes_room(cycle, entry[1], gpus, spent):
                    continue
                if caps is not None:
                    if caps.get(c, 0) <= 0:
                        continue
                    caps = {**caps, c: caps[c] - 1}
                chosen.append(entry)
                if scope_of is not None:
                    _scopes_book(cycle, entry[1], gpus, spent)
                if g >= 0:
                    used[g] = used.get(g, 0) + part
                if len(chosen) == k:
                    return self._gang_choice(request, weight, view, groups,
                                             [e[1] for e in chosen])
        if only is None:  # an unrestricted search failed: the bound let it through, tighten
            cycle._blocks = None
        return None

    def _gang_choice(self, request: Request, weight: int, view: RequestView,
                     groups: np.ndarray, rows: list[int]) -> Choice:
        cols = tuple(part_columns(self.gpu[row], request.gpus, request.gpu_milli,
                                  request.is_share) for row in rows)
        return _make_choice(self.cycle.state, request, weight, view, groups, tuple(rows),
                            None, cols)


def group_codes(layout: FleetLayout) -> np.ndarray:
    """Per row a node-group code: equal for rows of equal GPU model, card memory, zone and
    bandwidth, which every request sees alike (penalty, data move, quota group)."""
    codes = layout.views.get("group_codes")
    if codes is None:
        pairs: dict[tuple, int] = {}
        codes = np.array([pairs.setdefault((m, int(mem), z, float(bw)), len(pairs))
                          for m, mem, z, bw in zip(layout.models, layout.gpu_memory,
                                                   layout.zones, layout.bandwidth,
                                                   strict=True)], dtype=np.int64)
        layout.views["group_codes"] = codes
    return codes


def greedy_order(requests: Sequence[Request], weights: dict[str, int],
                 usage: Mapping[str, float] | None = None) -> list[Request]:
    """Most valuable first (see the module docstring); deterministic. ``usage``: decayed
    GPU-hours per team (fair share; None or empty: off).

    Larger whole-GPU requests first (8-GPU work before the 1-GPU work that would split
    its nodes), but GPU shares by age, not largest first: in batches of 50 arrivals of the
    openb trace made 80 % shares (packing, seed 42), largest first, shares too, left
    13.15 % of the GPUs unallocated against 10.86 % in arrival order (see
    :func:`best_greedy`)."""
    return _ranked(requests, weights, usage, lambda r: 0 if r.is_share else -r.total_gpu_milli)


def _ranked(requests: Sequence[Request], weights: dict[str, int],
            usage: Mapping[str, float] | None, size: Callable[[Request], int]) -> list[Request]:
    """``requests`` by aged weight, then (fair share) the team's decayed use, then
    ``size``, then submission time and name: every order a cycle tries differs only in
    ``size``."""
    use = usage or {}

    def key(r: Request) -> tuple:
        t = r.submitted_at.timestamp() if r.submitted_at else float("-inf")
        return (-weights[r.name], use.get(r.team, 0.0), size(r), t, r.name)
    return sorted(requests, key=key)


def other_greedy_orders(requests: Sequence[Request], weights: dict[str, int],
                        usage: Mapping[str, float] | None = None
                        ) -> list[tuple[list[Request], bool]]:
    """The orders a small cycle tries besides :func:`greedy_order` (:func:`best_greedy`),
    each with whether it may win on fragmentation alone: within equal weight (then fair
    share), oldest first and smallest first (they may), then larger first, shares too
    (only by placing more value). Weight always ranks first."""
    return [(_ranked(requests, weights, usage, lambda r: 0), True),
            (_ranked(requests, weights, usage, lambda r: r.total_gpu_milli), True),
            (_ranked(requests, weights, usage, lambda r: -r.total_gpu_milli), False)]


def best_greedy(start: Cycle, ordered: Sequence[Request], weights: dict[str, int],
                views: dict[str, RequestView], groups: dict[str, np.ndarray],
                usage: Mapping[str, float] | None = None, in_place: bool = False
                ) -> tuple[Cycle, list[Placement], int]:
    """Greedy over ``ordered`` (:func:`greedy_order` of the eligible requests), and, when the
    cycle affords the FGD measure and has more than one request, over the
    :func:`other_greedy_orders` too: the plan of highest
    value wins, equal values go to the one that leaves the fleet least fragmented (FGD's
    expected fragmentation summed over nodes; not larger first, see below), then to the
    first order. Deterministic.

    One order alone is a gamble on the queue: larger-first packs a batch of shares and
    whole GPUs worse than arrival order on the openb trace (4.9 against 4.4 % unallocated
    with 50 arrivals per cycle, seeds 42-43), and neither wins every cycle. Largest first,
    shares too, wins on the FGD measure of the batch's end state and loses on what the
    next batches can still place: with it as the first order and any order winning on
    fragmentation, 50-arrival batches of the trace made 80 % shares left 11.65 % of the
    GPUs unallocated (seed 42), arrival order alone 10.86 %, the orders of today 10.80 %;
    larger first still wins a cycle where it places more (a half share before a quarter
    that would break a whole GPU kept as headroom).

    ``in_place``: the caller needs ``start`` no more when it holds a single request, so that
    request is placed on ``start`` rather than on a copy (a per-arrival decision of the
    simulator copies the fleet and its FGD measure once instead of twice).
    """
    work = start if in_place and len(ordered) < 2 else start.clone()
    placements, value = run_greedy(work, ordered, weights, views, groups)
    if len(ordered) < 2 or start.fragmentation(1) is None:
        return work, placements, value
    frag = work.fragmentation(1)
    best = (value, -frag.fleet_fragment() if frag is not None else 0.0)
    seen = {tuple(r.name for r in ordered)}
    for order, on_fragmentation in other_greedy_orders(ordered, weights, usage):
        key = tuple(r.name for r in order)
        if key in seen:
            continue
        seen.add(key)
        trial = start.clone()
        trial_placements, trial_value = run_greedy(trial, order, weights, views, groups)
        trial_frag = trial.fragmentation(1)
        score = (trial_value, -trial_frag.fleet_fragment() if trial_frag is not None else 0.0)
        if score[0] > best[0] or (on_fragmentation and score[0] == best[0]
                                  and score[1] > best[1] + 1e-6):
            work, placements, value, best = trial, trial_placements, trial_value, score
    return work, placements, value


def run_greedy(cycle: Cycle, ordered: Sequence[Request], weights: dict[str, int],
               views: dict[str, RequestView], groups: dict[str, np.ndarray]
               ) -> tuple[list[Placement], int]:
    """Place ``ordered`` one by one into ``cycle`` (mutated); placements and total value."""
    placements: list[Placement] = []
    total = 0
    failed: set[tuple] = set()
    chooser = BestFitChooser(cycle) if fgd_off(cycle) else None
    for r in ordered:
        key = fit_key(r, views[r.name], groups[r.name])
        if key in failed:
            continue
        if chooser is not None:
            choice = chooser.fit(r, weights[r.name], views[r.name], groups[r.name], key)
        else:
            choice = fit(cycle, r, weights[r.name], views[r.name], groups[r.name])
        if choice is None:
            failed.add(key)
            continue
        if chooser is None:
            placements.append(cycle.commit(r, choice))
        else:
            placements.append(chooser.commit(r, choice))
        total += choice.value
    if chooser is not None:
        chooser.sync()
    return placements, total

