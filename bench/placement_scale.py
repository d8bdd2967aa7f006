"""One placement cycle of the engine on synthetic fleets, from 100 x 50 to 20,000 x 10,000.

Run: ``.venv/bin/python bench/placement_scale.py [--sizes 100x50,1000x500] [--seed 7]
[--seeds 1-20] [--time-limits]``.

``--time-limits``: the running work and the queue declare time limits (reservations get
expected starts, the start estimates have ends to walk, with the run / limit ratios of 500
finished tasks as the store's ledger gives them); each row is followed by the number of
start estimates and the plan's wall time with ``start_estimates=0``, on the same snapshot:
what the estimates cost.

Each fleet mixes five GPU models (A100, H100, L40S, T4, V100) over three zones, with 1/2/4/8
GPUs per node, about a third of its GPUs already held by active allocations (whole and
shared); each queue is drawn from 60 job templates (a team's pipeline: one shape, model set
and dataset) mixing whole-GPU requests of 1/2/4/8, shares of 250/500 milli and 2- and
4-node gangs, with five priority classes, aged submission times, model constraints,
datasets in every zone and a few not ready, and any-model quotas for four teams. The table
shows, per size: wall time of ``plan`` (state from the snapshot, greedy, the class model's
LP and, when it pays, its rounding and CP-SAT, reasons), the greedy-alone wall time
(``greedy_plan``), the plan's objective, the greedy objective, the upper bound (the class
model's LP optimum, or CP-SAT's bound when lower: of a relaxation, hence of the problem) and
the plan's gap to it, and the machine it ran on. The queue has waited up to 12 hours, so
the starvation guard places its most urgent request first: objective and bound are of the
cycle that leaves.

``--seeds A-B`` adds, per size, the spread of ``plan`` over those seeds' queues and fleets
(median and worst wall time, worst gap, how many kept greedy's plan, how many ended below
it: must be none). The machine line carries a reference figure, the time of a plain
5,000,000-step Python loop, at the start and the end: this shared 2-core machine's speed varies
from day to day (a plain loop took 1.7-2.2 times as long on 2026-12-02 as on 2026-12-03),
and wall times scale with that figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugins"))

import ortools  # noqa: E402

from gpu_pool.engine import greedy_plan, plan  # noqa: E402
from gpu_pool.engine.types import Snapshot  # noqa: E402
from gpu_pool.errors import SpecError  # noqa: E402
from gpu_pool.model import (  # noqa: E402
    Allocation,
    Dataset,
    Gpu,
    Node,
    Policy,
    PriorityClass,
    Purpose,
    Quota,
    Request,
)
from gpu_pool.sim.runner import parse_seeds  # noqa: E402

NOW = datetime(2026, 12, 1, 14, 0, tzinfo=UTC)  # peak hours: no off-peak lending
MODELS = {"A100": 80, "H100": 80, "L40S": 48, "T4": 16, "V100": 32}
ZONES = ("eu-1", "eu-2", "us-1")
TEAMS = ("vision", "speech", "llm", "recsys")
SIZES = ((100, 50), (1000, 500), (5000, 2000), (20000, 10000))
TEMPLATES = 60


def synthetic_snapshot(pending: int, nodes: int, seed: int, limits: bool = False) -> Snapshot:
    """The fleet and queue of ``seed``; ``limits``: the running work ends by a time limit
    0.5-24 h from now and each request declares one of 1-48 h (drawn from a second
    generator, so the fleet and queue are those without limits)."""
    rng = random.Random(seed)
    lim = random.Random(seed + 1_000_003)
    fleet: list[Node] = []
    for i in range(nodes):
        model = rng.choice(list(MODELS))
        count = rng.choices((1, 2, 4, 8), (1, 2, 3, 6))[0]
        mem = MODELS[model] * 1024
        fleet.append(Node(f"n{i:05d}", tuple(Gpu(j, model, mem) for j in range(count)),
                          cpu_milli=count * 16_000, memory_mib=count * 128 * 1024,
                          zone=rng.choice(ZONES), bandwidth_mb_s=rng.choice((500.0, 1000.0))))
    allocations: list[Allocation] = []
    for node in fleet:
        busy = rng.randint(0, node.gpu_count // 2)
        for j in range(busy):
            share = rng.random() < 0.2
            allocations.append(Allocation(
                f"run-{node.name}-{j}", node.name, (j,), 500 if share else 1000, 8000,
                64 * 1024, rng.choice(TEAMS), Purpose.TRAINING, PriorityClass.NORMAL,
                node.gpu_model, NOW - timedelta(hours=3),
                ends_by=NOW + timedelta(hours=lim.uniform(0.5, 24)) if limits else None))
    # A queue comes from pipelines: each template is one (team, job) that submits many
    # requests of one shape, model set and dataset; priority, age and readiness vary.
    templates = []
    for _ in range(TEMPLATES):
        kind = rng.choices(("1", "2", "4", "8", "share", "gang"), (30, 15, 10, 10, 25, 5))[0]
        gpus, milli, parts = {"1": (1, 1000, 1), "2": (2, 1000, 1), "4": (4, 1000, 1),
                              "8": (8, 1000, 1), "share": (1, rng.choice((250, 500)), 1),
                              "gang": (rng.choice((4, 8)), 1000, rng.choice((2, 4)))}[kind]
        models = frozenset() if rng.random() < 0.5 else frozenset(
            rng.sample(list(MODELS), rng.choice((1, 2))))
        zone = rng.choice((None, *ZONES))
        size = rng.choice((10.0, 200.0, 4000.0))
        purpose = Purpose.TRAINING if rng.random() < 0.8 else Purpose.INFERENCE
        templates.append((gpus, milli, parts, models, zone, size, rng.choice(TEAMS), purpose))
    requests: list[Request] = []
    classes = list(PriorityClass)
    for i in range(pending):
        gpus, milli, parts, models, zone, size, team, purpose = rng.choice(templates)
        ds = None if zone is None else Dataset(f"s3://d/{i}", zone, size)
        requests.append(Request(
            f"r{i:05d}", team, purpose, rng.choices(classes, (3, 10, 50, 20, 17))[0],
            gpus=gpus, gpu_milli=milli, nodes=parts, gpu_models=models,
            cpu_milli=gpus * 4000, memory_mib=gpus * 32 * 1024, dataset=ds,
            data_ready=rng.random() > 0.03,
            submitted_at=NOW - timedelta(minutes=rng.randint(0, 720)),
            time_limit=timedelta(hours=lim.uniform(1, 48)) if limits else None))
    total_gpus = sum(n.gpu_count for n in fleet)
    quotas = tuple(Quota(t, p, round(total_gpus * share), NOW - timedelta(days=1),
                         NOW + timedelta(days=30), borrow_limit_gpus=round(total_gpus * 0.05))
                   for t in TEAMS for p, share in ((Purpose.TRAINING, 0.2),
                                                   (Purpose.INFERENCE, 0.04)))
    # With limits, what the store's ledger gives the start estimates: the run / limit ratios
    # of the last 500 finished tasks (users over-ask: limits 1-4 times the run).
    ratios = tuple(1 / lim.uniform(1, 4) for _ in range(500)) if limits else ()
    return Snapshot(tuple(fleet), tuple(allocations), tuple(requests), quotas, Policy(), NOW,
                    runtime_ratios=ratios)


def reference_loop() -> float:
    """Seconds of a plain 5,000,000-step Python loop: the machine's speed right now."""
    t = time.perf_counter()
    total = 0
    for i in range(5_000_000):
        total += i
    return time.perf_counter() - t


def seed_range(text: str) -> list[int]:
    """``--seeds``: as the simulator reads seeds (``1-20``, ``1,5,9``)."""
    try:
        return list(parse_seeds(text))
    except SpecError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def spread(pending: int, nodes: int, seeds: list[int]) -> tuple[str, bool]:
    """One line: ``plan`` over the queues and fleets of ``seeds``; and whether any plan
    ended below its greedy plan."""
    walls: list[tuple[float, int]] = []
    gaps: list[float] = []
    kept = below = 0
    for seed in seeds:
        snap = synthetic_snapshot(pending, nodes, seed)
        t = time.perf_counter()
        st = plan(snap).stats
        walls.append((time.perf_counter() - t, seed))
        if st.upper_bound:
            gaps.append(100 * (st.upper_bound - st.objective) / st.upper_bound)
        kept += st.status.value == "greedy"
        below += st.objective < st.greedy_objective
    median = statistics.median(w for w, _ in walls)
    worst, worst_seed = max(walls)
    gap = f"{max(gaps):.3f}" if gaps else "-"
    return (f"{pending:>7} x {nodes:<6} {len(seeds):>5} {median:>11.3f} {worst:>9.3f} "
            f"({worst_seed:>3}) {gap:>9} {kept:>11} {below:>12}"), below > 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default=",".join(f"{p}x{n}" for p, n in SIZES))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--seeds", type=seed_range, default=None,
                        help="also the spread over these seeds, e.g. 1-20")
    parser.add_argument("--time-limits", action="store_true",
                        help="running work and requests declare time limits; each row is "
                             "followed by the plan's time without start estimates")
    args = parser.parse_args(argv)
    sizes = [tuple(int(v) for v in s.split("x")) for s in args.sizes.split(",")]
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, OR-Tools {ortools.__version__}, load average "
          f"{os.getloadavg()[0]:.1f} at start (shared machine: wall times scale with it); "
          f"reference loop {reference_loop():.3f} s")
    print(f"policy: solver_time_limit_s={Policy().solver_time_limit_s}, "
          f"workers={Policy().solver_workers}, seed={Policy().solver_seed}")
    head = (f"{'pending x nodes':>16} {'wall s':>7} {'greedy s':>8} {'status':>8} "
            f"{'objective':>16} {'greedy obj':>16} {'upper bound':>16} {'gap %':>6} "
            f"{'placed':>7} {'greedy placed':>13}")
    print(head)
    print("-" * len(head))
    for pending, nodes in sizes:
        snap = synthetic_snapshot(pending, nodes, args.seed, args.time_limits)
        t = time.perf_counter()
        base = greedy_plan(snap)
        greedy_s = time.perf_counter() - t
        t = time.perf_counter()
        result = plan(snap)
        wall = time.perf_counter() - t
        st = result.stats
        ub = st.upper_bound
        gap = f"{100 * (ub - st.objective) / ub:.3f}" if ub else "-"
        detail = f"  [{st.detail}; load {os.getloadavg()[0]:.1f}]"
        print(f"{pending:>7} x {nodes:<6} {wall:>7.3f} {greedy_s:>8.3f} {st.status.value:>8} "
              f"{st.objective:>16.0f} {st.greedy_objective:>16.0f} "
              f"{ub if ub is not None else float('nan'):>16.0f} {gap:>6} "
              f"{len(result.placements):>7} {len(base.placements):>13}{detail}")
        if args.time_limits:
            bare = dataclasses.replace(snap, policy=dataclasses.replace(snap.policy,
                                                                        start_estimates=0))
            t = time.perf_counter()
            plan(bare)
            print(f"{'':>16} start estimates: {len(result.estimates)} of "
                  f"{len(result.pending)} waiting; plan without them {time.perf_counter() - t:.3f} s")
        if st.objective < st.greedy_objective:
            print("  ERROR: plan below greedy", file=sys.stderr)
            return 1
    if args.seeds:
        head = (f"{'pending x nodes':>16} {'seeds':>5} {'median s':>11} {'worst s':>9} "
                f"{'(seed)':>5} {'max gap %':>9} {'kept greedy':>11} {'below greedy':>12}")
        seeds = args.seeds
        named = (f"{seeds[0]}-{seeds[-1]}" if seeds == list(range(seeds[0], seeds[-1] + 1))
                 else ",".join(map(str, seeds)))
        print(f"\nspread of plan over seeds {named}:")
        print(head)
        print("-" * len(head))
        failed = False
        for pending, nodes in sizes:
            line, bad = spread(pending, nodes, args.seeds)
            print(line, flush=True)
            failed = failed or bad
        if failed:
            print("  ERROR: a plan below greedy", file=sys.stderr)
            return 1
    print(f"reference loop {reference_loop():.3f} s at the end; load average "
          f"{os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
