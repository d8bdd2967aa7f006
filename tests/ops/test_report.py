"""The monthly report from frames, and its objects in a real S3 server."""

from __future__ import annotations

import io
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from gpu_pool.model import LedgerEntry, Outcome, Policy, Purpose, Quota
from gpu_pool.ops.records import ReclaimRecord
from gpu_pool.ops.report import build_report, month_bounds, to_markdown, write_report
from gpu_pool.ops.snapshot import ledger_frame

T0 = datetime(2026, 11, 3, 8, 0, tzinfo=UTC)
NOW = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)  # when the report is written


def entry(name: str, team: str, hours: float, gpus: float = 1, model: str = "A100",
          price: float = 2.2, **metrics: float) -> LedgerEntry:
    return LedgerEntry(allocation_id=f"a-{name}", request_name=name, team=team,
                       purpose=Purpose.TRAINING, node="n1", gpu_model=model, gpus=gpus,
                       started_at=T0, ended_at=T0 + timedelta(hours=hours),
                       outcome=Outcome.SUCCESS, price_per_gpu_hour=price, metrics=metrics)


@pytest.fixture
def report():
    ledger = ledger_frame([
        entry("vision-big", "vision", 10, gpus=4, gpu_util_mean_pct=20.0),
        entry("vision-small", "vision", 5, gpu_mem_peak_mib=9000, gpu_util_mean_pct=80.0),
        entry("vision-tiny", "vision", 1),
        entry("nlp-a", "nlp", 2, gpus=2, model="H100", price=3.5),
    ])
    quotas = [Quota("vision", Purpose.TRAINING, 2, datetime(2026, 10, 1, tzinfo=UTC),
                    datetime(2026, 11, 16, tzinfo=UTC), id="q1")]
    reclaims = [ReclaimRecord(at=T0, action="idle_ended", node="n1", reason="idle", actor="t",
                              team="vision", idle_gpu_hours=3.0)]
    return build_report("2026-11", ledger, quotas, reclaims, Policy())


def test_month_bounds_wrap_the_year() -> None:
    assert month_bounds("2026-12") == (datetime(2026, 12, 1, tzinfo=UTC),
                                       datetime(2027, 1, 1, tzinfo=UTC))


def test_team_totals(report) -> None:
    t = report.teams.set_index("team")
    assert t.loc["vision", "gpu_hours"] == pytest.approx(46.0)
    assert t.loc["vision", "cost"] == pytest.approx(46 * 2.2)
    assert t.loc["nlp", "gpu_hours"] == pytest.approx(4.0)
    # weighted by GPU-hours over the entries that report utilisation: (40*20 + 5*80) / 45
    assert t.loc["vision", "utilisation_pct"] == pytest.approx(1200 / 45)
    assert pd.isna(t.loc["nlp", "utilisation_pct"])
    assert t.loc["vision", "idle_gpu_hours_reclaimed"] == 3.0
    assert t.loc["nlp", "idle_gpu_hours_reclaimed"] == 0.0
    # quota valid 1..16 Nov inside the month: 2 GPUs x 15 days
    assert t.loc["vision", "guaranteed_gpu_hours"] == pytest.approx(2 * 15 * 24)
    assert t.loc["vision", "quota_used_gpu_hours"] == pytest.approx(46.0)


def test_top_tasks_order(report) -> None:
    vision = report.top_tasks[report.top_tasks["team"] == "vision"]
    assert list(vision["request_name"]) == ["vision-big", "vision-small", "vision-tiny"]


def test_rightsizing_findings(report) -> None:
    rows = {r.task: r for r in report.rightsizing.itertuples()}
    # 9000 MiB peak * 1.1 fits a 16 GiB card: the cheapest such is T4 at 0.35
    assert rows["vision-small"].suggested == "T4"
    assert rows["vision-small"].cost_saved == pytest.approx(5 * (2.2 - 0.35))
    # 4 GPUs at 20%: ceil(4*20/70) = 2 would do, saving 2 GPUs x 10 h
    assert rows["vision-big"].suggested == "2 GPUs"
    assert rows["vision-big"].gpu_hours_saved == pytest.approx(20.0)
    assert "vision-tiny" not in rows and "nlp-a" not in rows
    assert report.teams.set_index("team").loc["vision", "rightsizing_gpu_hours_saved"] == 20.0


def test_markdown_has_a_section_per_team(report) -> None:
    md = to_markdown(report)
    assert md.startswith("# GPU usage report, 2026-11")
    assert "## vision" in md and "## nlp" in md and "fits T4" in md


def test_written_to_object_store(objstore, report) -> None:
    keys = write_report(objstore, report, NOW)
    assert [k.rsplit("/", 1)[1] for k in keys[:6]] == [
        "report.md", "teams.csv", "top_tasks.csv", "rightsizing.csv", "cross_zone.csv",
        "gpu_hours.png"]
    assert keys[6:] == [f"gpu-pool/test/by_team/team={team}/year=2026/report/month=2026-11/{name}"
                        for team in ("nlp", "vision")
                        for name in ("teams.csv", "top_tasks.csv", "rightsizing.csv")]
    nlp = pd.read_csv(io.BytesIO(objstore.get_bytes(
        "by_team/team=nlp/year=2026/report/month=2026-11/teams.csv")))
    assert list(nlp["team"]) == ["nlp"]
    png = objstore.get_bytes("report/month=2026-11/gpu_hours.png")
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    teams = pd.read_csv(io.BytesIO(objstore.get_bytes("report/month=2026-11/teams.csv")))
    assert set(teams["team"]) == {"vision", "nlp"}
    write_report(objstore, report, NOW)  # rerun: same keys, no duplicates
    assert len(objstore.list_keys("report/")) == 6


def test_empty_month_still_reports(objstore) -> None:
    empty = build_report("2026-10", ledger_frame([]), [], [], Policy())
    assert empty.teams.empty
    assert "_none_" in to_markdown(empty)
    assert len(write_report(objstore, empty, NOW)) == 6


def test_a_rerun_replaces_nothing_on_a_bucket_without_versioning(plain_objstore, report) -> None:
    first = write_report(plain_objstore, report, NOW)
    second = write_report(plain_objstore, report, NOW + timedelta(hours=1))
    assert first[0].endswith("report/month=2026-11/exported_at=20261201T090000000000Z/report.md")
    assert set(first).isdisjoint(second)
    assert len(plain_objstore.list_keys("report/")) == 12  # both exports, whole
