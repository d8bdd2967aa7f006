"""Workload mixes (gpu_pool.sim.mixes, ``gpu-pool simulate mix``): the fraction asked for is
reached by the smallest change, from the trace's own sizes and models, deterministically;
bad input is refused with nothing written."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from gpu_pool.cli import main
from gpu_pool.errors import SpecError
from gpu_pool.sim import mixes
from gpu_pool.sim.trace import load_nodes, load_tasks

DATA = Path(__file__).resolve().parents[1] / "data"
NODES = DATA / "openb_nodes_excerpt.csv"
PODS = DATA / "openb_pods_excerpt.csv"
SPEC_PODS = DATA / "openb_pods_gpuspec_excerpt.csv"


@pytest.mark.parametrize("fraction", [0.5, 0.8, 1.0])
def test_shares_reach_the_fraction_with_copies_of_the_traces_own_share_tasks(
        fraction: float) -> None:
    tasks = load_tasks(PODS)
    before = mixes.share_fraction(tasks)
    assert before < 0.5
    out = mixes.with_shares(tasks, fraction, seed=7)
    assert mixes.share_fraction(out) >= fraction - 1e-12
    share_rows = {replace(t, name="") for t in tasks if t.num_gpu == 1 and t.gpu_milli < 1000}
    changed = [(a, b) for a, b in zip(tasks, out, strict=True) if a != b]
    assert changed
    for a, b in changed:
        # A whole-GPU task gave way to a whole copy of a share task (CPU, memory and times
        # come with the share, as in the published gpushare40); only the name stays.
        assert a.num_gpu >= 1 and a.gpu_milli == 1000
        assert b.name == a.name and replace(b, name="") in share_rows
    # CPU-only tasks and the trace's own share tasks are never touched.
    assert all(a == b for a, b in zip(tasks, out, strict=True)
               if a.num_gpu == 0 or a.gpu_milli < 1000)
    # The smallest change: it stops at the first replacement that reaches the fraction
    # (one task of about 400 moves it by well under a point).
    assert mixes.share_fraction(out) - fraction < 0.01
    if fraction == 1:
        assert all(t.num_gpu == 1 and t.gpu_milli < 1000 for t in out if t.num_gpu)


def test_shares_replace_singles_and_multi_gpu_tasks_alike() -> None:
    # The published gpushare40 replaced 23 % of default's single-GPU and 17 % of its
    # multi-GPU tasks: both kinds give way at random, not singles first.
    # (The old rule, singles first, never replaced a multi-GPU task below 100 %.)
    tasks = load_tasks(PODS)
    replaced = [a for seed in range(10)
                for a, b in zip(tasks, mixes.with_shares(tasks, 0.6, seed), strict=True) if a != b]
    assert any(a.num_gpu == 1 for a in replaced) and any(a.num_gpu > 1 for a in replaced)


def test_same_seed_same_mix_other_seed_other_tasks() -> None:
    tasks = load_tasks(PODS)
    assert mixes.with_shares(tasks, 0.6, 1) == mixes.with_shares(tasks, 0.6, 1)
    assert mixes.with_shares(tasks, 0.6, 1) != mixes.with_shares(tasks, 0.6, 2)
    spec = load_tasks(SPEC_PODS)
    assert mixes.with_models(spec, 0.4, 3) == mixes.with_models(spec, 0.4, 3)


def test_models_drawn_from_the_trace_per_gpu_count_and_only_where_a_node_holds_them() -> None:
    tasks, nodes = load_tasks(SPEC_PODS), load_nodes(NODES)
    before = mixes.model_fraction(tasks)
    out = mixes.with_models(tasks, 0.5, seed=11, nodes=nodes)
    assert before < 0.5 <= mixes.model_fraction(out)
    seen = {(t.num_gpu, t.gpu_spec) for t in tasks if t.gpu_spec}
    for a, b in zip(tasks, out, strict=True):
        if a == b:
            continue
        assert not a.gpu_spec and b.gpu_spec
        assert replace(b, gpu_spec=frozenset()) == a
        # a spec tasks of this GPU count name in the trace (all of them, where none does)
        counts = {n for n, _ in seen}
        assert (b.num_gpu, b.gpu_spec) in seen or b.num_gpu not in counts
        assert any(n.model in b.gpu_spec and n.gpus >= b.num_gpu and n.cpu_milli >= b.cpu_milli
                   and n.memory_mib >= b.memory_mib for n in nodes)


def test_a_fraction_below_the_traces_own_or_nothing_to_draw_from_is_refused() -> None:
    tasks = load_tasks(PODS)
    with pytest.raises(SpecError) as err:
        mixes.with_shares(tasks, 0.01, 1)
    assert err.value.field == "share-fraction" and "never takes away" in str(err.value)
    with pytest.raises(SpecError) as err:
        mixes.with_models(tasks, 0.2, 1)  # the default excerpt names no model
    assert err.value.field == "pods" and "gpu_spec" in str(err.value)
    whole = tuple(replace(t, gpu_milli=1000) for t in tasks if t.num_gpu == 1)
    with pytest.raises(SpecError) as err:
        mixes.with_shares(whole, 0.5, 1)
    assert "gpu_milli < 1000" in str(err.value)


def test_cli_writes_a_task_list_the_simulator_reads(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mix.csv"
    assert main(["simulate", "mix", "--nodes", str(NODES), "--pods", str(SPEC_PODS),
                 "--share-fraction", "0.6", "--model-fraction", "0.3", "--seed", "5",
                 "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    written = load_tasks(out)
    assert len(written) == summary["tasks"] == 200
    assert summary["share_fraction"] == pytest.approx(mixes.share_fraction(written))
    assert summary["model_fraction"] == pytest.approx(mixes.model_fraction(written))
    assert summary["share_fraction"] >= 0.6 and summary["model_fraction"] >= 0.3
    expected = mixes.with_models(mixes.with_shares(load_tasks(SPEC_PODS), 0.6, 5), 0.3, 5,
                                 load_nodes(NODES))
    assert written == expected
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    assert main(["simulate", "packing", "--nodes", str(NODES), "--pods", str(out),
                 "--policy", "bestfit", "--seeds", "42"]) == 0


@pytest.mark.parametrize("argv, field", [
    (["--share-fraction", "1.5"], "share-fraction"),
    (["--share-fraction", "0.01"], "share-fraction"),
    (["--model-fraction", "x"], "model-fraction"),
    ([], "share-fraction"),
    (["--share-fraction", "0.6", "--seed", "-1"], "seed"),
])
def test_cli_bad_input_exits_2_and_leaves_the_old_file(tmp_path: Path, argv: list[str],
                                                       field: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mix.csv"
    out.write_text("earlier\n")
    assert main(["simulate", "mix", "--nodes", str(NODES), "--pods", str(SPEC_PODS),
                 "--out", str(out), *argv]) == 2
    assert f"{field}:" in capsys.readouterr().err
    assert out.read_text() == "earlier\n"
