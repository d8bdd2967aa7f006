"""The cross-zone moves of a period, and whether each paid: for the monthly report and the API.

Terms
-----
move
    An allocation the engine placed outside its dataset's zone (``transfer_s > 0`` on its
    ledger entry or allocation; one move per request try, a gang's nodes together). Its
    ``transfer_s`` and ``expected_wait_saved_s`` are what the engine recorded when it
    placed it (:mod:`gpu_pool.engine.zones`); ``expected_wait_saved_s`` is infinite when no
    hold of the home zone had a known end.
home room
    When the home zone actually had room for the move, measured from the holds on record
    (ledger entries and active allocations): the first time at or after the move's start
    when a node of the home zone with the GPU model it ran on had as many GPUs free as it
    held on one node (a gang: that many such nodes), counting a node's GPUs less those its
    holds had then (shares count as their fraction of a GPU). Holds that are still active
    hold until ``until``; room not seen before ``until`` is not measured.
actual wait saved
    ``home room - start`` when measured; else at least ``until - start``.
paid
    ``yes`` when the actual wait saved (or its lower bound) is at least the transfer time:
    waiting at home would have cost more than moving did; ``no`` when the home zone had
    room sooner than the transfer took; ``unknown`` when the home zone had no room before
    ``until`` and less time than the transfer has passed. (The expected saving always
    passed the engine's rule, ``expected >= transfer x (1 + margin)``; paid is the check
    against what happened.)

Invariants: pure functions over plain records; nothing here reads a store.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from gpu_pool.model import Allocation, Dataset, LedgerEntry, Node


@dataclass(frozen=True)
class Hold:
    """GPUs held on a node over [started_at, ended_at) (ended_at None: still held)."""

    node: str
    gpus: float
    started_at: datetime
    ended_at: datetime | None


@dataclass(frozen=True)
class Move:
    request: str
    team: str
    dataset: str | None
    from_zone: str
    to_zone: str
    size_gib: float | None  # None: the request (or its dataset) is no longer on record
    started_at: datetime
    transfer_s: float
    expected_wait_saved_s: float
    home_room_at: datetime | None  # None: not seen before ``until``
    actual_wait_saved_s: float  # measured, or its lower bound when home_room_at is None
    paid: str  # "yes", "no", "unknown"


def holds_of(entries: Iterable[LedgerEntry] = (),
             allocations: Iterable[Allocation] = ()) -> list[Hold]:
    """Holds from ledger entries (ended) and active allocations (still held)."""
    out = [Hold(e.node, float(e.gpus), e.started_at, e.ended_at) for e in entries]
    out += [Hold(a.node, a.gpu_milli_total / 1000.0, a.started_at, None) for a in allocations]
    return out


def moves_of(records: Iterable[LedgerEntry | Allocation], holds: Sequence[Hold],
             nodes: Sequence[Node], datasets: Mapping[str, Dataset | None],
             until: datetime) -> list[Move]:
    """The moves among ``records`` (ledger entries or allocations), oldest first, each with
    its measured home room and whether it paid (see the module docstring)."""
    groups: dict[tuple[str, datetime], list[LedgerEntry | Allocation]] = defaultdict(list)
    for r in records:
        if r.transfer_s > 0:
            groups[(r.request_name, r.started_at)].append(r)
    by_name = {n.name: n for n in nodes}
    held = by_node(holds)
    out = []
    for (name, start), parts in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        first = parts[0]
        ds = datasets.get(name)
        home = ds.zone if ds is not None and ds.zone else None
        to = sorted({by_name[p.node].zone if p.node in by_name else "?" for p in parts})
        transfer = max(p.transfer_s for p in parts)
        expected = max(p.expected_wait_saved_s for p in parts)
        room, saved, paid = judge(home, first.gpu_model, max(_gpus(p) for p in parts),
                                  len(parts), start, transfer, nodes, held, until)
        out.append(Move(name, first.team, ds.uri if ds is not None else None, home or "?",
                        ", ".join(to), ds.size_gib if ds is not None else None, start,
                        transfer, expected, room, saved, paid))
    return out


def judge(home: str | None, gpu_model: str | None, need: float, count: int, start: datetime,
          transfer_s: float, nodes: Sequence[Node], held: Mapping[str, list[Hold]],
          until: datetime) -> tuple[datetime | None, float, str]:
    """(home room, actual wait saved, paid) of one move (see the module docstring):
    ``need`` GPUs on each of ``count`` nodes of ``gpu_model`` in zone ``home``."""
    room = None
    if home is not None:
        candidates = [n for n in nodes if n.zone == home and n.gpu_model == gpu_model]
        room = _room_at(candidates, held, need, count, start, until)
    saved = max(((room if room is not None else until) - start).total_seconds(), 0.0)
    if saved >= transfer_s:
        return room, saved, "yes"
    return room, saved, "no" if room is not None else "unknown"


def by_node(holds: Iterable[Hold]) -> dict[str, list[Hold]]:
    held: dict[str, list[Hold]] = defaultdict(list)
    for h in holds:
        held[h.node].append(h)
    return held


def _gpus(record: LedgerEntry | Allocation) -> float:
    if isinstance(record, Allocation):
        return record.gpu_milli_total / 1000.0
    return float(record.gpus)


def _room_at(candidates: Sequence[Node], held: Mapping[str, list[Hold]], need: float,
             count: int, start: datetime, until: datetime) -> datetime | None:
    """The ``count``-th earliest time in [start, until) a candidate node had ``need`` GPUs
    free, or None."""
    times = []
    for node in candidates:
        mine = held.get(node.name, [])
        moments = sorted({start, *(h.ended_at for h in mine
                                   if h.ended_at is not None and start < h.ended_at < until)})
        for t in moments:
            busy = sum(h.gpus for h in mine
                       if h.started_at <= t and (h.ended_at is None or t < h.ended_at))
            if node.gpu_count - busy >= need - 1e-9:
                times.append(t)
                break
    times.sort()
    return times[count - 1] if len(times) >= count else None


def summary(moves: Sequence[Move]) -> str:
    """One line: how many moves, how many paid, the transfer time accepted."""
    if not moves:
        return "no cross-zone moves"
    paid = sum(m.paid == "yes" for m in moves)
    lost = sum(m.paid == "no" for m in moves)
    unknown = len(moves) - paid - lost
    hours = sum(m.transfer_s for m in moves) / 3600
    tail = f", {unknown} not known yet" if unknown else ""
    noun = "move" if len(moves) == 1 else "moves"
    return (f"{len(moves)} cross-zone {noun}, {hours:.1f} h of transfer: {paid} paid, "
            f"{lost} did not{tail}")


def finite(seconds: float) -> float | None:
    """A duration for JSON and CSV: None for an infinite one."""
    return None if math.isinf(seconds) else seconds
