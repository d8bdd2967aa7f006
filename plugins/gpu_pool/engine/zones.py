"""Cross-zone only when it pays: each cycle, whether a request's data may move to another zone.

Terms
-----
home zone
    The zone of a request's dataset (``Dataset.zone``). A request without one, or whose
    every compatible node is in its home zone, is never looked at here (it costs nothing).
transfer ``t(z)``
    Seconds to move the dataset to a node in zone ``z``: size (GiB x 1024 MB) divided by
    ``policy.zone_links[(home, z)]`` (MB/s) when that link is listed, else by the node's own
    ``bandwidth_mb_s`` (computed per row in :func:`gpu_pool.engine.objective.build_view`).
expected home wait ``W``
    How long until the request would fit in its home zone, from the active allocations'
    ``ends_by`` (start + time limit): the holds on the compatible up nodes of the home zone
    are released in end order onto their free capacity now (an allocation without
    ``ends_by`` never ends for the estimate; one past its ``ends_by`` ends now), counting
    the parts of its shape each node then holds. The queue ahead of it is accounted for,
    within its type: the ``i``-th request of a type in the cycle's order (priority, size,
    age) waits for the ``i``-th part's room (a gang of ``k`` nodes for ``k`` parts on
    distinct nodes, one per node). Infinite when the known ends never make that room.
    Other types' pending work is ignored, and so are quotas and headroom, which do not
    depend on the zone.

Rules
-----
* The home zone has room for it now (``W = 0``, the requests of its type ahead of it
  counted): no move.
* Otherwise a node in zone ``z`` is allowed when ``t(z) <= policy.max_transfer_seconds``
  (the flat cap) and ``W >= t(z) * (1 + policy.cross_zone_margin)``. A placement's
  ``expected_wait_saved_s`` is ``W`` and its ``transfer_seconds`` the largest ``t`` of its
  nodes, so every cross-zone placement has ``expected_wait_saved_s >= transfer_seconds *
  (1 + margin)``.
* The plan may give the room at home to other work (other types are not counted above):
  a request kept home that the plan leaves waiting is decided again against what the plan
  left (:mod:`gpu_pool.engine.plan`, step 5), as the next cycle would.
* Cost: nothing for a request whose static view moves no data; else one walk of the home
  zone's holds per request type (the static view, shared by identical requests) per cycle,
  stopped as soon as the type's requests have their room, and a few variants of the view
  per type (one per distinct transfer threshold passed), shared by its requests.
  ``bench/placement_scale.py`` 5,000 x 2,500 (no hold has an end there): 12 ms of a
  0.17-0.19 s greedy cycle; the same queue and fleet with every hold and request given a
  time limit (1-12 h), 20,000 x 10,000: 0.19-0.27 s of a 0.95-1.08 s greedy cycle (both
  looks, 60 request types walked).

Invariants: nothing here changes its inputs; the narrowed view differs from the static one
only in ``zone_ok``, ``signature`` and ``levels``, so every planner reads it unchanged.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from gpu_pool.engine.capacity import FleetLayout, FleetState
from gpu_pool.engine.objective import RequestView, view_levels
from gpu_pool.engine.types import Placement
from gpu_pool.model import MILLI_PER_GPU, Allocation, Policy, Request


@dataclass(frozen=True)
class ZoneCall:
    """The cycle's decision on moving the data of the requests of one type whose waits
    pass the same thresholds (a variant of the type's view) out of their home zone."""

    home: str
    size_gib: float
    # Expected home wait W of the variant's first request (0: room now; inf: no known end
    # makes room); each request's own is in Decision.waits.
    wait_s: float
    base: RequestView  # the static view: every move within the cap
    view: RequestView  # the view this cycle plans with (moves that pay)
    # The cheapest move not allowed (zone, transfer s), if the home zone has no room now.
    refused: tuple[str, float] | None = None

    def anywhere(self) -> RequestView:
        """The view with every compatible node allowed, the cap ignored: where the request
        would fit if its data could go anywhere (for its reason)."""
        ones = np.ones_like(self.base.zone_ok)
        return replace(self.base, zone_ok=ones,
                       levels=view_levels(self.base.compatible, ones, self.base.penalty))


def _duration(seconds: float) -> str:
    """``9 min``, ``2.1 h``, ``40 s``: how a person says a wait or a transfer."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f}".removesuffix(".0") + " h"
    return f"{seconds / 86400:.1f}".removesuffix(".0") + " days"


def _size(gib: float) -> str:
    return f"{gib / 1024:.1f} TiB" if gib >= 1024 else f"{gib:g} GiB"


def move_note(call: ZoneCall, to_zones: Sequence[str], transfer_s: float) -> str:
    """The sentence of a cross-zone placement."""
    where = ", ".join(sorted(set(to_zones)))
    head = (f"moves {_size(call.size_gib)} from {call.home} to {where}: "
            f"{_duration(transfer_s)} transfer")
    if math.isinf(call.wait_s):
        return (f"{head}; no GPUs in {call.home} free up at a known time (its holds have "
                "no time limit)")
    return f"{head}, saves ~{_duration(call.wait_s)} of waiting"


def annotate(placement: Placement, call: ZoneCall, wait_s: float,
             layout: FleetLayout) -> Placement:
    """``placement`` (cross-zone) with the wait it was to save and its sentence."""
    to = [layout.zones[layout.row_of[a.node]] for a in placement.assignments]
    call = replace(call, wait_s=wait_s)
    note = move_note(call, [z for z in to if z != call.home], placement.transfer_seconds)
    return replace(placement, expected_wait_saved_s=wait_s,
                   note=f"{placement.note}; {note}" if placement.note else note)


def refusal(call: ZoneCall, policy: Policy) -> str:
    """The sentence of a request held for its data's zone although it would fit elsewhere."""
    assert call.refused is not None
    zone, transfer = call.refused
    if transfer > policy.max_transfer_seconds:
        return _too_far(call.home, _size(call.size_gib), zone, transfer,
                        policy.max_transfer_seconds)
    return (f"waits for its data's zone {call.home}: moving {_size(call.size_gib)} to {zone} "
            f"would take {_duration(transfer)}, saving only ~{_duration(call.wait_s)} "
            f"(a move must save {1 + policy.cross_zone_margin:g}x its transfer time)")


def _too_far(home: str, size: str, zone: str, transfer: float, limit_s: float) -> str:
    return (f"waits for its data's zone {home}: moving {size} to {zone} would take "
            f"{_duration(transfer)}, over the {_duration(limit_s)} limit on a transfer")


def over_cap(request: Request, view: RequestView, layout_zones: Sequence[str],
             limit_s: float) -> str:
    """The sentence of a request whose data is too far from every compatible node."""
    ds = request.dataset
    rows = np.flatnonzero(view.compatible)
    best = int(rows[np.argmin(view.transfer[rows])])
    home = ds.zone if ds is not None and ds.zone else "?"
    size = _size(ds.size_gib) if ds is not None else "its data"
    return _too_far(home, size, layout_zones[best], float(view.transfer[best]), limit_s)


class Holds:
    """Holds with a known end per row, in end order (seconds from now): the active
    allocations' (an allocation without ``ends_by`` never frees anything and is left out),
    plus, for the second look, this cycle's placements until their time limits. Built once
    per cycle, on first use (:func:`decide` with ``holds=None``)."""

    def __init__(self, layout: FleetLayout,
                 by_row: dict[int, list[tuple[float, tuple[int, ...], int, int, int]]]) -> None:
        self.layout = layout
        self.by_row = by_row
        self._with = np.zeros(len(layout.names), dtype=bool)
        self._with[list(by_row)] = True

    @classmethod
    def of(cls, layout: FleetLayout, allocations: Sequence[Allocation], now: datetime,
           ends: Callable[[Allocation], float] | None = None) -> Holds:
        """The holds of ``allocations`` with an ``ends_by``, ending ``ends(a)`` seconds from
        now (default: at ``ends_by``)."""
        by_row: dict[int, list[tuple[float, tuple[int, ...], int, int, int]]] = defaultdict(list)
        row_of, column_of = layout.row_of, layout.column_of
        for a in allocations:
            if a.ends_by is None:
                continue
            row = row_of.get(a.node)
            if row is None:
                continue
            cols = column_of[row]
            end = ends(a) if ends is not None else (a.ends_by - now).total_seconds()
            by_row[row].append((max(end, 0.0),
                                tuple([cols[i] for i in a.gpu_indices if i in cols]),
                                a.gpu_milli, a.cpu_milli, a.memory_mib))
        for holds in by_row.values():
            holds.sort(key=_end)
        return cls(layout, by_row)

    def plus(self, placed: Sequence[tuple[Placement, Request]], rows: np.ndarray | None = None,
             ends: Callable[[float], float] | None = None) -> Holds:
        """These holds and those of ``placed`` on ``rows`` (a row mask; None: all) — this
        cycle's placements, until their requests' time limits (none: for ever), or
        ``ends(limit seconds)`` seconds from now; rows without a new hold are shared, not
        copied."""
        layout = self.layout
        by_row = dict(self.by_row)
        touched = set()
        for p, r in placed:
            if r.time_limit is None:
                continue
            limit = r.time_limit.total_seconds()
            end = ends(limit) if ends is not None else limit
            for part in p.assignments:
                row = layout.row_of[part.node]
                if rows is not None and not rows[row]:
                    continue
                cols = layout.column_of[row]
                if row not in touched:
                    by_row[row] = list(by_row.get(row, ()))
                    touched.add(row)
                by_row[row].append((end,
                                    tuple(cols[i] for i in part.gpu_indices),
                                    part.gpu_milli, part.cpu_milli, part.memory_mib))
        for row in touched:
            by_row[row].sort(key=_end)
        return Holds(layout, by_row)

    def rows_in(self, rows: np.ndarray) -> list[int]:
        """Those of ``rows`` with a hold that ends."""
        return rows[self._with[rows]].tolist()


def _end(hold: tuple) -> float:
    return hold[0]


def _parts_now(request: Request, st: FleetState, rows: np.ndarray, cap: int) -> np.ndarray:
    """:func:`_parts` of each of ``rows`` in the free capacity of ``st``."""
    n = np.full(rows.size, cap, dtype=np.int64)
    if request.cpu_milli:
        n = np.minimum(n, st.cpu_free[rows] // request.cpu_milli)
    if request.memory_mib:
        n = np.minimum(n, st.mem_free[rows] // request.memory_mib)
    if request.gpus > 0:
        if request.is_share:
            per = (np.maximum(st.gpu_free[rows], 0) // request.gpu_milli).sum(axis=1)
        else:
            per = st.whole_free[rows] // request.gpus
        n = np.minimum(n, per)
    return np.maximum(n, 0)


def _parts(request: Request, gpu: list[int], cpu: int, mem: int, cap: int) -> int:
    """How many parts of ``request`` fit on one node with this free capacity (at most cap);
    ``gpu``: free milli per GPU (-1: no GPU there). Plain Python: called per hold ending."""
    n = cap
    if request.cpu_milli:
        n = min(n, cpu // request.cpu_milli)
    if request.memory_mib:
        n = min(n, mem // request.memory_mib)
    if request.gpus <= 0 or n <= 0:
        return max(n, 0)
    if request.is_share:
        milli = request.gpu_milli
        return min(n, sum(g // milli for g in gpu if g > 0))
    return min(n, gpu.count(MILLI_PER_GPU) // request.gpus)


def release_gpus(gpu: list[int], cols: Sequence[int], milli: int) -> None:
    """Give ``milli`` back to each of the columns ``cols`` of ``gpu`` (free milli per GPU,
    changed in place), never past a whole card."""
    for col in cols:
        gpu[col] = min(gpu[col] + milli, MILLI_PER_GPU)


def _release_together(mine: list, i: int, gpu: list[int]) -> tuple[int, int, int]:
    """Release the holds of ``mine`` (one row's, in end order) from ``i`` on that end at
    the same moment: their GPU milli back onto ``gpu`` (changed in place). Returns the
    index after them and the CPU and RAM they free."""
    at = mine[i][0]
    cpu = mem = 0
    while i < len(mine) and mine[i][0] == at:
        _, cols, milli, c, m = mine[i]
        release_gpus(gpu, cols, milli)
        cpu += c
        mem += m
        i += 1
    return i, cpu, mem


def slot_times(request: Request, home_rows: np.ndarray, st: FleetState, holds: Holds,
               count: int) -> list[float]:
    """The times (seconds from now, ascending) at which the home zone gets room for each of
    the first ``count`` parts of requests like ``request``: parts that fit now count 0; then
    the holds are released in end order, fleet-wide, until ``count`` parts fit. A gang's
    parts need distinct nodes, so a node counts at most one part of a gang shape."""
    cap = 1 if request.is_gang else count
    now = _parts_now(request, st, home_rows, cap)  # one array pass over the home zone
    total = int(now.sum())
    times: list[float] = [0.0] * min(total, count)
    if total >= count:
        return times
    have = dict(zip(home_rows.tolist(), now.tolist(), strict=True))
    heap = [(holds.by_row[row][0][0], row, 0) for row in holds.rows_in(home_rows)
            if have[row] < cap]
    if not heap:
        return times
    heapq.heapify(heap)
    free: dict[int, list] = {}
    while heap and len(times) < count:
        at, row, i = heapq.heappop(heap)
        if row not in free:
            free[row] = [st.gpu_free[row].tolist(), int(st.cpu_free[row]),
                         int(st.mem_free[row])]
        gpu, cpu, mem = free[row]
        mine = holds.by_row[row]
        i, c, m = _release_together(mine, i, gpu)
        cpu, mem = cpu + c, mem + m
        free[row][1:] = [cpu, mem]
        c = _parts(request, gpu, cpu, mem, cap)
        if c > have[row]:
            times.extend([at] * (c - have[row]))
            have[row] = c
        if i < len(mine) and c < cap:
            heapq.heappush(heap, (mine[i][0], row, i))
    return times[:count]


def ready_times(request: Request, rows: np.ndarray, st: FleetState,
                holds: Holds) -> np.ndarray:
    """Per row of ``rows``: seconds from now until one part of ``request`` fits there, its
    holds released in end order onto its free capacity now (0: it fits now; ``inf``: the
    known ends never make room). The reservation's ready time
    (:mod:`gpu_pool.engine.reserve`)."""
    out = np.where(_parts_now(request, st, rows, 1) > 0, 0.0, math.inf)
    for k in np.flatnonzero(out > 0).tolist():
        row = int(rows[k])
        mine = holds.by_row.get(row)
        if not mine:
            continue
        gpu = st.gpu_free[row].tolist()
        cpu, mem = int(st.cpu_free[row]), int(st.mem_free[row])
        i = 0
        while i < len(mine):
            at = mine[i][0]
            i, c, m = _release_together(mine, i, gpu)
            cpu, mem = cpu + c, mem + m
            if _parts(request, gpu, cpu, mem, 1):
                out[k] = at
                break
    return out


def waits(request: Request, home_rows: np.ndarray, st: FleetState, holds: Holds,
          count: int) -> list[float]:
    """``W`` of the module docstring for the first ``count`` requests like ``request`` in the
    cycle's order (the ``i``-th waits for the room the ``i`` before it take first; a gang of
    ``k`` nodes for ``k`` parts); ``inf`` where the known ends never make room."""
    k = request.nodes
    times = slot_times(request, home_rows, st, holds, count * k)
    return [times[(i + 1) * k - 1] if len(times) >= (i + 1) * k else math.inf
            for i in range(count)]


@dataclass
class Decision:
    """What :func:`decide` returns: the views to plan with, the calls keyed by ``id`` of
    the view each request now has, each moving request's expected home wait, and the holds
    (to reuse in the cycle's second look; None when nothing moves)."""

    views: dict[str, RequestView]
    calls: dict[int, ZoneCall]
    waits: dict[str, float]
    holds: Holds | None


def decide(ordered: Sequence[Request], views: Mapping[str, RequestView], state: FleetState,
           allocations: Sequence[Allocation], policy: Policy, now: datetime, *,
           holds: Holds | None = None,
           placed: Sequence[tuple[Placement, Request]] = ()) -> Decision:
    """Which moves pay for each of ``ordered`` (the requests to place, in the cycle's
    order: see the module docstring) on the free capacity of ``state``; ``holds``: built
    from ``allocations`` when None; ``placed``: placements already made on ``state`` this
    cycle, which hold until their time limits. Requests whose static view moves no data
    keep it and cost nothing here.
    """
    types: dict[int, list[Request]] = defaultdict(list)
    for r in ordered:
        if views[r.name].moves:
            types[id(views[r.name])].append(r)
    out = dict(views)
    calls: dict[int, ZoneCall] = {}
    wait_of: dict[str, float] = {}
    if not types:
        return Decision(out, calls, wait_of, holds)
    if holds is None:
        holds = Holds.of(state.layout, allocations, now)
    if placed:  # only the home zones of these requests matter
        home = np.zeros(state.size, dtype=bool)
        for same in types.values():
            base = views[same[0].name]
            home |= base.compatible & ~base.cross_zone
        holds = holds.plus(placed, home)
    zones = state.layout.zones
    margin = 1.0 + policy.cross_zone_margin
    cap = policy.max_transfer_seconds
    for same in types.values():
        first = same[0]
        base = views[first.name]
        ds = first.dataset
        assert ds is not None and ds.zone is not None
        home_rows = np.flatnonzero(base.compatible & ~base.cross_zone & state.up)
        within = base.compatible & base.cross_zone & (base.transfer <= cap)
        # A request's wait decides which moves pay: the distinct thresholds t * (1 + margin)
        # of the allowed moves split the waits into a few variants of the view.
        steps = np.unique(base.transfer[within] * margin)
        w = waits(first, home_rows, state, holds, len(same))
        keys = np.where(np.array(w) <= 0, -1, np.searchsorted(steps, w, side="right")).tolist()
        variants: dict[int, ZoneCall] = {}
        for r, wait, key in zip(same, w, keys, strict=True):
            call = variants.get(key)
            if call is None:
                call = variants[key] = _call(base, ds.zone, ds.size_gib, wait, within, margin,
                                             zones)
                calls[id(call.view)] = call
            out[r.name] = call.view
            wait_of[r.name] = wait
    return Decision(out, calls, wait_of, holds)


def _call(base: RequestView, home: str, size_gib: float, wait: float, within: np.ndarray,
          margin: float, zones: Sequence[str]) -> ZoneCall:
    pays = within & (base.transfer * margin <= wait) if wait > 0 else np.zeros_like(within)
    refused_rows = np.flatnonzero(base.compatible & base.cross_zone & ~pays)
    refused = None
    if refused_rows.size and wait > 0:
        best = int(refused_rows[np.argmin(base.transfer[refused_rows])])
        refused = (zones[best], float(base.transfer[best]))
    zone_ok = ~base.cross_zone | pays
    if np.array_equal(zone_ok, base.zone_ok):
        view = base
    else:
        view = replace(base, zone_ok=zone_ok,
                       signature=hash((base.signature, zone_ok.tobytes())),
                       levels=view_levels(base.compatible, zone_ok, base.penalty))
    return ZoneCall(home, size_gib, wait, base, view, refused)
