"""When will a waiting request start? An estimate per request, as Slurm's ``squeue --start``.

Model
-----
The future as this cycle leaves it, with no new arrivals: the capacity free after the
plan; every active allocation with a time limit frees its GPUs, CPU and RAM at its
*expected end* (one without a limit never), every placement of this plan likewise.
Waiting requests are taken in the cycle's order (priority and aging, larger whole-GPU
requests first, older first) and started, as the engine's greedy pass would, at the first
moment they fit: at ``now`` if they already fit, else at the first expected end of a hold
that makes room for them; what starts holds its capacity until its own expected end
(for ever without a limit).

Expected ends: tasks end well before their limits (users over-ask), so a limit alone
makes a late estimate. Given ``ratios``, the run time / time limit of recently finished
tasks (the store's ledger; the replay's finished tasks), a task of limit ``L`` that has
run ``e`` so far is expected to run ``L x`` the median of the ratios above ``e / L``
(what such tasks did, knowing it has not ended yet; its limit if none ran that long);
without ratios, to its limit. A reservation's rows are closed to everything but its holder
and work that ends by its expected start (the backfill rule of
:mod:`gpu_pool.engine.reserve`), so a holder's estimate is its reservation's expected
start or earlier.

Only requests that wait for capacity get an estimate (reason ``waiting_for_capacity``,
``outranked`` or ``node_reserved``); a request held by quota, headroom, data or a freeze
gets None (no time can be promised), and so does one the known ends never make room for
(but critical work that will preempt to borrow, whose estimate the plan sets itself: the
end of its victims' grace, :mod:`gpu_pool.engine.preempt`).
Gangs take their ``k`` nodes at one moment.

What it leaves out: tasks usually end before their limits (the estimate is then late),
new higher-ranked arrivals jump the queue (the estimate is then early), and the
starvation guard's future reservations. ``gpu-pool simulate replay`` measures how far
the estimates land from the actual starts (``start_estimate_error``).

Cost: one pass of numpy over the allowed rows per request at ``now``, then a walk of the
hold ends in time order trying the still-waiting requests on the rows that freed: at most
``Policy.start_estimates`` requests and :data:`MAX_EVENTS` hold ends per cycle. At each end
a kind of request that found no room is not tried again (capacity only shrinks while
requests start), and an expected end is a bisection into the sorted ratios.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

import numpy as np

from gpu_pool.engine.capacity import FleetLayout, FleetState
from gpu_pool.engine.objective import RequestView
from gpu_pool.engine.types import Placement, ReasonCode, Reservation
from gpu_pool.engine.zones import Holds, _parts, _parts_now, release_gpus
from gpu_pool.model import MILLI_PER_GPU, Allocation, Request

# Hold ends walked per cycle at most; requests still waiting after them get None.
MAX_EVENTS = 20_000
# The reasons of a request that waits for capacity (the others get no estimate).
CAPACITY = frozenset({ReasonCode.WAITING_FOR_CAPACITY, ReasonCode.OUTRANKED,
                      ReasonCode.NODE_RESERVED})


class _Row:
    """Free capacity of one row as the estimate moves forward in time."""

    __slots__ = ("gpu", "cpu", "mem")

    def __init__(self, st: FleetState, row: int) -> None:
        self.gpu: list[int] = st.gpu_free[row].tolist()
        self.cpu = int(st.cpu_free[row])
        self.mem = int(st.mem_free[row])

    def fits(self, r: Request) -> bool:
        return _parts(r, self.gpu, self.cpu, self.mem, 1) > 0

    def take(self, r: Request) -> tuple[tuple[int, ...], int]:
        """Take one part of ``r`` (it fits): the GPU columns and the milli per column."""
        self.cpu -= r.cpu_milli
        self.mem -= r.memory_mib
        if r.gpus <= 0:
            return (), 0
        if r.is_share:
            col = min((c for c, g in enumerate(self.gpu) if g >= r.gpu_milli),
                      key=lambda c: self.gpu[c])
            self.gpu[col] -= r.gpu_milli
            return (col,), r.gpu_milli
        cols = tuple([c for c, g in enumerate(self.gpu) if g == MILLI_PER_GPU][: r.gpus])
        for c in cols:
            self.gpu[c] = 0
        return cols, MILLI_PER_GPU

    def give(self, cols: tuple[int, ...], milli: int, cpu: int, mem: int) -> None:
        release_gpus(self.gpu, cols, milli)
        self.cpu += cpu
        self.mem += mem


class Runtimes:
    """Expected run times from the ratios of finished tasks (module docstring)."""

    def __init__(self, ratios: Sequence[float] = ()) -> None:
        q = np.sort(np.clip(np.asarray(ratios, dtype=np.float64), 0.0, 1.0))
        # The ratios above a threshold are a suffix of the sorted ones: the median of each
        # suffix, once, so a hold's expected end is a bisection (a cycle asks thousands).
        i = np.arange(len(q))
        left = len(q) - i
        self._sorted: list[float] = q.tolist()
        self._suffix_median: list[float] = ((q[i + (left - 1) // 2] + q[i + left // 2]) / 2
                                            ).tolist()

    def expected(self, limit_s: float, elapsed_s: float = 0.0) -> float:
        """Seconds from its start a task with this limit, running for ``elapsed_s``, is
        expected to run in all."""
        if not self._sorted or limit_s <= 0:
            return limit_s
        first = bisect.bisect_right(self._sorted, elapsed_s / limit_s)
        if first == len(self._sorted):
            return limit_s
        return max(self._suffix_median[first] * limit_s, elapsed_s)

    def holds(self, layout: FleetLayout, allocations: Sequence[Allocation],
              placed: Sequence[tuple[Placement, Request]], now: datetime) -> Holds:
        """The holds of ``allocations`` and ``placed`` (starting now) with a time limit,
        ending at their expected ends (seconds from now)."""

        def remaining(a: Allocation) -> float:
            assert a.ends_by is not None  # Holds.of leaves the others out
            limit = (a.ends_by - a.started_at).total_seconds()
            elapsed = (now - a.started_at).total_seconds()
            return self.expected(limit, elapsed) - elapsed

        return Holds.of(layout, allocations, now, remaining).plus(placed, ends=self.expected)


def estimate_starts(state: FleetState, waiting: Sequence[Request],
                    views: Mapping[str, RequestView], holds: Holds,
                    reservations: Sequence[Reservation], now: datetime,
                    depth: int, runtimes: Runtimes | None = None) -> dict[str, datetime]:
    """Estimated starts of ``waiting`` (the requests waiting for capacity, in the cycle's
    order) on ``state`` (free capacity after the plan, reserved rows open), ``holds``
    releasing capacity at their ends (module docstring). Only the first ``depth`` are
    estimated; a request missing from the result has no estimate."""
    runtimes = runtimes or Runtimes()
    todo = list(waiting[:depth])
    if not todo:
        return {}
    layout = state.layout
    up = state.up
    window: dict[int, tuple[str, float]] = {}  # reserved row -> (holder, expected start s)
    for x in reservations:
        s = math.inf if x.expected_start is None else max(
            (x.expected_start - now).total_seconds(), 0.0)
        for name in x.nodes:
            window[layout.row_of[name]] = (x.request_name, s)
    # Per view (shared by the requests of one type): its allowed rows, as a mask and as a
    # plain list (the walk reads single rows, where a list is cheaper than numpy).
    masks: dict[int, tuple[np.ndarray, list[bool]]] = {}
    for r in todo:
        view = views[r.name]
        if id(view) not in masks:
            mask = view.compatible & view.zone_ok & up
            masks[id(view)] = (mask, mask.tolist())
    holders = {x.request_name for x in reservations}
    rows: dict[int, _Row] = {}
    heap: list[tuple[float, int, int, tuple[int, ...], int, int, int]] = []
    seq = 0
    for row, mine in holds.by_row.items():
        for end, cols, milli, cpu, mem in mine:
            heap.append((end, seq, row, cols, milli, cpu, mem))
            seq += 1
    heapq.heapify(heap)
    out: dict[str, datetime] = {}
    started: set[str] = set()

    def row_state(row: int) -> _Row:
        got = rows.get(row)
        if got is None:
            got = rows[row] = _Row(state, row)
        return got

    def may_use(r: Request, row: int, t: float) -> bool:
        held = window.get(row)
        if held is None or held[0] == r.name or held[0] in started:
            return True
        limit = r.time_limit
        return limit is not None and t + limit.total_seconds() <= held[1]

    def start(r: Request, chosen: Sequence[int], t: float) -> None:
        nonlocal seq
        for row in chosen:
            cols, milli = row_state(row).take(r)
            if r.time_limit is not None:
                heapq.heappush(heap, (t + runtimes.expected(r.time_limit.total_seconds()), seq,
                                      row, cols, milli, r.cpu_milli, r.memory_mib))
                seq += 1
        out[r.name] = now + timedelta(seconds=t)
        started.add(r.name)

    def try_rows(r: Request, candidates: Sequence[int], t: float) -> bool:
        found = []
        for row in candidates:
            if may_use(r, row, t) and row_state(row).fits(r):
                found.append(row)
                if len(found) == r.nodes:
                    start(r, found, t)
                    return True
        return False

    # now: what already fits (the plan may have left it for headroom or order)
    # A gang's rows where one part fits: capacity grows only on the rows a hold end frees,
    # so these sets follow the ends, not a pass over every row of the gang per end.
    ready: dict[str, set[int]] = {}
    for r in todo:
        mask = masks[id(views[r.name])][0]
        cand = np.flatnonzero(mask)
        if not len(cand):
            continue
        fit_now = cand[_parts_now(r, state, cand, 1) > 0]
        if len(fit_now) >= r.nodes:
            try_rows(r, fit_now.tolist(), 0.0)
        if r.nodes > 1 and r.name not in started:
            ready[r.name] = set(fit_now.tolist())
    left = [r for r in todo if r.name not in started]
    events = 0
    while left and heap and events < MAX_EVENTS:
        t = heap[0][0]
        changed: list[int] = []
        while heap and heap[0][0] == t:
            _, _, row, cols, milli, cpu, mem = heapq.heappop(heap)
            row_state(row).give(cols, milli, cpu, mem)
            changed.append(row)
            events += 1
        changed = sorted(set(changed))
        # Within one moment capacity only shrinks as requests start. So a single-node
        # request that finds no room on the freed rows means none of its kind (same rows
        # and shape; same limit where a freed row is reserved; not a reservation's holder)
        # finds any later in that moment, and the freed rows where one part of a shape fits
        # stay the same until something starts (``len(out)`` counts the starts).
        touched_by: dict[int, tuple[list[int], bool]] = {}
        failed: set[tuple] = set()
        fits_at: dict[tuple, tuple[int, list[int]]] = {}
        for r in left:
            view = views[r.name]
            got = touched_by.get(id(view))
            if got is None:
                flags = masks[id(view)][1]
                freed = [row for row in changed if flags[row]]
                got = touched_by[id(view)] = (freed, any(row in window for row in freed))
            touched, reserved = got
            if not touched:
                continue
            shape = (id(view), r.gpus, r.gpu_milli, r.cpu_milli, r.memory_mib)
            if r.nodes == 1:
                kind = (shape, r.time_limit if reserved else None,
                        r.name if r.name in holders else None)
                if kind in failed:
                    continue
                if not try_rows(r, touched, t):
                    failed.add(kind)
                elif r.name in holders:
                    failed.clear()  # its reservation's rows are open to everyone now
                continue
            known = fits_at.get(shape)
            if known is None or known[0] != len(out):
                known = fits_at[shape] = (len(out), [row for row in touched
                                                     if row_state(row).fits(r)])
            fitting = ready.setdefault(r.name, set())
            fitting.update(known[1])
            if len(fitting) >= r.nodes:
                if try_rows(r, sorted(fitting), t):
                    if r.name in holders:
                        failed.clear()
                else:
                    # work started since may have filled some: keep the rows that still fit
                    ready[r.name] = {row for row in fitting if row_state(row).fits(r)}
        left = [r for r in left if r.name not in started]
    return out
