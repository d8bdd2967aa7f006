"""Off-peak lending: work beyond quota at night that is gone (or going) by the peak.

Terms
-----
off-peak
    ``now`` inside :attr:`Policy.off_peak` (windows in the fleet's IANA time zone) while
    :attr:`Policy.lend_idle_off_peak` is on. The *peak* is :meth:`OffPeak.peak_starts`:
    when the off-peak period holding ``now`` ends (touching windows chain); ``None`` when
    it never ends within a week (then nothing has to end before it).
eligible
    A request may go beyond its quota off-peak when it is batch class
    (``priority=batch``), or pretraining (``purpose=pretraining``), or preemptible. Work
    that is none of these (training or inference at normal priority, not preemptible)
    never goes beyond quota. Lending never opens a missing or expired quota
    (:meth:`QuotaBook.group_of` keeps those codes).
lent
    An eligible request that also ends before the peak: either it is preemptible and
    preempted fewer than ``Policy.max_preemptions_per_task`` times (the peak then reclaims
    it with grace), or ``now + time_limit <= peak``. Any other request with no time limit,
    or one that runs past the peak, is *held back*: it keeps
    its ordinary quota, and when that leaves it pending its reason says so
    ("held back: its 6 h time limit runs past the peak at 08:00 Europe/Berlin; off-peak
    work must end before the peak"). The plan places a lent request within its quota with
    all other work first, and beyond it only after preemption and reclaim (step 6(b') of
    :mod:`gpu_pool.engine.plan`): work within its quota goes before work beyond it.
off-peak placement
    A lent request's placement that does not fit the quota left at the start of the cycle
    (after every placement that is not lent): :func:`mark_beyond_quota` sets
    :attr:`Placement.off_peak` and a note ("off-peak: beyond quota until the peak at
    08:00 Europe/Berlin"). A lent request that fits its quota anyway is an ordinary
    placement: the peak leaves it alone.

Rules at the peak (:func:`peak_reclaims`)
-----------------------------------------
Once ``now`` is no longer off-peak, every active allocation marked ``off_peak`` that is
preemptible (and preempted fewer than ``max_preemptions_per_task`` times) is preempted
(kind ``peak``) with its own grace, else the policy's ``preemption_grace``. Any other
off-peak allocation cannot outlive the peak by
construction (it was lent only when its time limit ended before the peak); if one still
runs (its time limit was changed, a clock moved), it is left alone: preempting work that
was promised an uninterrupted run is worse than a late peak, and its time limit ends it.

Invariants: pure functions of their inputs; same inputs, same answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np

from gpu_pool.engine.quota import QuotaBook
from gpu_pool.engine.types import Placement, Preemption
from gpu_pool.model import (
    Allocation,
    AllocationState,
    Policy,
    PriorityClass,
    Purpose,
    Request,
)


def eligible(request: Request) -> bool:
    """Batch class, pretraining or preemptible: may go beyond quota off-peak."""
    return (request.priority is PriorityClass.BATCH or request.purpose is Purpose.PRETRAINING
            or request.preemptible)


def local_hhmm(when: datetime, policy: Policy) -> str:
    """``when`` as ``HH:MM`` on the fleet's clock."""
    return when.astimezone(ZoneInfo(policy.off_peak.timezone)).strftime("%H:%M")


def whole_duration(d: timedelta) -> str:
    """``d`` in whole hours, minutes or seconds: '10 h', '90 min', '45 s'."""
    seconds = int(d.total_seconds())
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    if seconds % 60 == 0:
        return f"{seconds // 60} min"
    return f"{seconds} s"


@dataclass(frozen=True)
class OffPeakGate:
    """The off-peak decision of one cycle: whether lending is on and when the peak is."""

    policy: Policy
    now: datetime
    open: bool  # off-peak now and lending on
    peak: datetime | None  # the next peak (None: not off-peak, or no peak within a week)

    @classmethod
    def at(cls, policy: Policy, now: datetime) -> OffPeakGate:
        is_open = policy.lend_idle_off_peak and policy.off_peak.contains(now)
        return cls(policy, now, is_open, policy.off_peak.peak_starts(now) if is_open else None)

    @property
    def peak_text(self) -> str:
        if self.peak is None:
            return "the peak"
        return f"the peak at {local_hhmm(self.peak, self.policy)} {self.policy.off_peak.timezone}"

    def lends(self, request: Request) -> bool:
        """Whether ``request`` may go beyond its quota now (module docstring: *lent*)."""
        if not self.open or not eligible(request):
            return False
        # Preemptible work may run past the peak, which takes it back with grace: only
        # while it may still be preempted (max_preemptions_per_task).
        reclaimable = (request.preemptible
                       and request.preemptions < self.policy.max_preemptions_per_task)
        if reclaimable or self.peak is None:
            return True
        return (request.time_limit is not None
                and self.now + request.time_limit <= self.peak)

    def held_back(self, request: Request) -> str | None:
        """The sentence for an eligible request kept within quota because it would run
        past the peak; None when it is lent or not eligible."""
        if not self.open or not eligible(request) or self.lends(request):
            return None
        if request.time_limit is None:
            why = "it has no time limit, so it could run past"
        else:
            why = f"its {whole_duration(request.time_limit)} time limit runs past"
        return f"held back: {why} {self.peak_text}; off-peak work must end before the peak"


def mark_beyond_quota(placements: Sequence[Placement], requests: dict[str, Request],
                      lent: set[str], book: QuotaBook, models: dict[str, str | None],
                      gate: OffPeakGate) -> list[Placement]:
    """``placements`` with the lent ones that do not fit the quota left marked off-peak.

    Placements that are not lent draw on their groups first (the plan kept them within
    quota); lent ones then draw, in plan order, on what is left of their own group (the
    group they would use without lending); a part that finds no room makes the whole
    placement off-peak. ``models``: node name -> GPU model.
    """
    if not lent or book.open_fleet:
        return list(placements)
    left = book.remaining().astype(np.int64)
    index = {k: i for i, k in enumerate(book.keys)}
    for p in placements:
        if p.request_name in lent:
            continue
        r = requests[p.request_name]
        for a in p.assignments:
            g = book._resolve(index, r.team, r.purpose, models.get(a.node))
            if g >= 0:
                left[g] -= len(a.gpu_indices) * a.gpu_milli
    note = f"off-peak: beyond quota until {gate.peak_text}"
    out = []
    for p in placements:
        if p.request_name not in lent:
            out.append(p)
            continue
        r = requests[p.request_name]
        trial = left.copy()
        beyond = False
        for a in p.assignments:
            g = book._resolve(index, r.team, r.purpose, models.get(a.node))
            milli = len(a.gpu_indices) * a.gpu_milli
            if g >= 0 and trial[g] >= milli:
                trial[g] -= milli
            elif milli:
                beyond = True
        if beyond:
            text = note if gate.peak is not None else "off-peak: beyond quota while off-peak"
            out.append(replace(p, off_peak=True, note=f"{p.note}; {text}" if p.note else text))
        else:
            left = trial
            out.append(p)
    return out


def peak_reclaims(allocations: Sequence[Allocation], policy: Policy,
                  now: datetime) -> list[Preemption]:
    """Preemptions of the off-peak allocations the peak ends (module docstring)."""
    if policy.off_peak.contains(now):
        return []
    out = []
    for a in allocations:
        if a.state is not AllocationState.ACTIVE or not a.off_peak or not a.preemptible:
            continue
        if a.preemptions >= policy.max_preemptions_per_task:
            continue  # preempted as often as a task may be: left to its time limit
        grace = a.grace if a.grace is not None else policy.preemption_grace
        peak = policy.off_peak.peak_starts(a.started_at)
        ended = f" at {local_hhmm(peak, policy)}" if peak is not None and peak <= now else ""
        out.append(Preemption(
            a.id or f"{a.request_name}@{a.node}", a.request_name, "",
            f"preempted: the off-peak window ended{ended}, grace "
            f"{grace.total_seconds():g} s", grace_s=grace.total_seconds(), kind="peak"))
    return out

