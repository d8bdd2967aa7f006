"""The teams replay over many seeds: issue 16's figures, median over seeds, per policy.

    .venv/bin/python bench/sharing_seeds.py [--trace ../shared/traces/alibaba-openb-2023/
        openb_pod_list_default.csv] [--seeds 42-51] [--compress 2] [--fleet-fraction 0.004]
        [--set KEY=VALUE ...] [--jobs 2]

Each seed runs ``gpu-pool simulate replay --policy engine --teams 4`` (the sharing arm of
``bench/sharing_report.py``) on ``Policy()`` with the ``--set`` assignments applied, as
``gpu-pool policy set KEY=VALUE`` would (``--set critical_preempts_borrowers=false``).
Prints, per seed and as the median over seeds: critical p95 and longest wait (and how many
seeds keep critical p95 within a heartbeat), the p95 wait of the other classes, the longest
normal wait, preemptions, off-peak allocation while work is queued, the longest stretch a
team spent below its guarantee while reclaim could restore it, tasks never started, and
the machine it ran on.
"""

from __future__ import annotations

import argparse
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))

from gpu_pool.policy_file import merge_assignments, parse_policy  # noqa: E402
from gpu_pool.sim.replay import ReplayConfig, replay_summary, run_replay  # noqa: E402
from gpu_pool.sim.runner import parse_seeds  # noqa: E402
from gpu_pool.sim.teams import parse_teams  # noqa: E402
from gpu_pool.sim.trace import load_trace  # noqa: E402
from sharing_report import machine  # noqa: E402  (bench/, the script's own folder)

TRACES = REPO.parent / "shared" / "traces" / "alibaba-openb-2023"


def _one(args: tuple[str, int, float, float, float, tuple[str, ...]]) -> dict[str, Any]:
    pods, seed, compress, fraction, heartbeat, sets = args
    policy = parse_policy(merge_assignments(None, sets), "--set")
    trace = load_trace(Path(pods).parent / "openb_node_list_gpu_node.csv", pods)
    result = run_replay(trace, "engine", ReplayConfig(
        fleet_fraction=fraction, seed=seed, teams=parse_teams("4"), policy=policy,
        heartbeat_s=heartbeat, compress=compress))
    s = replay_summary(result)
    sh = s["sharing"]
    delay = s["queueing_delay_s"]

    def p95(cls: str) -> float | None:
        return delay[cls]["p95"] if cls in delay else None

    return {
        "seed": seed,
        "critical p95": p95("critical"),
        "critical max": delay["critical"]["max"] if "critical" in delay else None,
        "high p95": p95("high"),
        "normal p95": p95("normal"),
        "low p95": p95("low"),
        "batch p95": p95("batch"),
        "longest normal wait": delay["normal"]["max"] if "normal" in delay else None,
        "preemptions": sh["preemptions"],
        "critical preemptions": sh["preemptions_by_kind"].get("critical", 0),
        "off-peak alloc % while queued": sh["off_peak_allocation_when_queued_pct"],
        "below guarantee, restorable (s)": max(
            t["longest_below_guarantee_restorable_s"] for t in sh["teams"].values()),
        "never started": s["never_started"],
    }


def _cell(x: Any) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if isinstance(x, int) or abs(x) >= 100 else f"{x:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(TRACES / "openb_pod_list_default.csv"))
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--compress", type=float, default=2.0)
    parser.add_argument("--fleet-fraction", type=float, default=0.004)
    parser.add_argument("--heartbeat", type=float, default=60.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)
    sets = tuple(args.set)
    parse_policy(merge_assignments(None, sets), "--set")  # a bad assignment fails here
    seeds = parse_seeds(args.seeds)
    work = [(args.trace, seed, args.compress, args.fleet_fraction, args.heartbeat, sets)
            for seed in seeds]
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        rows = list(pool.map(_one, work))
    keys = [k for k in rows[0] if k != "seed"]
    print(f"teams replay, K={args.compress:g}, fleet fraction {args.fleet_fraction}, "
          f"policy: defaults{' + ' + ', '.join(sets) if sets else ''}")
    print("| seed | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for row in rows:
        print(f"| {row['seed']} | " + " | ".join(_cell(row[k]) for k in keys) + " |")
    medians = []
    for k in keys:
        values = [row[k] for row in rows if row[k] is not None]
        medians.append(_cell(median(values)) if values else "-")
    print("| median | " + " | ".join(medians) + " |")
    within = sum(1 for row in rows if row["critical p95"] is not None
                 and row["critical p95"] <= args.heartbeat)
    print(f"critical p95 within a heartbeat ({args.heartbeat:g} s) on {within} of "
          f"{len(rows)} seeds")
    print(f"machine: {machine()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
