"""Governance from the command line: onboarding in one step, lead-only approvals and
freezes (``--as USER`` applies that person's permissions), template save/restore, the audit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_pool.cli import main


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'g.db'}"
    assert main(["--db", url, "db", "migrate"]) == 0
    for team in ("nlp", "cv"):
        assert main(["--db", url, "team", "add", team]) == 0
    return url


def run(capsys: pytest.CaptureFixture[str], db: str, *argv: str) -> tuple[int, object, str]:
    code = main(["--db", db, "--json", *argv])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else None), err


def test_onboarding_and_who_may_do_what(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, db, "team", "add-member", "nlp", "alice", "--lead")[0] == 0
    code, member, _ = run(capsys, db, "team", "add-member", "nlp", "bob")
    assert code == 0 and member["role"] == "member" and member["added_by"].startswith("cli:")
    # Only an admin (no --as) manages members.
    code, _, err = run(capsys, db, "team", "add-member", "nlp", "eve", "--as", "alice")
    assert code == 2 and "only an admin may add team members" in err
    # Templates: any admin creates; only nlp's lead may change, restore or approve.
    assert run(capsys, db, "template", "save", "llm", "--team", "nlp", "--set", "gpus=2",
               "--set", "gpu_models=[A100]", "--set", "setup=source /opt/venv/bin/activate"
               )[0] == 0
    code, _, err = run(capsys, db, "template", "save", "llm", "--set", "gpus=4", "--as", "bob")
    assert code == 2 and "a lead of team nlp" in err and "leads of nlp: alice" in err
    code, saved, _ = run(capsys, db, "template", "save", "llm", "--set", "gpus=4",
                         "--as", "alice", "--comment", "bigger")
    assert code == 0 and saved["version"] == 2
    assert json.loads(saved["fields"]) == {"gpu_models": ["A100"], "gpus": 4,
                                           "setup": "source /opt/venv/bin/activate"}
    code, _, err = run(capsys, db, "template", "approve", "llm", "--team", "cv", "--as", "bob")
    assert code == 2 and "approve the use of template llm" in err
    code, approved, _ = run(capsys, db, "template", "approve", "llm", "--team", "cv",
                            "--as", "alice")
    assert code == 0 and approved["approved"] == "recorded"
    code, restored, _ = run(capsys, db, "template", "restore", "llm", "1", "--as", "alice")
    assert code == 0 and restored["version"] == 3 and restored["restored_from"] == 1
    code, history, _ = run(capsys, db, "template", "history", "llm")
    assert [(h["version"], h["by"]) for h in history] == [(1, history[0]["by"]), (2, "alice"),
                                                          (3, "alice")]
    # Freezes: the lead, not a member.
    code, _, err = run(capsys, db, "freeze", "set", "nlp", "--until", "2099-01-01T00:00:00Z",
                       "--reason", "release", "--as", "bob")
    assert code == 2 and "a lead of team nlp" in err
    code, freeze, _ = run(capsys, db, "freeze", "set", "nlp", "--until",
                          "2099-01-01T00:00:00Z", "--reason", "release", "--as", "alice")
    assert code == 0 and freeze["state"] == "active"
    code, _, err = run(capsys, db, "quota", "set", "--team", "nlp", "--purpose", "training",
                       "--gpus", "4", "--expires", "2098-01-01T00:00:00Z")
    assert code == 1 and "team nlp is frozen" in err and "alice: release" in err
    assert "Traceback" not in err
    assert run(capsys, db, "freeze", "lift", freeze["id"], "--as", "alice")[0] == 0
    assert run(capsys, db, "quota", "set", "--team", "nlp", "--purpose", "training",
               "--gpus", "4", "--expires", "2098-01-01T00:00:00Z")[0] == 0
    # The audit: every change, filtered.
    code, trail, _ = run(capsys, db, "audit", "--team", "nlp", "--actor", "alice")
    assert code == 0
    assert [e["kind"] for e in trail] == ["template.updated", "template.approved",
                                          "template.restored", "freeze.set", "freeze.lifted"]
    code, quota_trail, _ = run(capsys, db, "audit", "--kind", "quota")
    assert [e["kind"] for e in quota_trail] == ["quota.created"]
    assert json.loads(quota_trail[0]["after"])["gpus"] == 4


def test_bad_governance_input_is_a_clear_error(db: str, capsys: pytest.CaptureFixture[str]
                                                ) -> None:
    for argv, words in (
            (("team", "add-member", "nlp", "a b"), "user: got 'a b'"),
            (("team", "add-member", "ghost", "alice"), "a known team"),
            (("freeze", "set", "nlp", "--until", "yesterday", "--reason", "x"), "until"),
            (("freeze", "set", "nlp", "--until", "2000-01-01T00:00:00Z", "--reason", "x"),
             "a time in the future"),
            (("template", "save", "t", "--team", "nlp"), "--file FILE or --set"),
            (("template", "save", "t", "--team", "nlp", "--set", "gpus"), "FIELD=VALUE"),
            (("template", "save", "t", "--team", "nlp", "--set", "color=red"), "fields"),
            (("audit", "--kind", "request"), "kind: got 'request'"),
            (("audit", "--limit", "0"), "limit"),
            (("template", "approve", "t", "--team", "cv"), "no template named 't'"),
    ):
        code, _, err = run(capsys, db, *argv)
        assert code in (1, 2) and words in err, (argv, err)
        assert "Traceback" not in err
