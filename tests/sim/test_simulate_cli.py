"""``gpu-pool simulate``: output, JSON curve, placements file, and bad input -> exit 2."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpu_pool.cli import main

DATA = Path(__file__).resolve().parents[1] / "data"
NODES = str(DATA / "openb_nodes_excerpt.csv")
PODS = str(DATA / "openb_pods_excerpt.csv")


def test_packing_prints_each_seed_and_the_median(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "packing", "--nodes", NODES, "--pods", PODS, "--policy", "bestfit",
                 "--seeds", "42-44"]) == 0
    out = capsys.readouterr().out
    assert "bestfit: median unallocated GPU % =" in out
    assert sum(1 for line in out.splitlines() if line.strip().startswith(("42", "43", "44"))) == 3
    assert "time per placement decision: median" in out


def test_packing_json_and_placements(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    placements = tmp_path / "out.csv"
    assert main(["simulate", "packing", "--nodes", NODES, "--pods", PODS, "--policy", "fgd",
                 "--seeds", "42", "--json", "--placements", str(placements)]) == 0
    summary = json.loads(capsys.readouterr().out)
    (seed,) = summary["seeds"]
    assert [p["arrived_pct"] for p in seed["curve"]][:3] == [10.0, 20.0, 30.0]
    assert len(seed["curve"]) == 13
    unallocated = 100 - next(p["allocated_pct"] for p in seed["curve"] if p["arrived_pct"] == 100)
    assert seed["unallocated_pct"] == pytest.approx(unallocated)
    with placements.open() as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["seed", "arrival_index", "pod_name", "num_gpu", "gpu_milli",
                             "cpu_milli", "memory_mib", "gpu_spec", "node", "gpu_indices"]
    assert len(rows) == seed["arrived"]
    assert sum(1 for r in rows if r["node"]) == seed["placed"]


def test_packing_bound_is_below_each_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "packing", "--nodes", NODES, "--pods", PODS, "--policy", "bestfit",
                 "--seeds", "42-43", "--bound", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for seed in summary["seeds"]:
        # The excerpt's shares leave slivers no placement fills: the bound is above zero.
        assert 0 < seed["bound_unallocated_pct"] <= seed["unallocated_pct"]
    assert summary["median_bound_unallocated_pct"] == pytest.approx(
        (summary["seeds"][0]["bound_unallocated_pct"]
         + summary["seeds"][1]["bound_unallocated_pct"]) / 2)
    assert main(["simulate", "packing", "--nodes", NODES, "--pods", PODS, "--policy", "bestfit",
                 "--seeds", "42", "--bound"]) == 0
    out = capsys.readouterr().out
    assert "bound (no placement of these arrivals leaves less): median" in out
    assert "above" in out.splitlines()[0]


def test_replay_prints_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "replay", "--nodes", NODES, "--pods", PODS, "--policy", "fifo",
                 "--fleet-fraction", "0.2"]) == 0
    out = capsys.readouterr().out
    assert "GPU allocation %: mean" in out and "solve time per cycle" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["packing", "--policy", "bestest", "--seeds", "42"], "policy: got 'bestest'"),
        (["packing", "--policy", "fgd", "--seeds", "x-y"], "seeds: got 'x-y'"),
        (["packing", "--policy", "engine", "--seeds", "42", "--batch", "0"], "batch: got '0'; expected an integer from 1 to 100,000"),
        (["replay", "--policy", "random"], "policy: got 'random'"),
        (["replay", "--policy", "fifo", "--fleet-fraction", "2"], "fleet-fraction: got '2'; expected a number greater than 0 and at most 1"),
        (["replay", "--policy", "engine", "--reserve-after", "-5"], "reserve-after: got '-5'; expected a number at least 0"),
        (["replay", "--policy", "engine", "--max-reservations", "-1"],
         "max-reservations: got '-1'; expected an integer from 0 to 10,000"),
        (["replay", "--policy", "engine", "--time-limit-factor", "0.5,2"],
         "time-limit-factor: got '0.5,2'; expected two factors with 1 <= LO <= HI"),
        (["replay", "--policy", "engine", "--time-limit-factor", "2"],
         "time-limit-factor: got '2'; expected 'none' or two factors LO,HI like 1,4"),
        (["replay", "--policy", "engine", "--time-limit-factor", "1,x"],
         "time-limit-factor: got 'x'"),
    ],
)
def test_bad_arguments_exit_2(argv: list[str], message: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    command = ["simulate", argv[0], "--nodes", NODES, "--pods", PODS, *argv[1:]]
    assert main(command) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_bad_row_names_file_line_and_column(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    pods = tmp_path / "pods.csv"
    lines = (DATA / "openb_pods_excerpt.csv").read_text().splitlines()
    fields = lines[5].split(",")
    fields[3] = "two"
    lines[5] = ",".join(fields)
    pods.write_text("\n".join(lines) + "\n")
    assert main(["simulate", "packing", "--nodes", NODES, "--pods", str(pods), "--policy",
                 "random", "--seeds", "42"]) == 2
    assert f"{pods}:6:4: num_gpu: got 'two'" in capsys.readouterr().err
