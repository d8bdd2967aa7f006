"""Fair share: each team's decayed past GPU-hours, from the ledger and the active allocations.

Terms
-----
decayed use of a team at ``now``
    The sum over every GPU-second the team held of ``2 ** (-age / H)`` where ``age`` =
    ``now`` minus when it was held and ``H`` = :attr:`Policy.fair_share_half_life`, in
    GPU-hours. Integrated exactly over each interval: ``g`` GPUs held from ``s`` to ``e``
    count ``g * H / ln 2 * (2 ** (-(now - e) / H) - 2 ** (-(now - s) / H)) / 3600``.
sources
    Ledger entries (allocations that ended; GPUs = indices x milli / 1000) and the active
    allocations, held from their start until ``now``. Time after ``now`` (a clock moved
    back) counts nothing.

Rules: ``H = 0`` turns fair share off (no usage at all). Entries that ended more than
``64 H`` before ``now`` are not read: they would add less than ``2 ** -64`` of their
GPU-hours, below a float's precision of the total.

Invariant: read only; the result depends on the database and ``now`` alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import Connection

from gpu_pool.model import MILLI_PER_GPU, Allocation, LedgerEntry
from gpu_pool.store import ledger

HORIZON_HALF_LIVES = 64


def decayed_gpu_hours(gpus: float, start: datetime, end: datetime, now: datetime,
                      half_life: timedelta) -> float:
    """Decayed GPU-hours of ``gpus`` held from ``start`` to ``end`` (module docstring)."""
    h = half_life.total_seconds()
    end = min(end, now)
    if h <= 0 or gpus <= 0 or end <= start:
        return 0.0
    newest = 2.0 ** (-(now - end).total_seconds() / h)
    oldest = 2.0 ** (-(now - start).total_seconds() / h)
    return gpus * h / math.log(2) * (newest - oldest) / 3600.0


def usage_from(entries: Iterable[LedgerEntry], active: Iterable[Allocation], now: datetime,
               half_life: timedelta) -> dict[str, float]:
    """Decayed GPU-hours per team from ``entries`` and ``active`` allocations."""
    out: dict[str, float] = {}
    if half_life <= timedelta(0):
        return out
    for e in entries:
        value = decayed_gpu_hours(e.gpus, e.started_at, e.ended_at, now, half_life)
        if value:
            out[e.team] = out.get(e.team, 0.0) + value
    for a in active:
        value = decayed_gpu_hours(a.gpu_milli_total / MILLI_PER_GPU, a.started_at, now, now,
                                  half_life)
        if value:
            out[a.team] = out.get(a.team, 0.0) + value
    return out


def team_usage(conn: Connection, active: Iterable[Allocation], now: datetime,
               half_life: timedelta) -> dict[str, float]:
    """:func:`usage_from` over the ledger read on ``conn`` and the ``active`` allocations
    (read by the caller in the same transaction)."""
    if half_life <= timedelta(0):
        return {}
    since = now - half_life * HORIZON_HALF_LIVES
    return usage_from(ledger.read(conn, since=since), active, now, half_life)


def ranks(usage: dict[str, float], teams: Iterable[str]) -> dict[str, int]:
    """1 for the team with least decayed use (it goes first among equals), ties by name."""
    order = sorted(set(teams) | set(usage), key=lambda t: (usage.get(t, 0.0), t))
    return {t: i + 1 for i, t in enumerate(order)}
