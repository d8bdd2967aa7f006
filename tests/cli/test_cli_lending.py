"""`gpu-pool team lend` / `team lending`, and borrowed placements shown as such."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_pool.cli import main


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["--db", url, "db", "migrate"]) == 0
    for team in ("cv", "nlp", "speech"):
        assert main(["--db", url, "team", "add", team]) == 0
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  - {name: a, gpu_model: A100, gpus: 8, cpu: 64, memory: 1TiB}\n"
                     "  - {name: b, gpu_model: A100, gpus: 8, cpu: 64, memory: 1TiB}\n")
    assert main(["--db", url, "nodes", "import", str(fleet)]) == 0
    return url


def _json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict | list:
    capsys.readouterr()
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_lend_change_list_and_revoke(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    first = _json(capsys, "--db", db, "--json", "team", "lend", "cv", "--to", "nlp,speech",
                  "--limit", "4")
    assert first == {"team": "cv", "lends_to": "nlp, speech, at most 4 GPUs at once",
                     "was": "every team (default)"}
    second = _json(capsys, "--db", db, "--json", "team", "lend", "cv", "--to", "none")
    assert (second["lends_to"], second["was"]) == ("nobody", "nlp, speech, at most 4 GPUs at "
                                                              "once")
    rows = _json(capsys, "--db", db, "--json", "team", "lending")
    assert [(r["team"], r["lends_to"], r["set_by"]) for r in rows] == [
        ("cv", "nobody", "cli"), ("nlp", "every team", "(default)"),
        ("speech", "every team", "(default)")]
    revoked = _json(capsys, "--db", db, "--json", "team", "lend", "cv", "--revoke")
    assert (revoked["lends_to"], revoked["was"]) == ("every team", "nobody")


@pytest.mark.parametrize(("argv", "field"), [
    (["team", "lend", "ghost", "--to", "all"], "team"),
    (["team", "lend", "cv", "--to", "nlp,ghost"], "to"),
    (["team", "lend", "cv", "--to", "cv"], "to"),
    (["team", "lend", "cv", "--to", "bad name!"], "to"),
    (["team", "lend", "cv", "--to", "all", "--limit", "-2"], "limit"),
    (["team", "lend", "cv"], "to"),
    (["team", "lend", "cv", "--revoke", "--to", "all"], "revoke"),
])
def test_bad_lending_is_one_line_exit_2(db: str, argv: list[str], field: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["--db", db, *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err and field in err


def test_borrowed_placement_is_shown_as_borrowed(db: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # Off-peak lending off: at night the request would be lent beyond quota, not borrowed.
    assert main(["--db", db, "policy", "set", "lend_idle_off_peak=false"]) == 0
    for team, gpus, borrow in (("cv", "8", "0"), ("nlp", "8", "4")):
        assert main(["--db", db, "quota", "set", "--team", team, "--purpose", "training",
                     "--gpus", gpus, "--borrow", borrow, "--from", "2026-01-01",
                     "--expires", "2099-01-01"]) == 0
    reqs = tmp_path / "reqs.yaml"
    reqs.write_text("- {name: own, team: nlp, gpus: 8}\n"
                    "- {name: extra, team: nlp, gpus: 4, preemptible: true}\n")
    assert main(["--db", db, "submit", "--file", str(reqs)]) == 0
    rows = _json(capsys, "--db", db, "--json", "queue")
    extra = next(r for r in rows if r["request"] == "extra")
    assert "borrowed 4 GPUs idle in team cv's quota" in extra["reason"]
    assert main(["--db", db, "place"]) == 0
    info = _json(capsys, "--db", db, "--json", "why", "extra")
    assert info["state"] == "running"
    assert info["borrowed"].startswith("from team cv's idle guarantee")
