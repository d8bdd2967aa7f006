"""Snapshots to a real S3 server: read back equal to the store, reruns overwrite, outages
are caught up; the monthly report from store data."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pandas as pd
import pytest

from gpu_pool.model import Outcome, Policy
from gpu_pool.objectstore import ObjectStoreConfig, ObjectStoreError, S3ObjectStore
from gpu_pool.ops.config import OpsConfig
from gpu_pool.ops.records import OpsRecords
from gpu_pool.ops.runs import months_due, run_report, run_snapshots
from gpu_pool.ops.snapshot import ledger_frame, read_parquet

D1 = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)
H = timedelta(hours=1)


def _history(fleet, store) -> None:
    fleet.team("vision")
    fleet.team("nlp")
    fleet.node("n1", gpus=8)
    fleet.run("v1", "vision", 2, D1)
    fleet.run("n1-job", "nlp", 1, D1)
    store.release_request("v1", Outcome.SUCCESS, "test", "done", D1 + 3 * H,
                          metrics={"loss": 0.25})
    store.release_request("n1-job", Outcome.FAILED, "test", "oom", D1 + 20 * H)  # next day
    fleet.run("v2", "vision", 4, D1 + 21 * H)  # still running


def test_snapshot_reads_back_equal_and_rerun_overwrites(fleet, store, objstore) -> None:
    _history(fleet, store)
    now = D1 + 22 * H  # 2026-12-01 07:00
    done = run_snapshots(store, objstore, OpsConfig(), now)
    assert [d.period for d in done] == [date(2026, 11, 30), date(2026, 12, 1)]
    assert [d.ledger_rows for d in done] == [1, 1]
    both = pd.concat([read_parquet(objstore.get_bytes(f"ledger/dt={d}/part-0.parquet"))
                      for d in ("2026-11-30", "2026-12-01")], ignore_index=True)
    pd.testing.assert_frame_equal(both, ledger_frame(store.ledger()), check_dtype=False)
    assert both.loc[0, "metrics"] == '{"loss": 0.25}'
    csv = pd.read_csv(pd.io.common.BytesIO(objstore.get_bytes(
        "ledger/dt=2026-11-30/part-0.csv")))
    assert list(csv["request_name"]) == ["v1"]
    fleet_now = read_parquet(objstore.get_bytes("fleet/dt=2026-12-01/part-0.parquet"))
    assert len(fleet_now) == 8 and set(fleet_now["node"]) == {"n1"}
    allocs = read_parquet(objstore.get_bytes("allocations/dt=2026-12-01/part-0.parquet"))
    assert list(allocs["request_name"]) == ["v2"]
    events = read_parquet(objstore.get_bytes("events/dt=2026-11-30/part-0.parquet"))
    assert len(events) > 0 and "kind" in events.columns
    keys = objstore.list_keys()
    again = run_snapshots(store, objstore, OpsConfig(), now)  # rerun: resumes at the last day
    assert [d.period for d in again] == [date(2026, 12, 1)]
    assert objstore.list_keys() == keys
    records = OpsRecords(store.engine)
    assert [e["period"] for e in records.exports("daily")] == ["2026-11-30", "2026-12-01"]


def test_outage_fails_clearly_and_next_run_catches_up(fleet, store, objstore, s3_config) -> None:
    from tests.ops.conftest import free_port

    _history(fleet, store)
    records = OpsRecords(store.engine)
    run_snapshots(store, objstore, OpsConfig(), D1 + H)  # 2026-11-30 exported
    down = S3ObjectStore(ObjectStoreConfig(
        bucket=s3_config.bucket, prefix=s3_config.prefix,
        endpoint_url=f"http://127.0.0.1:{free_port()}", access_key="testing",
        secret_key="testing", max_attempts=2, connect_timeout_s=0.5))
    for day in (2, 3):  # two runs while the store is down
        with pytest.raises(ObjectStoreError, match="cannot reach"):
            run_snapshots(store, down, OpsConfig(), D1 + day * 24 * H)
    assert records.last_export("daily") == "2026-11-30"
    back = run_snapshots(store, objstore, OpsConfig(), D1 + 3 * 24 * H)
    assert [d.period.isoformat() for d in back] == ["2026-11-30", "2026-12-01", "2026-12-02",
                                                    "2026-12-03"]
    assert records.last_export("daily") == "2026-12-03"
    dec1 = read_parquet(objstore.get_bytes("ledger/dt=2026-12-01/part-0.parquet"))
    assert list(dec1["request_name"]) == ["n1-job"]


def test_a_day_without_events_still_has_its_csv_header(fleet, store, objstore) -> None:
    fleet.team("vision")
    quiet = D1 + 3 * 24 * H  # nothing happened on 2026-12-03
    run_snapshots(store, objstore, OpsConfig(), quiet, days=[quiet.date()])
    for table in ("events", "ledger", "queue", "allocations"):
        csv = objstore.get_bytes(f"{table}/dt=2026-12-03/part-0.csv")
        frame = pd.read_csv(pd.io.common.BytesIO(csv))  # a lone newline raised here
        assert frame.empty and len(frame.columns) > 3, (table, csv)
    events = pd.read_csv(pd.io.common.BytesIO(objstore.get_bytes(
        "events/dt=2026-12-03/part-0.csv")))
    assert list(events.columns) == ["at", "subject_kind", "subject", "kind", "actor",
                                    "reason", "data"]


def test_without_bucket_versioning_an_export_never_replaces_an_earlier_one(
        fleet, store, plain_objstore) -> None:
    _history(fleet, store)
    assert plain_objstore.keeps_history() is False
    first = run_snapshots(store, plain_objstore, OpsConfig(), D1 + 4 * H)
    (key,) = [k for k in first[0].keys if "by_team/" not in k and k.endswith(
        "ledger/dt=2026-11-30/exported_at=20261130T130000000000Z/part-0.parquet")]
    before = plain_objstore.get_bytes(key.split("gpu-pool/test/", 1)[1])
    fleet.run("v3", "vision", 1, D1 + 4 * H)  # 11-30 grows by one ledger row
    store.release_request("v3", Outcome.SUCCESS, "test", "done", D1 + 5 * H)
    again = run_snapshots(store, plain_objstore, OpsConfig(), D1 + 6 * H,
                          days=[D1.date()])
    assert set(again[0].keys).isdisjoint(first[0].keys)
    # The earlier snapshot is still there, unchanged; the later one has the new row.
    assert plain_objstore.get_bytes(key.split("gpu-pool/test/", 1)[1]) == before
    latest = [k for k in plain_objstore.list_keys("ledger/dt=2026-11-30/")
              if k.endswith(".parquet")]
    assert len(latest) == 2
    assert len(read_parquet(plain_objstore.get_bytes(max(latest)))) == 2


def test_a_bucket_gpu_pool_creates_keeps_history(objstore) -> None:
    assert objstore.keeps_history() is True


def test_monthly_report_from_store(fleet, store, objstore) -> None:
    from gpu_pool.probe import GpuReading

    fleet.team("vision")
    fleet.node("n1", gpus=2)
    start = datetime(2026, 11, 10, tzinfo=UTC)
    fleet.quota("vision", 2, datetime(2026, 11, 1, tzinfo=UTC), datetime(2027, 1, 1, tzinfo=UTC))
    (alloc,) = fleet.run("small", "vision", 1, start)
    for minute in range(0, 120, 10):
        store.record_gpu_readings("n1", [GpuReading(alloc.gpu_indices[0], "A100", "A100", 81920,
                                                    8000, 60.0, 50.0, "u")],
                                  start + timedelta(minutes=minute))
    store.release_request("small", Outcome.SUCCESS, "test", "done", start + 2 * H)
    now = datetime(2026, 12, 1, 3, tzinfo=UTC)
    assert months_due(store, now) == ["2026-11"]
    built, keys = run_report(store, objstore, "2026-11", Policy(), now)
    team = built.teams.set_index("team").loc["vision"]
    assert team["gpu_hours"] == pytest.approx(2.0)
    assert team["utilisation_pct"] == pytest.approx(60.0)
    # 8000 MiB peak on an 80 GB A100: a 16 GB card would have done
    assert list(built.rightsizing["suggested"]) == ["T4"]
    assert "report/month=2026-11/report.md" in objstore.list_keys("report/")
    assert months_due(store, now) == []
    # report.md, four CSV tables (one of cross-zone moves), the chart; and vision's own rows
    assert len(keys) == 6 + 3
    assert objstore.list_keys("by_team/team=vision/year=2026/report/") == [
        f"by_team/team=vision/year=2026/report/month=2026-11/{name}"
        for name in ("rightsizing.csv", "teams.csv", "top_tasks.csv")]
    mine = pd.read_csv(pd.io.common.BytesIO(objstore.get_bytes(
        "by_team/team=vision/year=2026/report/month=2026-11/teams.csv")))
    assert list(mine["team"]) == ["vision"]


def test_the_audit_and_each_teams_rows_are_archived_by_team_and_year(
        fleet, store, objstore) -> None:
    """"Team nlp, 2026" is one listing: its ledger rows and its changes, day by day."""
    _history(fleet, store)
    store.add_member("nlp", "alice", "admin", role="lead")
    store.save_template("llm", {"gpus": 2}, "alice", team="nlp")
    now = datetime.now(UTC)  # the store's own clock wrote the changes
    run_snapshots(store, objstore, OpsConfig(), now)
    today = now.date().isoformat()
    audit = read_parquet(objstore.get_bytes(f"audit/dt={today}/part-0.parquet"))
    assert "team.added" in set(audit["kind"])  # the fixture's teams and nodes, today too
    assert list(audit["kind"])[-2:] == ["team.member_added", "template.created"]
    assert list(audit["actor"])[-2:] == ["admin", "alice"]
    last = audit.iloc[-1]
    assert last["after"] == '{"gpus": 2}' and last["teams"] == "nlp"
    nlp = objstore.list_keys("by_team/team=nlp/year=2026/")
    assert "by_team/team=nlp/year=2026/ledger/dt=2026-12-01/part-0.csv" in nlp  # n1-job
    assert f"by_team/team=nlp/year={now.year}/audit/dt={today}/part-0.csv" in objstore.list_keys(
        f"by_team/team=nlp/year={now.year}/")
    rows = pd.read_csv(pd.io.common.BytesIO(objstore.get_bytes(
        "by_team/team=nlp/year=2026/ledger/dt=2026-12-01/part-0.csv")))
    assert list(rows["request_name"]) == ["n1-job"]
    vision = pd.read_csv(pd.io.common.BytesIO(objstore.get_bytes(
        f"by_team/team=vision/year={now.year}/audit/dt={today}/part-0.csv")))
    assert list(vision["kind"]) == ["team.added"]  # none of nlp's changes
