"""Bad input through the CLI: exit status 2, one line naming the field, value and fix.

Each row is (what is wrong, argv after the global options, text the message must show).
Runs on a fresh SQLite store seeded with one team and one node, so "never fits" and
"unknown team" are judged against a real fleet.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gpu_pool.cli import main

FLEET = """
nodes:
  - {name: n1, zone: z1, gpu_model: A100, gpus: 8, cpu: 64, memory: 512GiB}
  - {name: n2, zone: z2, gpu_model: T4, gpus: 4, cpu: 32, memory: 128GiB}
"""

BAD_INPUTS = [
    ("zero GPUs", ["submit", "--name", "r", "--team", "nlp", "--gpus", "0"],
     "gpus: got '0'; expected a whole number of GPUs, at least 1"),
    ("negative GPUs", ["submit", "--name", "r", "--team", "nlp", "--gpus", "-2"],
     "gpus: got '-2'; expected a whole number of GPUs, at least 1"),
    ("non-integer GPUs", ["submit", "--name", "r", "--team", "nlp", "--gpus", "1.5"],
     "gpus: got '1.5'; expected a whole number of GPUs"),
    ("more GPUs than any node", ["submit", "--name", "r", "--team", "nlp", "--gpus", "12"],
     "gpus: got 12; expected at most 8 per node (the largest node, 'n1', has 8 GPUs)"),
    ("gang wider than the fleet", ["submit", "--name", "r", "--team", "nlp", "--nodes", "3",
                                   "--gpus-per-node", "4"],
     "nodes: got 3; expected at most 2"),
    ("share of 1000", ["submit", "--name", "r", "--team", "nlp", "--share", "1000"],
     "gpu_share: got '1000'; expected an integer number of thousandths of one GPU, from 1 to 999"),
    ("share of 0", ["submit", "--name", "r", "--team", "nlp", "--share", "0"],
     "gpu_share: got '0'; expected an integer number of thousandths"),
    ("unknown GPU model", ["submit", "--name", "r", "--team", "nlp", "--models", "B200"],
     "gpu_models: got 'B200'; expected a known GPU model: T4"),
    ("malformed memory size", ["submit", "--name", "r", "--team", "nlp", "--min-gpu-memory",
                               "lots"],
     "min_gpu_memory: got 'lots'; expected a size like '16GiB'"),
    ("unknown team", ["submit", "--name", "r", "--team", "nope"],
     "team: got 'nope'; expected a known team: nlp"),
    ("unknown purpose", ["submit", "--name", "r", "--team", "nlp", "--purpose", "gaming"],
     "purpose: got 'gaming'; expected one of training, inference, pretraining"),
    ("unknown priority", ["submit", "--name", "r", "--team", "nlp", "--priority", "urgent"],
     "priority: got 'urgent'; expected one of critical, high, normal, low, batch"),
    ("time limit zero", ["submit", "--name", "r", "--team", "nlp", "--time-limit", "0"],
     "time_limit: got '0'; expected a positive duration"),
    ("time limit negative", ["submit", "--name", "r", "--team", "nlp", "--time-limit=-1h"],
     "time_limit: got '-1h'; expected a positive duration"),
    ("quota expiring before it starts", ["quota", "set", "--team", "nlp", "--purpose",
                                         "training", "--gpus", "4", "--from", "2027-01-10",
                                         "--expires", "2027-01-01"],
     "expires_at: got '2027-01-01'; expected a time after valid_from"),
    ("quota with a bad date", ["quota", "set", "--team", "nlp", "--purpose", "training",
                               "--gpus", "4", "--expires", "next tuesday"],
     "expires_at: got 'next tuesday'; expected an ISO 8601 time"),
    ("quota with negative GPUs", ["quota", "set", "--team", "nlp", "--purpose", "training",
                                  "--gpus", "-4", "--expires", "2027-01-01"],
     "gpus: got '-4'; expected a whole number of GPUs from 0 to 1,000,000"),
    ("bad request name", ["submit", "--name", "has space", "--team", "nlp"],
     "name: got 'has space'; expected 1-250 characters"),
    ("bad outcome", ["release", "r", "--outcome", "meh"],
     "outcome: got 'meh'; expected one of success, failed"),
]

BAD_NODE_FILES = [
    ("duplicate node name", "nodes:\n  - {name: a, gpu_model: T4, gpus: 1}\n"
                            "  - {name: a, gpu_model: T4, gpus: 1}\n",
     "node #2: name: got 'a'; expected a name not used by another node"),
    ("negative GPU count", "nodes:\n  - {name: a, gpu_model: T4, gpus: -1}\n",
     "node #1: gpus: got -1; expected a GPU count from 0 to 64"),
    ("negative CPU", "nodes:\n  - {name: a, gpu_model: T4, gpus: 1, cpu: -8}\n",
     "node #1: cpu: got -8; expected cores as a number (e.g. 8 or 0.5) up to 100,000"),
    ("unknown node model", "nodes:\n  - {name: a, gpu_model: K80, gpus: 2}\n",
     "node #1: gpu_model: got 'K80'; expected a known GPU model"),
    ("typo in a field", "nodes:\n  - {name: a, gpu_model: T4, gpuz: 2}\n",
     "node #1: gpuz: got 2; expected one of the fields name, gpu_model, gpus"),
    ("not YAML", "nodes: [ {name: a\n", "expected valid YAML"),
]


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    assert main(["--db", url, "db", "migrate"]) == 0
    assert main(["--db", url, "team", "add", "nlp"]) == 0
    assert main(["--db", url, "nodes", "import", str(fleet)]) == 0
    return url


@pytest.mark.parametrize(("case", "argv", "message"), BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_exits_2_with_a_clear_message(db: str, capsys: pytest.CaptureFixture[str],
                                                case: str, argv: list[str], message: str) -> None:
    capsys.readouterr()
    assert main(["--db", db, *argv]) == 2, case
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert err.count("\n") == 1, "one line, no traceback"


@pytest.mark.parametrize(("case", "text", "message"), BAD_NODE_FILES,
                         ids=[c[0] for c in BAD_NODE_FILES])
def test_bad_node_file_exits_2_and_stores_nothing(db: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  case: str, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    capsys.readouterr()
    assert main(["--db", db, "nodes", "import", str(path)]) == 2, case
    err = capsys.readouterr().err
    assert message in err, err
    assert "Traceback" not in err
    assert main(["--db", db, "--json", "nodes", "list"]) == 0
    listed = capsys.readouterr().out
    assert '"n1"' in listed and '"a"' not in listed, "nothing already stored is lost or added"


def test_duplicate_node_already_stored_is_refused(db: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "again.yaml"
    path.write_text("nodes:\n  - {name: n1, gpu_model: T4, gpus: 1}\n")
    capsys.readouterr()
    assert main(["--db", db, "nodes", "import", str(path)]) == 2
    assert "n1" in capsys.readouterr().err


def test_usage_error_exits_2_in_one_line(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["--db", db, "submit", "--gpus"]) == 2
    assert capsys.readouterr().err == ("gpu-pool submit: error: argument --gpus: expected one "
                                       "argument (see gpu-pool submit --help)\n")


def test_every_help_text_renders(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse %-formats help strings: a bare % crashed `gpu-pool simulate --help`."""
    from gpu_pool.cli import build_parser

    def commands(parser, prefix):  # noqa: ANN001, ANN202
        yield prefix
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from commands(sub, [*prefix, name])

    found = list(commands(build_parser(), []))
    assert ["simulate", "packing"] in found and len(found) > 20
    for argv in found:
        assert main([*argv, "--help"]) == 0, argv
        assert "usage: gpu-pool" in capsys.readouterr().out


def test_unreachable_store_exits_1_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["--db", "postgresql://nobody@127.0.0.1:1/none", "nodes", "list"])
    err = capsys.readouterr().err
    assert code == 1
    assert "Traceback" not in err and err.startswith("gpu-pool: error:")
