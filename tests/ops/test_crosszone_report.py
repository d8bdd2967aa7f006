"""The monthly report's cross-zone moves, from hand-built ledger entries: which paid, which not."""

from __future__ import annotations

import io
import math
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from gpu_pool.model import (
    Allocation,
    Dataset,
    Gpu,
    LedgerEntry,
    Node,
    Outcome,
    Policy,
    PriorityClass,
    Purpose,
    Request,
)
from gpu_pool.ops import crosszone, runs
from gpu_pool.ops.report import build_report, month_bounds, to_markdown, write_report
from gpu_pool.ops.snapshot import ledger_frame

T0 = datetime(2026, 11, 10, 8, 0, tzinfo=UTC)
H = timedelta(hours=1)
LO, HI = month_bounds("2026-11")


def node(name: str, zone: str, gpus: int = 4, model: str = "A100") -> Node:
    return Node(name, tuple(Gpu(i, model, 80 * 1024) for i in range(gpus)), 64_000,
                512 * 1024, zone=zone)


NODES = [node("e1", "eu"), node("e2", "eu"), node("e3", "eu", model="T4"), node("u1", "us"),
         node("u2", "us")]


def entry(name: str, where: str, start: datetime, end: datetime, *, gpus: float = 4,
          transfer: float = 0.0, expected: float = 0.0, team: str = "vision") -> LedgerEntry:
    return LedgerEntry(f"a-{name}-{where}", name, team, Purpose.TRAINING, where, "A100", gpus,
                       start, end, Outcome.SUCCESS, 2.2, transfer_s=transfer,
                       expected_wait_saved_s=expected)


def scenario() -> tuple[list[LedgerEntry], list[Allocation], dict[str, Dataset]]:
    """paid: eu full until T0+2h, moved at T0 with a 10-minute transfer. not-paid: moved at
    T0+5h with a 1-hour transfer, e1 freed 30 min later. gang: two nodes, eu's second node
    frees at T0+3h. late: moved 10 min before the month ended, eu held by active work."""
    moves = [
        entry("paid", "u1", T0, T0 + 6 * H, transfer=600, expected=7200),
        entry("not-paid", "u2", T0 + 5 * H, T0 + 9 * H, transfer=3600, expected=6000,
              team="nlp"),
        entry("gang", "u1", T0 + 20 * H, T0 + 22 * H, transfer=900, expected=math.inf),
        entry("gang", "u2", T0 + 20 * H, T0 + 22 * H, transfer=900, expected=math.inf),
    ]
    home = [
        entry("h1", "e1", T0 - H, T0 + 2 * H), entry("h2", "e2", T0 - H, T0 + 3 * H),
        entry("h3", "e1", T0 + 4 * H, T0 + 5.5 * H), entry("h4", "e2", T0 + 4 * H, T0 + 10 * H),
        entry("h5", "e1", T0 + 19 * H, T0 + 21 * H), entry("h6", "e2", T0 + 19 * H, T0 + 23 * H),
        # a T4 node of eu frees early: the moves ran on A100, it does not count
        entry("h7", "e3", T0 - H, T0 + H / 60),
        entry("home-only", "e1", T0 + 30 * H, T0 + 31 * H),  # no move: not listed
    ]
    late_start = HI - timedelta(minutes=10)
    late = [entry("late", "u1", late_start, HI - timedelta(minutes=1), transfer=3600,
                  expected=9000)]
    active = [Allocation(f"busy{i}", f"e{i}", (0, 1, 2, 3), 1000, 0, 0, "nlp",
                         Purpose.TRAINING, PriorityClass.NORMAL, "A100", HI - 2 * H)
              for i in (1, 2)]
    datasets = {n: Dataset(f"s3://lake/{n}", "eu", size)
                for n, size in (("paid", 500.0), ("not-paid", 800.0), ("gang", 2000.0),
                                ("late", 100.0))}
    return moves + home + late, active, datasets


def test_moves_paid_not_paid_and_unknown() -> None:
    entries, active, datasets = scenario()
    holds = crosszone.holds_of(entries, active)
    moves = {m.request: m for m in crosszone.moves_of(entries, holds, NODES, datasets, HI)}
    assert set(moves) == {"paid", "not-paid", "gang", "late"}
    paid = moves["paid"]
    assert (paid.from_zone, paid.to_zone, paid.size_gib) == ("eu", "us", 500.0)
    assert paid.home_room_at == T0 + 2 * H and paid.actual_wait_saved_s == 7200
    assert paid.paid == "yes"
    not_paid = moves["not-paid"]
    assert not_paid.home_room_at == T0 + 5.5 * H
    assert not_paid.actual_wait_saved_s == 1800 and not_paid.paid == "no"
    gang = moves["gang"]
    assert gang.to_zone == "us" and gang.home_room_at == T0 + 23 * H  # the second node
    assert gang.actual_wait_saved_s == 3 * 3600 and gang.paid == "yes"
    assert math.isinf(gang.expected_wait_saved_s)
    late = moves["late"]
    assert late.home_room_at is None and late.actual_wait_saved_s == 600
    assert late.paid == "unknown"
    assert crosszone.summary(list(moves.values())) == (
        "4 cross-zone moves, 2.4 h of transfer: 2 paid, 1 did not, 1 not known yet")


def test_a_move_whose_home_had_room_at_once_did_not_pay() -> None:
    entries = [entry("m", "u1", T0, T0 + H, transfer=60, expected=600)]
    moves = crosszone.moves_of(entries, crosszone.holds_of(entries), NODES,
                               {"m": Dataset("s3://x", "eu", 10.0)}, HI)
    assert moves[0].home_room_at == T0 and moves[0].paid == "no"


def test_request_no_longer_on_record_keeps_its_row() -> None:
    entries = [entry("gone", "u1", T0, T0 + H, transfer=60, expected=600)]
    moves = crosszone.moves_of(entries, [], NODES, {}, HI)
    assert (moves[0].from_zone, moves[0].size_gib, moves[0].paid) == ("?", None, "yes")


def test_report_has_the_cross_zone_table(objstore) -> None:
    entries, active, datasets = scenario()
    moves = crosszone.moves_of(entries, crosszone.holds_of(entries, active), NODES, datasets,
                               HI)
    report = build_report("2026-11", ledger_frame(entries), [], [], Policy(), moves=moves)
    frame = report.cross_zone.set_index("request")
    assert list(frame.index) == ["paid", "not-paid", "gang", "late"]
    assert frame.loc["paid", "paid"] == "yes" and frame.loc["not-paid", "paid"] == "no"
    assert frame.loc["not-paid", "team"] == "nlp"
    assert frame.loc["gang", "transfer_s"] == 900
    md = to_markdown(report)
    assert "## Cross-zone moves" in md
    assert "4 moves, 2.4 h of transfer: 2 paid, 1 did not, 1 not known yet" in md
    assert "| not-paid | nlp | eu | us | 800.00 |" in md
    keys = write_report(objstore, report, datetime(2026, 12, 1, 9, tzinfo=UTC))
    assert any(k.endswith("/cross_zone.csv") for k in keys)
    csv = pd.read_csv(io.BytesIO(objstore.get_bytes("report/month=2026-11/cross_zone.csv")))
    assert list(csv["paid"]) == ["yes", "no", "yes", "unknown"]


def test_a_month_without_moves_says_none() -> None:
    report = build_report("2026-11", ledger_frame([entry("x", "e1", T0, T0 + H)]), [], [],
                          Policy())
    assert report.cross_zone.empty
    assert "0 moves, 0.0 h of transfer" in to_markdown(report)


class _Store:
    """What runs.cross_zone_moves reads of a store (the ledger columns that carry the
    transfer land with the lending branch's migration)."""

    def __init__(self) -> None:
        self.entries, self.active, self.datasets = scenario()

    def ledger(self, since=None, until=None):  # noqa: ANN001, ANN201
        return [e for e in self.entries if (since is None or e.ended_at >= since)
                and (until is None or e.ended_at < until)]

    def active_allocations(self):  # noqa: ANN201
        return self.active

    def get_request(self, name: str):  # noqa: ANN201
        ds = self.datasets.get(name)
        return None if ds is None else Request(name, "vision", dataset=ds)

    def list_nodes(self):  # noqa: ANN201
        return NODES


def test_runs_reads_the_months_moves_from_the_store() -> None:
    moves = runs.cross_zone_moves(_Store(), LO, HI)
    assert [m.request for m in moves] == ["paid", "not-paid", "gang", "late"]
    assert [m.paid for m in moves] == ["yes", "no", "yes", "unknown"]
    # only moves that ended in the period
    assert [m.request for m in runs.cross_zone_moves(_Store(), LO, T0 + 10 * H)] == [
        "paid", "not-paid"]


@pytest.mark.parametrize("seconds", [math.inf, 12.5])
def test_finite_for_json(seconds: float) -> None:
    assert crosszone.finite(seconds) == (None if math.isinf(seconds) else seconds)
