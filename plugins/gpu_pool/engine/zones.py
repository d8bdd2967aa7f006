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
    ``ends_by`` (start + time limit): per compatible up node of the home zone, its holds are
    released in end order onto its free capacity now until one part of the request fits
    (an allocation without ``ends_by`` never ends for the estimate; one past its ``ends_by``
    ends now). ``W`` is the earliest such time over the nodes (a gang of ``k`` nodes: the
    ``k``-th earliest), minus ``now``; infinite when no node ever gets room. Other pending
    work is ignored (the queue ahead is not counted) and so are quotas and headroom, which
    do not depend on the zone.

Rules
-----
* The home zone has room now (``W = 0``): no move this cycle.
* Otherwise a node in zone ``z`` is allowed when ``t(z) <= policy.max_transfer_seconds``
  (the flat cap) and ``W >= t(z) * (1 + policy.cross_zone_margin)``. A placement's
  ``expected_wait_saved_s`` is ``W`` and its ``transfer_seconds`` the largest ``t`` of its
  nodes, so every cross-zone placement has ``expected_wait_saved_s >= transfer_seconds *
  (1 + margin)``.
* The decision is made once per request type (the static view, shared by identical
  requests) per cycle, against the free capacity at the start of the cycle; requests of
  the type still waiting after the home zone fills are decided again next cycle.

Invariants: nothing here changes its inputs; the narrowed view differs from the static one
only in ``zone_ok``, ``signature`` and ``levels``, so every planner reads it unchanged.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np

from gpu_pool.engine.capacity import FleetLayout, FleetState
from gpu_pool.engine.objective import RequestView, view_levels
from gpu_pool.engine.types import Placement
from gpu_pool.model import MILLI_PER_GPU, Allocation, Policy, Request


@dataclass(frozen=True)
class ZoneCall:
    """The cycle's decision on moving the data of one request type out of its home zone."""

    home: str
    size_gib: float
    wait_s: float  # expected home wait W (0: room now; inf: no hold there has an end)
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


def annotate(placement: Placement, call: ZoneCall, layout: FleetLayout) -> Placement:
    """``placement`` (cross-zone) with the wait it was to save and its sentence."""
    to = [layout.zones[layout.row_of[a.node]] for a in placement.assignments]
    note = move_note(call, [z for z in to if z != call.home], placement.transfer_seconds)
    return replace(placement, expected_wait_saved_s=call.wait_s,
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


class _Holds:
    """Active allocations per row, in end order, built once per cycle on first use."""

    def __init__(self, state: FleetState, allocations: Sequence[Allocation],
                 now: datetime) -> None:
        layout = state.layout
        by_row: dict[int, list[tuple[float, tuple[int, ...], int, int, int]]] = defaultdict(list)
        for a in allocations:
            row = layout.row_of.get(a.node)
            if row is None:
                continue
            cols = layout.column_of[row]
            end = (math.inf if a.ends_by is None
                   else max((a.ends_by - now).total_seconds(), 0.0))
            by_row[row].append((end, tuple(cols[i] for i in a.gpu_indices if i in cols),
                                a.gpu_milli, a.cpu_milli, a.memory_mib))
        for holds in by_row.values():
            holds.sort(key=lambda h: h[0])
        self.by_row = by_row
        self.state = state
        self.cache: dict[tuple, float] = {}

    def room_at(self, row: int, request: Request) -> float:
        """Seconds from now until one part of ``request`` fits on ``row`` (inf: never)."""
        key = (row, request.gpus, request.gpu_milli, request.cpu_milli, request.memory_mib)
        got = self.cache.get(key)
        if got is None:
            got = self.cache[key] = self._room_at(row, request)
        return got

    def _room_at(self, row: int, request: Request) -> float:
        st = self.state
        gpu = st.gpu_free[row].copy()
        cpu = int(st.cpu_free[row])
        mem = int(st.mem_free[row])
        holds = self.by_row.get(row, [])
        i = 0
        at = 0.0
        while True:
            if _fits(request, gpu, cpu, mem):
                return at
            if i >= len(holds) or math.isinf(holds[i][0]):
                return math.inf
            at = holds[i][0]
            while i < len(holds) and holds[i][0] == at:  # holds ending together
                _, cols, milli, c, m = holds[i]
                for col in cols:
                    gpu[col] = min(gpu[col] + milli, MILLI_PER_GPU)
                cpu += c
                mem += m
                i += 1


def _fits(request: Request, gpu: np.ndarray, cpu: int, mem: int) -> bool:
    if cpu < request.cpu_milli or mem < request.memory_mib:
        return False
    if request.gpus <= 0:
        return True
    if request.is_share:
        return bool((gpu >= request.gpu_milli).any())
    return int((gpu == MILLI_PER_GPU).sum()) >= request.gpus


def home_wait(request: Request, home_rows: np.ndarray, holds: _Holds) -> float:
    """``W`` of the module docstring over the compatible up rows of the home zone."""
    if not home_rows.size:
        return math.inf
    times = sorted(holds.room_at(int(row), request) for row in home_rows)
    k = request.nodes
    return times[k - 1] if len(times) >= k else math.inf


def decide(requests: Sequence[Request], views: Mapping[str, RequestView], state: FleetState,
           allocations: Sequence[Allocation], policy: Policy, now: datetime
           ) -> tuple[dict[str, RequestView], dict[int, ZoneCall]]:
    """The views to plan with (moves that do not pay taken out) and the cycle's calls,
    keyed by ``id`` of the view each request now has (see the module docstring).

    Requests whose static view moves no data keep it; each request type is decided once.
    """
    calls: dict[int, ZoneCall] = {}
    by_base: dict[int, ZoneCall] = {}
    out = dict(views)
    holds: _Holds | None = None
    layout = state.layout
    margin = 1.0 + policy.cross_zone_margin
    for r in requests:
        base = views[r.name]
        if not base.moves:
            continue
        call = by_base.get(id(base))
        if call is None:
            if holds is None:
                holds = _Holds(state, allocations, now)
            call = by_base[id(base)] = _decide_one(r, base, holds, layout.zones, margin,
                                                   policy.max_transfer_seconds)
            calls[id(call.view)] = call
        out[r.name] = call.view
    return out, calls


def _decide_one(request: Request, base: RequestView, holds: _Holds, zones: Sequence[str],
                margin: float, cap: float) -> ZoneCall:
    ds = request.dataset
    assert ds is not None and ds.zone is not None
    st = holds.state
    home_rows = np.flatnonzero(base.compatible & ~base.cross_zone & st.up)
    wait = home_wait(request, home_rows, holds)
    within = base.compatible & base.cross_zone & (base.transfer <= cap)
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
    return ZoneCall(ds.zone, ds.size_gib, wait, base, view, refused)
