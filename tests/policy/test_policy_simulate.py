"""``gpu-pool simulate ... --policy-file``: the simulator runs the engine under the same
parsed policy the store and the executor use, and the policy changes the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_pool.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
TRACE = ["--nodes", str(DATA / "openb_nodes_excerpt.csv"),
         "--pods", str(DATA / "openb_pods_excerpt.csv")]


def _json(capsys, argv: list[str]) -> dict:
    capsys.readouterr()
    assert main(["--json", "simulate", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_packing_keeps_the_policy_headroom_free(tmp_path, capsys):
    path = tmp_path / "policy.yaml"
    path.write_text("critical_headroom_gpus: 40\n")
    argv = ["packing", *TRACE, "--policy", "engine", "--seeds", "42"]
    plain = _json(capsys, argv)
    held_back = _json(capsys, [*argv, "--policy-file", str(path)])
    # 40 GPUs of the excerpt's fleet stay free for critical work the trace never sends.
    assert held_back["median_unallocated_pct"] > plain["median_unallocated_pct"] + 5
    assert held_back["seeds"][0]["placed"] < plain["seeds"][0]["placed"]


def test_replay_under_a_headroom_as_large_as_the_fleet_starts_no_ordinary_work(tmp_path,
                                                                              capsys):
    path = tmp_path / "policy.yaml"
    path.write_text("critical_headroom_gpus: 1000\n")
    argv = ["replay", *TRACE, "--policy", "engine", "--fleet-fraction", "0.2"]
    assert _json(capsys, argv)["never_started"] == 0
    assert _json(capsys, [*argv, "--policy-file", str(path)])["never_started"] > 300


@pytest.mark.parametrize(("argv", "document", "message"), [
    (["packing", "--policy", "engine", "--seeds", "42"], "solver_workers: 0\n",
     "policy.yaml: solver_workers: got 0; expected an integer from 1 to 64"),
    (["replay", "--policy", "engine"], "off_peak: {timezone: Nowhere}\n",
     "policy.yaml: off_peak.timezone: got 'Nowhere'"),
    (["packing", "--policy", "fgd", "--seeds", "42"], "{}\n",
     "expected only with --policy engine (the fgd baseline has no sharing policy)"),
])
def test_a_bad_policy_file_exits_2_before_any_simulation(tmp_path, capsys, argv, document,
                                                         message):
    path = tmp_path / "policy.yaml"
    path.write_text(document)
    capsys.readouterr()
    assert main(["simulate", argv[0], *TRACE, *argv[1:], "--policy-file", str(path)]) == 2
    err = capsys.readouterr().err
    assert message.replace("policy.yaml", str(path)) in err
    assert err.count("\n") == 1
