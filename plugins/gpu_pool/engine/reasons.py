"""Why a request stays pending: a reason code and one sentence, decided in a fixed order.

The first test that holds gives the reason:

1. ``never_fits``: no node or gang of the fleet could ever hold it (:func:`never_fits`).
2. ``data_not_ready``: its dataset is not ready.
3. ``quota_expired``: every quota its team and purpose have is outside its validity window;
   ``quota_exhausted``: no quota at all, or too little left on every group it could use
   and it may not borrow the rest (:func:`gpu_pool.engine.borrow.why_not` says why: not
   preemptible, borrow limit reached, no consenting lender, no lender with enough idle);
   a request that could borrow, but for the free capacity, goes on to the tests below.
4. ``waiting_for_data_zone``: compatible nodes exist, but moving its data to any of them
   would take longer than ``policy.max_transfer_seconds``; or it would fit in another zone
   now, but the move does not pay: the home-zone wait it would save is shorter than the
   transfer times ``1 + policy.cross_zone_margin``, or the move is over the cap
   (:mod:`gpu_pool.engine.zones`). The
   sentence gives the size, the transfer and the wait ("waits for its data's zone eu:
   moving 800 GiB to us would take 2.2 h, saving only ~40 min ...").
5. ``outranked``: it fits the capacity still free after this cycle's plan, which left it out
   for requests ranked ahead of it (rare: a plan places what still fits).
6. ``headroom_reserved``: it fits in the free capacity but only by dipping into the
   whole GPUs kept for critical work: fleet-wide ("4 whole GPUs are held for critical
   work and only 3 are free"), else the first headroom per model/group in the policy's
   order that alone keeps it out ("held back: headroom for critical work — 4 A100 GPUs on
   group core are kept free").
7. ``node_reserved``: it would fit, but only on nodes reserved for a starving request
   (:mod:`gpu_pool.engine.reserve`); the sentence names the nodes and the request, and
   until when work may still start there (work whose time limit ends by the
   reservation's expected start: backfill). A request beyond its quota that may borrow is
   judged with its quota open here (borrowing keeps the backfill rule); it read "every
   compatible node is down or draining" before.
8. ``waiting_for_capacity``: it does not fit the free capacity; the sentence says what
   is missing ("needs 4 A100 GPUs on one node; largest free block is 3"), the cores and
   RAM when the nodes with the GPUs free lack them, both when no node has either free
   ("...; largest free block is 3, and no compatible node has the cores free either (at
   most 4 cores)"), and which nodes, when at most three of a
   fleet four times that size can ever hold it ("...; only 1 node of the fleet can ever
   hold it (g3-7)"). A starving
   request holding a reservation says so after it ("; g3-7 reserved for it since ...,
   expected to start by ...").
   :func:`queued_behind` turns it into ``outranked`` when requests of the same shape and
   quota, ranked ahead of it, wait for the same GPUs, and says how many.

Every test reads the capacity as the plan leaves it, which is what the next cycle starts
from: while nothing changes, the next cycle gives the same reason, word for word. (Judged
against the capacity free *before* the plan, a request outranked this cycle would read
"outranked" now and "largest free block is 0" a heartbeat later, with the fleet unchanged.)

Invariant: the functions here only read the cycles they are given.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gpu_pool.engine import borrow, zones
from gpu_pool.engine.compat import describe_part
from gpu_pool.engine.greedy import Cycle, candidate_rows, fit
from gpu_pool.engine.objective import RequestView
from gpu_pool.engine.offpeak import whole_duration
from gpu_pool.engine.quota import EXPIRED, NO_QUOTA, UNLIMITED, QuotaBook
from gpu_pool.engine.types import PendingReason, ReasonCode, Reservation
from gpu_pool.engine.zones import ZoneCall
from gpu_pool.model import MILLI_PER_GPU, Policy, Request

if TYPE_CHECKING:
    from gpu_pool.engine.capacity import FleetState
    from gpu_pool.engine.reserve import Held

# A request that at most this many nodes can ever hold says which (see _few_hosts).
FEW_HOSTS = 3


@dataclass(frozen=True)
class ReasonInputs:
    end: Cycle  # free capacity after the plan: what every reason is judged against
    book: QuotaBook
    policy: Policy
    held: Held | None = None  # the starvation guard's reservations this cycle, if any
    opened: Cycle | None = None  # ``end`` with the reserved nodes open (None: none reserved)
    # The cycle's data-move calls per id of a request's view (gpu_pool.engine.zones).
    zones: Mapping[int, ZoneCall] | None = None
    # What each lender may still lend after the plan (borrow.lendable), computed once.
    _lendable: dict = field(default_factory=dict, repr=False, compare=False)

    def lendable(self) -> dict[str, int]:
        if not self._lendable:
            self._lendable.update(borrow.lendable(self.book, self.end))
        return self._lendable


def _gpus(milli: float) -> str:
    return f"{milli / MILLI_PER_GPU:g}"


def quota_reason(request: Request, view: RequestView, groups: np.ndarray, book: QuotaBook,
                 remaining: np.ndarray, policy: Policy | None = None,
                 inputs: ReasonInputs | None = None) -> PendingReason | None:
    """The quota reason, or None when quota does not keep ``request`` out; with ``policy``
    and ``inputs`` (the cycle after the plan) it also says why it does not borrow."""
    if within_quota(request, view, groups, remaining):
        return None
    g = groups[view.compatible]
    live = np.unique(g[g >= 0])
    part = request.gpus * request.gpu_milli
    who = f"team {request.team} ({request.purpose.value})"
    if live.size:
        k = int(live[np.argmax(remaining[live])])
        used = book.limit_milli[k] - remaining[k]
        text = (f"{book.describe(k)} exhausted: {_gpus(used)} of "
                f"{_gpus(book.limit_milli[k])} GPUs in use; needs {_gpus(part)} "
                "GPUs per node")
        if policy is not None and inputs is not None:
            clause = borrow.why_not(request, book, policy, k)
            if clause is None:
                need = request.total_gpu_milli
                pool = inputs.lendable()
                lenders = [borrow.UNGUARANTEED, *borrow.lenders_for(book, request.team)]
                most = max(pool.get(t, 0) for t in lenders)
                if most >= need:
                    return None  # it may borrow: what lacks is capacity (later tests)
                clause = (f"no lender it may borrow from has {_gpus(need)} GPUs idle to "
                          f"lend (most: {_gpus(most)})")
            if not clause:
                pass
            elif clause.startswith(("held back", "quota:")):
                text = f"{clause} ({text})"
            else:
                text = f"{text}; {clause}"
        return PendingReason(request.name, ReasonCode.QUOTA_EXHAUSTED, text)
    if (g == EXPIRED).any():
        return PendingReason(request.name, ReasonCode.QUOTA_EXPIRED,
                             f"{who} has quota on these GPUs, but none valid now "
                             "(expired or not yet started)")
    assert (g == NO_QUOTA).all()
    return PendingReason(request.name, ReasonCode.QUOTA_EXHAUSTED,
                         f"{who} has no quota for {describe_part(request)}")


def within_quota(request: Request, view: RequestView, groups: np.ndarray,
                 remaining: np.ndarray) -> bool:
    """Whether some quota group ``request`` may use on a compatible node still holds it
    (or it takes no GPUs, or a node is under no quota)."""
    if request.gpus == 0:
        return True
    g = groups[view.compatible]
    if (g == UNLIMITED).any():
        return True
    live = np.unique(g[g >= 0])
    return bool(live.size and (remaining[live] >= request.gpus * request.gpu_milli).any())


def _missing(request: Request, view: RequestView, cycle: Cycle) -> str:
    """What the best compatible node lacks, in words."""
    st = cycle.state
    rows = np.flatnonzero(view.compatible & view.zone_ok & st.up)
    need = describe_part(request)
    if request.is_gang:
        have = len(candidate_rows(cycle, request, view,
                                  np.full(st.size, UNLIMITED, dtype=np.int64), rows))
        return (f"needs {request.nodes} nodes each with {request.gpus} free GPUs "
                f"({need}); {'1 has' if have == 1 else f'{have} have'} them free")
    if not rows.size:
        return f"needs {need}; every compatible node is down or draining"
    return _lacking(request, st, rows, need) + _few_hosts(view, st)


def _few_hosts(view: RequestView, st: FleetState) -> str:
    """``"; only 2 nodes of the fleet can ever hold it (a, b)"`` when at most
    :data:`FEW_HOSTS` can (GPU model and count, total cores and RAM, data zone; down or
    not) and they are at most a quarter of the fleet, else nothing: a request that only a
    node or two can ever host waits for those, however much else is free, and its owner
    should know that is why (in a fleet of three nodes it says nothing new)."""
    hosts = np.flatnonzero(view.compatible & view.zone_ok)
    if hosts.size > FEW_HOSTS or 4 * hosts.size > st.size:
        return ""
    names = ", ".join(st.layout.names[int(r)] for r in hosts)
    count = "1 node" if hosts.size == 1 else f"{hosts.size} nodes"
    return f"; only {count} of the fleet can ever hold it ({names})"


def _lacking(request: Request, st: FleetState, rows: np.ndarray, need: str) -> str:
    """What the best of ``rows`` (compatible, up) lacks for a single-node request."""
    cpu_ok = (st.cpu_free[rows] >= request.cpu_milli) & (st.mem_free[rows] >= request.memory_mib)
    # The largest block is read where the cores and RAM are free; on every node when none
    # has them (the sentence then says so too, rather than "largest free block is 0").
    where = cpu_ok if cpu_ok.any() else np.ones(rows.size, dtype=bool)
    if request.is_share:
        block = int(np.maximum(st.gpu_free[rows], 0).max(axis=1)[where].max(initial=0))
        gpu_ok = (st.gpu_free[rows] >= request.gpu_milli).any(axis=1)
        fits_gpu = f"largest free share is {_gpus(block)} of a GPU"
    elif request.gpus:
        block = int(st.whole_free[rows][where].max(initial=0))
        gpu_ok = st.whole_free[rows] >= request.gpus
        fits_gpu = f"largest free block is {block}"
    else:
        gpu_ok = np.ones(rows.size, dtype=bool)
        fits_gpu = ""
    if gpu_ok.any() and not (gpu_ok & cpu_ok).any():
        return (f"needs {need} with {_ask(request)} on one node; nodes with the GPUs free "
                f"have at most {_most(request, st, rows[gpu_ok])} free")
    if request.gpus and cpu_ok.any():
        return f"needs {need} on one node; {fits_gpu}"
    if request.gpus and not gpu_ok.any():
        # Neither the GPUs nor the cores and RAM are free on any node: both, so that the
        # sentence does not blame the GPUs alone (work started this cycle, or lent off-peak,
        # may have taken the last GPU a node with too few cores had free).
        them = ("the cores and RAM" if request.cpu_milli and request.memory_mib
                else "the cores" if request.cpu_milli else "the RAM")
        return (f"needs {need} with {_ask(request)} on one node; {fits_gpu}, and no "
                f"compatible node has {them} free either (at most {_most(request, st, rows)})")
    return f"needs {need} on one node; no compatible node has it free"


def _asked(request: Request, cores: str, ram: str) -> str:
    """``cores`` and ``ram`` joined, each only if ``request`` asks for it."""
    return " and ".join(x for x, asked in ((cores, request.cpu_milli),
                                           (ram, request.memory_mib)) if asked)


def _ask(request: Request) -> str:
    """The cores and RAM a part asks, in words (only what it asks)."""
    return _asked(request, f"{request.cpu_milli / 1000:g} CPU cores",
                  f"{request.memory_mib} MiB RAM")


def _most(request: Request, st: FleetState, rows: np.ndarray) -> str:
    """The most cores and RAM free on one of ``rows``, of what ``request`` asks."""
    return _asked(request, f"{int(st.cpu_free[rows].max()) / 1000:g} cores",
                  f"{int(st.mem_free[rows].max())} MiB")


def pending_reason(request: Request, weight: int, view: RequestView, groups: np.ndarray,
                   inputs: ReasonInputs, never: str | None) -> PendingReason:
    """The reason for one request left pending (see the module docstring for the order)."""
    name = request.name
    if never is not None:
        return PendingReason(name, ReasonCode.NEVER_FITS, f"never fits: {never}")
    if not request.data_ready:
        uri = request.dataset.uri if request.dataset else "its input"
        return PendingReason(name, ReasonCode.DATA_NOT_READY, f"waits for its data: {uri} "
                             "is not ready")
    q = quota_reason(request, view, groups, inputs.book, inputs.end.remaining, inputs.policy,
                     inputs)
    if q is not None:
        return q
    if not (view.compatible & view.zone_ok).any():
        return PendingReason(name, ReasonCode.DATA_ZONE, zones.over_cap(
            request, view, inputs.end.state.layout.zones, inputs.policy.max_transfer_seconds))
    end = inputs.end
    call = inputs.zones.get(id(view)) if inputs.zones else None
    if (call is not None and call.refused is not None
            and fit(end, request, weight, view, groups) is None
            and fit(end, request, weight, call.anywhere(), groups) is not None):
        return PendingReason(name, ReasonCode.DATA_ZONE,
                             zones.refusal(call, inputs.policy))
    if fit(end, request, weight, view, groups) is not None:
        return PendingReason(name, ReasonCode.OUTRANKED,
                             "outranked: it fits the GPUs still free, but this cycle's plan "
                             "left it out for requests ranked ahead of it (higher priority, "
                             "longer wait or a better fit)")
    if end.headroom or end.scopes:
        relaxed = Cycle(end.state, end.remaining, 0, end.mix, end.state.whole_free_up())
        if fit(relaxed, request, weight, view, groups) is not None:
            fleet = Cycle(end.state, end.remaining, end.headroom, end.mix, end.budget)
            if end.headroom and fit(fleet, request, weight, view, groups) is None:
                return PendingReason(name, ReasonCode.HEADROOM_RESERVED,
                                     f"{end.headroom} whole GPUs are held for critical "
                                     f"work and only {end.state.whole_free_up()} are free")
            for scope in end.scopes:
                alone = Cycle(end.state, end.remaining, 0, end.mix, end.state.whole_free_up(),
                              scopes=[scope])
                if fit(alone, request, weight, view, groups) is None:
                    return PendingReason(name, ReasonCode.HEADROOM_RESERVED,
                                         f"held back: headroom for critical work — "
                                         f"{scope.label} are kept free")
            return PendingReason(name, ReasonCode.HEADROOM_RESERVED,
                                 "held back: headroom for critical work — "
                                 + ", ".join(x.label for x in end.scopes)
                                 + " are kept free, together")
    held = inputs.held
    opened = inputs.opened
    if opened is not None and held is not None:
        mine = held.holder(name)
        if mine is not None:
            return PendingReason(
                name, ReasonCode.WAITING_FOR_CAPACITY,
                f"{_missing(request, view, opened)}; {', '.join(mine.nodes)} reserved for it "
                f"since {mine.since:%Y-%m-%d %H:%M} UTC (pending over "
                f"{whole_duration(inputs.policy.reserve_after)}); {_expected(mine)}")
        # Beyond its quota it may borrow (the quota test let it through; borrowing keeps
        # the backfill rule): whether a reserved node holds it is read with its quota open.
        reach = groups if within_quota(request, view, groups, inputs.end.remaining) else \
            np.full(len(groups), UNLIMITED, dtype=groups.dtype)
        choice = fit(opened, request, weight, view, reach)
        if choice is not None:
            nodes = opened.state.layout.names
            taken = {nodes[row] for row in choice.rows}
            for x in held.reservations:
                if taken & set(x.nodes):
                    return PendingReason(
                        name, ReasonCode.NODE_RESERVED,
                        f"fits only on {', '.join(sorted(taken & set(x.nodes)))}, reserved "
                        f"for {x.request_name} (pending over "
                        f"{whole_duration(inputs.policy.reserve_after)}: starving requests go "
                        f"first); {_backfill_window(x)}")
    return PendingReason(name, ReasonCode.WAITING_FOR_CAPACITY, _missing(request, view, end))


def _expected(x: Reservation) -> str:
    """The holder's side of a reservation, in words."""
    if x.expected_start is None:
        return ("no start can be promised: work there has no time limit; nothing else "
                "starts there until it does")
    return (f"expected to start by {x.expected_start:%Y-%m-%d %H:%M} UTC, when the work "
            "there reaches its time limits; until then only work ending by that time starts "
            "there")


def _backfill_window(x: Reservation) -> str:
    """What may still start on a reservation's nodes, in words."""
    if x.expected_start is None:
        return "nothing else starts there until it does"
    return (f"work whose time limit ends by {x.expected_start:%Y-%m-%d %H:%M} UTC may "
            "start there")


def queued_behind(reason: PendingReason, ahead: int) -> PendingReason:
    """``reason`` for a request with ``ahead`` requests like it ranked before it in the queue.

    Only a plain wait for capacity changes: it becomes ``outranked`` and says both facts,
    what is missing and how many wait before it for the same GPUs. (A starving request that
    holds a reservation is first in line: the caller counts nobody ahead of it.)
    """
    if ahead <= 0 or reason.code is not ReasonCode.WAITING_FOR_CAPACITY:
        return reason
    who = "1 request" if ahead == 1 else f"{ahead} requests"
    verb = "waits" if ahead == 1 else "wait"
    return PendingReason(reason.request_name, ReasonCode.OUTRANKED,
                         f"{reason.message}; {who} of the same shape and team, ranked ahead "
                         f"of it, {verb} for the same GPUs")

