"""The API's allocation view and the ledger export carry the sharing marks (pure parts)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpu_pool.api import views
from gpu_pool.api.schemas import LedgerEntryOut
from gpu_pool.model import Allocation, LedgerEntry, Outcome, PriorityClass, Purpose
from gpu_pool.ops.snapshot import LEDGER_COLUMNS, ledger_frame

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _alloc(borrowed_from: str | None) -> Allocation:
    return Allocation("r", "n1", (0, 1), 1000, 0, 0, "nlp", Purpose.TRAINING,
                      PriorityClass.BATCH, "A100", NOW, preemptible=True, id="a1",
                      borrowed_from=borrowed_from, off_peak=borrowed_from == "")


def test_allocation_view_says_whose_gpus_it_borrows() -> None:
    assert views.allocation_out(_alloc("cv"), {}).borrowed_from == "cv"
    unguaranteed = views.allocation_out(_alloc(""), {})
    assert (unguaranteed.borrowed_from, unguaranteed.off_peak) == ("", True)
    assert views.allocation_out(_alloc(None), {}).borrowed_from is None


def test_ledger_rows_keep_borrowed_off_peak_and_transfer() -> None:
    entries = [LedgerEntry("a1", "r", "nlp", Purpose.TRAINING, "n1", "A100", 2.0, NOW,
                           NOW + timedelta(hours=1), Outcome.PREEMPTED, 2.2,
                           borrowed_from="cv", off_peak=True, transfer_s=30.0,
                           expected_wait_saved_s=900.0),
               LedgerEntry("a2", "s", "cv", Purpose.TRAINING, "n1", "A100", 1.0, NOW,
                           NOW + timedelta(hours=2), Outcome.SUCCESS)]
    frame = ledger_frame(entries)
    assert list(frame.columns) == list(LEDGER_COLUMNS)
    rows = frame.to_dict("records")
    assert (rows[0]["borrowed_from"], rows[0]["off_peak"], rows[0]["transfer_s"],
            rows[0]["expected_wait_saved_s"]) == ("cv", True, 30.0, 900.0)
    assert (rows[1]["borrowed_from"], rows[1]["off_peak"]) == (None, False)
    out = LedgerEntryOut(allocation_id="a1", request="r", team="nlp", purpose="training",
                         node="n1", gpu_model="A100", gpus=2.0, started_at=NOW, ended_at=NOW,
                         gpu_hours=0.0, cost=0.0, outcome="preempted", borrowed_from="cv")
    assert out.model_dump()["borrowed_from"] == "cv"


def test_fleet_holders_say_whose_gpus_they_borrow_and_off_peak() -> None:
    lent = views.holder_out(_alloc("cv"), {})
    assert (lent.borrowed_from, lent.off_peak) == ("cv", False)
    night = views.holder_out(_alloc(""), {})
    assert (night.borrowed_from, night.off_peak) == ("", True)
    own = views.holder_out(_alloc(None), {})
    assert (own.borrowed_from, own.off_peak) == (None, False)
