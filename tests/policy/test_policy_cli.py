"""``gpu-pool policy``: exit codes, one-line refusals that leave the store untouched, and
the policy the other commands then use."""

from __future__ import annotations

import json

import pytest

from gpu_pool.cli import main
from gpu_pool.store import Store

GOOD = """# lend at night, keep two H100s for critical work
headroom:
  - {gpus: 2, gpu_model: H100}
off_peak:
  timezone: Europe/Berlin
  windows: [{start: "20:00", end: "08:00", days: [mon-fri]}]
preemption_grace: 90s
"""


@pytest.fixture
def db(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["--db", url, "db", "migrate"]) == 0
    return url


def run(capsys, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_set_show_history_diff_restore(db, tmp_path, capsys):
    path = tmp_path / "policy.yaml"
    path.write_text(GOOD)
    code, out, _ = run(capsys, "--db", db, "policy", "check", str(path))
    assert code == 0 and "headroom,off_peak,preemption_grace" in out
    assert Store.from_url(db).policy_version() == 0  # check writes nothing

    code, out, _ = run(capsys, "--db", db, "policy", "set", str(path), "--actor", "alice",
                       "--comment", "nightly lending")
    assert code == 0 and "v1" in out
    code, out, _ = run(capsys, "--db", db, "policy", "set", "borrowing=false",
                       "off_peak.timezone=UTC", "--actor", "bob")
    assert code == 0 and "borrowing,off_peak" in out

    code, out, _ = run(capsys, "--db", db, "--json", "policy", "show")
    shown = json.loads(out)
    assert (shown["version"], shown["set_by"]) == (2, "bob")
    values = {v["key"]: v for v in shown["values"]}
    assert values["preemption_grace"]["value"] == "90s"
    assert values["preemption_grace"]["source"].startswith("v1 by alice at ")
    assert values["borrowing"]["source"].startswith("v2 by bob at ")
    assert values["off_peak"]["value"]["timezone"] == "UTC"
    assert values["reserve_after"]["source"] == "default"
    code, out, _ = run(capsys, "--db", db, "policy", "show")
    assert code == 0 and out.startswith("policy v2 by bob at ")

    code, out, _ = run(capsys, "--db", db, "--json", "policy", "history")
    rows = json.loads(out)
    assert [(r["version"], r["by"], r["comment"]) for r in rows] == [
        (1, "alice", "nightly lending"), (2, "bob", None)]
    assert rows[0]["lines"] == "+7 -0"

    code, out, _ = run(capsys, "--db", db, "policy", "diff", "v1", "2")
    assert code == 0 and out.startswith("--- v1\n+++ v2\n") and "+borrowing: false" in out

    code, out, _ = run(capsys, "--db", db, "policy", "restore", "1", "--actor", "carol")
    assert code == 0 and "v3" in out
    assert Store.from_url(db).policy_document(3) == GOOD


BAD = [
    (["policy", "set", "borrowing=maybe"], "borrowing: got 'maybe'; expected true or false"),
    (["policy", "set", "headroom=[{gpus: 2, gpu_model: Z80}]"],
     "headroom[0].gpu_model: got 'Z80'; expected a GPU model of gpu_models"),
    (["policy", "set", "colour=blue"], "colour: got 'blue'; expected one of the policy keys"),
    (["policy", "set", "off_peak.timezone=Mars/Base"], "off_peak.timezone: got 'Mars/Base'"),
    (["policy", "set", "preemption_grace=90s"], "expected a document that changes the "
     "policy in force (v1 says the same)"),
    (["policy", "set", "missing.yaml"], "file: got 'missing.yaml'; expected an existing"),
    (["policy", "restore", "7"], "version: got 'v7'; expected a version that was set (v1)"),
    (["policy", "restore", "0"], "version: got '0'; expected a version that was set"),
    (["policy", "diff", "1", "two"], "b: got 'two'; expected a policy version like 3"),
    (["policy", "set", "borrowing=false", "--comment", ""], "comment: got ''"),
]


@pytest.mark.parametrize(("argv", "message"), BAD)
def test_bad_input_is_one_line_exit_2_and_the_store_is_untouched(db, capsys, argv, message):
    store = Store.from_url(db)
    store.set_policy("preemption_grace: 90s\n", "alice")
    events = len(store.events())
    code, out, err = run(capsys, "--db", db, *argv)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("gpu-pool: error: ")
    assert message in err, err
    assert "Traceback" not in err
    assert store.policy_version() == 1 and store.policy_document(1) == "preemption_grace: 90s\n"
    assert len(store.events()) == events


def test_a_bad_policy_file_is_refused_by_check_and_set(db, tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("off_peak:\n  windows:\n    - {start: '20:00', end: '08:00'}\n"
                    "    - {start: '22:00', end: '07:30'}\n")
    for command in ("check", "set"):
        code, _, err = run(capsys, "--db", db, "policy", command, str(path))
        assert code == 2
        assert err == (f"gpu-pool: error: {path}: off_peak.windows[1].end: got '07:30'; "
                       "expected a whole hour of the day like '20:00' or '08:00' (00:00 to "
                       "23:00; quote it in YAML)\n")
    assert Store.from_url(db).policy_history() == []


def test_other_commands_use_the_store_policy(db, tmp_path, capsys):
    """A GPU model the policy adds is known to `nodes import` at once."""
    nodes = tmp_path / "nodes.yaml"
    nodes.write_text("nodes:\n  - {name: b1, gpu_model: B200, gpus: 8, cpu: 64, "
                     "memory: 1TiB}\n")
    code, _, err = run(capsys, "--db", db, "nodes", "import", str(nodes))
    assert code == 2 and "B200" in err
    code, _, _ = run(capsys, "--db", db, "policy", "set",
                     "gpu_models=[{name: B200, memory_gib: 192, price_per_gpu_hour: 6}]")
    assert code == 0
    code, out, err = run(capsys, "--db", db, "nodes", "import", str(nodes))
    assert code == 0, err
    assert Store.from_url(db).list_nodes()[0].gpus[0].memory_mib == 192 * 1024
