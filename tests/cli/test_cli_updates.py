"""Updates change only what was given; multi-item writes are all or nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from gpu_pool.cli import main
from gpu_pool.store import Store


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["--db", url, "db", "migrate"]) == 0
    assert main(["--db", url, "team", "add", "nlp", "--email", "nlp@example.org"]) == 0
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  - {name: n1, gpu_model: A100, gpus: 8, cpu: 64, memory: 1TiB}\n")
    assert main(["--db", url, "nodes", "import", str(fleet)]) == 0
    return url


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict | list:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_team_add_of_an_existing_team_changes_only_what_is_given(
        db: str, capsys: pytest.CaptureFixture[str]) -> None:
    unchanged = _json(capsys, "--db", db, "--json", "team", "add", "nlp")
    assert unchanged["email"] == "nlp@example.org"  # was wiped before
    assert unchanged["changed"].startswith("nothing (it exists")
    hooked = _json(capsys, "--db", db, "--json", "team", "add", "nlp", "--webhook",
                   "conn:nlp_slack")
    assert (hooked["email"], hooked["webhook"]) == ("nlp@example.org", "conn:nlp_slack")
    assert hooked["changed"] == "webhook - -> conn:nlp_slack"
    (team,) = Store.from_url(db).list_teams()
    assert (team.notify_email, team.notify_webhook) == ("nlp@example.org", "conn:nlp_slack")


def test_quota_set_says_what_it_replaced(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--db", db, "--json", "quota", "set", "--team", "nlp", "--purpose", "training",
            "--from", "2026-01-01"]
    first = _json(capsys, *argv, "--gpus", "4", "--expires", "2099-01-01")
    assert first["replaced"] == "-"
    second = _json(capsys, *argv, "--gpus", "8", "--expires", "2099-06-01", "--budget", "100")
    assert second["replaced"] == ("4 GPUs (borrow 0) valid 2026-01-01 00:00 to "
                                  "2099-01-01 00:00")
    assert second["gpus"] == 8


def test_a_quota_file_is_granted_whole_or_not_at_all(
        db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "quotas.yaml"
    good = {"team": "nlp", "purpose": "training", "gpus": 4, "valid_from": "2026-01-01",
            "expires_at": "2099-01-01"}
    path.write_text(yaml.safe_dump({"quotas": [good, {**good, "purpose": "inference",
                                                      "team": "ghosts"}]}))
    capsys.readouterr()
    assert main(["--db", db, "quota", "import", str(path)]) == 2
    err = capsys.readouterr().err
    assert "quota #2: team: got 'ghosts'; expected a known team: nlp" in err
    assert Store.from_url(db).list_quotas() == []  # the first, good one was not kept
    path.write_text(yaml.safe_dump({"quotas": [good, {**good, "purpose": "inference"}]}))
    rows = _json(capsys, "--db", db, "--json", "quota", "import", str(path))
    assert [(r["purpose"], r["replaced"]) for r in rows] == [("training", "-"),
                                                            ("inference", "-")]


def test_a_request_file_is_submitted_whole_or_not_at_all(
        db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "requests.yaml"
    path.write_text(yaml.safe_dump([{"name": "a", "team": "nlp"}, {"name": "b", "team": "nlp"},
                                    {"name": "a", "team": "nlp"}]))
    capsys.readouterr()
    assert main(["--db", db, "submit", "--file", str(path)]) == 2
    assert "request #3: name: got 'a'" in capsys.readouterr().err
    store = Store.from_url(db)
    assert store.pending_requests() == [] and store.events(subject="a") == []


def test_a_request_from_a_user_cannot_backdate_itself(db: str, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(yaml.safe_dump({"name": "old", "team": "nlp",
                                    "submitted_at": "2026-01-01T00:00:00Z"}))
    capsys.readouterr()
    assert main(["--db", db, "submit", "--file", str(path)]) == 2
    assert ("submitted_at: got '2026-01-01T00:00:00Z'; expected a time within 5 minutes of "
            "now") in capsys.readouterr().err
