"""``gpu-pool alerts run``, ``reclaim``, ``ledger export`` and ``report`` end to end."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from gpu_pool.cli import main
from gpu_pool.model import Outcome

DAY = timedelta(days=1)


@pytest.fixture
def db(tmp_path, monkeypatch):
    """A SQLite store with a team, a node, an expiring quota and some history."""
    from tests.ops.conftest import Fleet

    from gpu_pool.store import Store

    url = f"sqlite:///{tmp_path / 'cli.db'}"
    store = Store.from_url(url)
    store.migrate()
    fleet = Fleet(store)
    now = datetime.now(UTC)
    fleet.team("vision", email="vision@example.org")
    fleet.node("n1")
    fleet.quota("vision", 4, now - 40 * DAY, now + 3 * DAY)
    last_month = now.replace(day=1) - 3 * DAY
    fleet.run("old", "vision", 1, last_month)
    store.release_request("old", Outcome.SUCCESS, "test", "done", last_month + timedelta(hours=2))
    fleet.run("live", "vision", 2, now - timedelta(hours=2))
    store.close()
    return url


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_alerts_dry_run_then_send_once(db, capsys, smtp_server) -> None:
    code, out, _ = run(capsys, "alerts", "run", "--dry-run", "--db", db, "--json")
    assert code == 0
    assert [(n["kind"], n["threshold"]) for n in json.loads(out)] == [("quota_expiring", 7)]
    assert smtp_server.messages == []
    send = ("alerts", "run", "--db", db, "--smtp-host", smtp_server.host,
            "--smtp-port", str(smtp_server.port))
    code, out, _ = run(capsys, *send)
    assert code == 0 and "sent via email" in out and len(smtp_server.messages) == 1
    code, out, _ = run(capsys, *send)
    assert code == 0 and "no new notices (1 already sent)" in out
    assert len(smtp_server.messages) == 1


def test_reclaim_without_liveness_releases_nothing(db, capsys) -> None:
    code, out, _ = run(capsys, "reclaim", "--liveness", "none", "--db", db)
    assert code == 0 and "nothing to reclaim (1 holds alive)" in out
    code, out, _ = run(capsys, "reclaim", "--liveness", "none", "--dry-run", "--db", db)
    assert code == 0 and "nothing to reclaim" in out


def test_ledger_export_and_report(db, capsys, tmp_path, monkeypatch, objstore, s3_config) -> None:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow"))
    monkeypatch.setenv("AIRFLOW_CONN_GPU_POOL_S3", json.dumps({
        "conn_type": "aws", "login": s3_config.access_key, "password": s3_config.secret_key,
        "extra": {"endpoint_url": s3_config.endpoint_url, "bucket": s3_config.bucket,
                  "prefix": s3_config.prefix}}))
    code, out, err = run(capsys, "ledger", "export", "--db", db, "--json")
    assert code == 0, err
    periods = json.loads(out)
    assert periods[0]["ledger_rows"] == 1 and sum(p["ledger_rows"] for p in periods) == 1
    assert any(k.startswith("ledger/dt=") for k in objstore.list_keys())
    out_dir = tmp_path / "report"
    code, out, err = run(capsys, "report", "--db", db, "--out", str(out_dir), "--upload",
                         "--json")
    assert code == 0, err
    (team,) = json.loads(out)
    assert team["team"] == "vision" and team["gpu_hours"] == pytest.approx(2.0)
    assert (out_dir / "report.md").read_text().startswith("# GPU usage report")
    assert (out_dir / "gpu_hours.png").read_bytes()[:4] == b"\x89PNG"
    assert any(k.endswith("report.md") for k in objstore.list_keys("report/"))


@pytest.mark.parametrize(("argv", "message"), [
    (("reclaim", "--config", '{"idle_action": "kill"}'), "gpu_pool_ops.idle_action: got 'kill'"),
    (("ledger", "export", "--day", "2026-13-01"), "expected a date YYYY-MM-DD"),
    (("report", "--month", "26-1"), "expected a month YYYY-MM"),
    (("alerts", "run", "--config", "[]"), "gpu_pool_ops: got []; expected a JSON object"),
])
def test_bad_input_exits_2(db, capsys, argv, message) -> None:
    code, _, err = run(capsys, *argv, "--db", db)
    assert code == 2 and message in err and err.count("\n") == 1, err
