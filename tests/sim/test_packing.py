"""Packing benchmark: each baseline on tiny hand-made traces with known answers, the protocol's
sampling and curve, and placements files re-checked independently of the simulator."""

from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from gpu_pool.sim.baselines import make_baseline
from gpu_pool.sim.fleet import InfeasiblePlacement, SimFleet
from gpu_pool.sim.packing import run_packing, sample_arrivals, typical_mix
from gpu_pool.sim.runner import POLICIES, run_policy, write_placements
from gpu_pool.sim.trace import Trace, TraceNode, TraceTask, load_trace

DATA = Path(__file__).resolve().parents[1] / "data"


def node(name: str, gpus: int, model: str = "G2", cpu: int = 96_000, mem: int = 393_216):
    return TraceNode(name, cpu, mem, gpus, model)


def task(name: str, gpus: int = 1, milli: int = 1000, cpu: int = 1000, mem: int = 1024,
         spec: frozenset[str] = frozenset()) -> TraceTask:
    return TraceTask(name, cpu, mem, gpus, milli if gpus else 0, spec)


def place_all(policy: str, nodes, tasks, mix_tasks=None, seed: int = 0):
    fleet = SimFleet(nodes)
    placer = make_baseline(policy, fleet, np.random.default_rng(seed),
                           typical_mix(mix_tasks or tasks))
    out = []
    for t in tasks:
        choice = placer.choose(t)
        if choice is not None:
            fleet.take(t, *choice)
            placer.taken(t, *choice)
        out.append(None if choice is None else (fleet.names[choice[0]], choice[1]))
    return out, fleet


def test_firstfit_fills_nodes_in_list_order() -> None:
    got, _ = place_all("firstfit", [node("a", 2), node("b", 2)], [task("t0"), task("t1"),
                                                                  task("t2")])
    assert got == [("a", (0,)), ("a", (1,)), ("b", (0,))]


def test_bestfit_takes_the_node_left_with_least_weighted_free() -> None:
    big, small = node("big", 8), node("small", 2, cpu=32_000)
    got, _ = place_all("bestfit", [big, small], [task("t0", cpu=4000)])
    assert got == [("small", (0,))]
    # A share goes on the fitting GPU with the least free milli.
    got, _ = place_all("bestfit", [node("n", 2)],
                       [task("a", milli=700), task("b", milli=250)])
    assert got == [("n", (0,)), ("n", (0,))]


def test_fgd_fills_a_shared_card_and_keeps_a_whole_one_free() -> None:
    tasks = [task("s0", milli=500), task("s1", milli=500), task("w", milli=1000)]
    for seed in range(5):
        got, fleet = place_all("fgd", [node("n", 2)], tasks, seed=seed)
        assert got[0][1] == got[1][1]  # both halves on one card
        assert got[2] is not None and fleet.allocated_milli == 2000


def test_random_respects_model_constraints_and_skips_what_fits_nowhere() -> None:
    nodes = [node("g2", 8), node("t4", 2, "T4")]
    t4_only = task("t", spec=frozenset({"T4"}))
    for seed in range(10):
        got, _ = place_all("random", nodes, [t4_only, t4_only, t4_only], seed=seed)
        assert got[0][0] == "t4" and got[1][0] == "t4" and got[2] is None


def test_cpu_and_memory_count() -> None:
    nodes = [node("n", 8, cpu=4000, mem=8192)]
    got, _ = place_all("firstfit", nodes, [task("a", cpu=3000), task("b", cpu=3000),
                                           task("c", gpus=0, cpu=1000, mem=9000)])
    assert got == [("n", (0,)), None, None]


def test_the_fleet_refuses_an_infeasible_proposal() -> None:
    fleet = SimFleet([node("n", 1, "T4")])
    with pytest.raises(InfeasiblePlacement):
        fleet.take(task("a", spec=frozenset({"G2"})), 0, (0,))
    fleet.take(task("a", milli=600), 0, (0,))
    with pytest.raises(InfeasiblePlacement):
        fleet.take(task("b", milli=600), 0, (0,))


def tiny_trace(tasks) -> Trace:
    return Trace((node("n", 2),), tuple(tasks), "nodes", "pods")


@pytest.mark.parametrize("policy", ["random", "firstfit", "bestfit", "fgd"])
def test_protocol_on_a_tiny_trace_has_a_known_answer(policy: str) -> None:
    # 600-milli shares on 2 GPUs: the sample stops at 4 (2,400 <= 130% of 2,000 < 3,000);
    # two fit, one per card, the rest find 400 left: 60% allocated at 100% arrived.
    trace = tiny_trace([task("s", milli=600)])
    run = run_packing(trace, lambda f, rng: make_baseline(policy, f, rng, typical_mix(
        trace.tasks)), seed=42)
    assert len(run.arrivals) == 4 and run.placed == 2
    assert run.unallocated_pct == pytest.approx(40.0)
    assert run.levels[0] == pytest.approx(0.1) and len(run.levels) == 13
    assert run.allocation[0] == pytest.approx(0.3)  # first arrival passes 10%, 20% and 30%


def test_sampling_reaches_but_never_passes_130_percent() -> None:
    trace = load_trace(DATA / "openb_nodes_excerpt.csv", DATA / "openb_pods_excerpt.csv")
    capacity = trace.total_gpus * 1000
    for seed in (42, 43):
        arrivals = sample_arrivals(trace.tasks, capacity, seed)
        asked = sum(t.total_gpu_milli for t in arrivals)
        assert 1.3 * capacity - 8000 < asked <= 1.3 * capacity
    assert sample_arrivals(trace.tasks, capacity, 42) == sample_arrivals(trace.tasks, capacity, 42)
    assert sample_arrivals(trace.tasks, capacity, 42) != sample_arrivals(trace.tasks, capacity, 43)


def check_placements(path: Path, trace: Trace) -> int:
    """Re-check a placements file from scratch: capacity, models, GPU counts."""
    nodes = {n.name: n for n in trace.nodes}
    specs = {t.name: t.gpu_spec for t in trace.tasks}
    used_gpu: dict[tuple[str, str, int], int] = defaultdict(int)
    used_cpu: dict[tuple[str, str], int] = defaultdict(int)
    used_mem: dict[tuple[str, str], int] = defaultdict(int)
    placed = 0
    with path.open() as handle:
        rows = list(csv.DictReader(handle))
    for k, row in enumerate(rows):
        seed, name = row["seed"], row["node"]
        assert int(row["arrival_index"]) == k - sum(1 for r in rows[:k] if r["seed"] != seed)
        if not name:
            assert row["gpu_indices"] == ""
            continue
        placed += 1
        n = nodes[name]
        idx = [int(i) for i in row["gpu_indices"].split(";")] if row["gpu_indices"] else []
        assert len(idx) == int(row["num_gpu"]) == len(set(idx))
        assert all(0 <= i < n.gpus for i in idx)
        spec = specs[row["pod_name"]]
        if idx and spec:
            assert n.model in spec
        for i in idx:
            used_gpu[seed, name, i] += int(row["gpu_milli"])
            assert used_gpu[seed, name, i] <= 1000
        used_cpu[seed, name] += int(row["cpu_milli"])
        used_mem[seed, name] += int(row["memory_mib"])
        assert used_cpu[seed, name] <= n.cpu_milli and used_mem[seed, name] <= n.memory_mib
    return placed


@pytest.mark.parametrize("policy", POLICIES)
def test_placements_files_are_feasible(tmp_path: Path, policy: str) -> None:
    trace = load_trace(DATA / "openb_nodes_excerpt.csv", DATA / "openb_pods_gpuspec_excerpt.csv")
    runs = run_policy(trace, policy, [42, 43])
    out = tmp_path / "placements.csv"
    write_placements(out, runs)
    assert check_placements(out, trace) == sum(r.placed for r in runs)
    assert all(0 <= r.unallocated_pct < 60 for r in runs)


def test_engine_online_and_batched_on_the_excerpt() -> None:
    trace = load_trace(DATA / "openb_nodes_excerpt.csv", DATA / "openb_pods_excerpt.csv")
    online = run_policy(trace, "engine", [42])[0]
    batched = run_policy(trace, "engine", [42], batch=50)[0]
    rand = run_policy(trace, "random", [42])[0]
    assert online.unallocated_pct < rand.unallocated_pct
    assert batched.unallocated_pct < rand.unallocated_pct
    assert len(batched.decision_seconds) == -(-len(batched.arrivals) // 50)
