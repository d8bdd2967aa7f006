"""Replay tails over many seeds: the engine's longest and p95 waits beside best-fit's.

    .venv/bin/python bench/replay_seeds.py [--traces ../shared/traces/alibaba-openb-2023]
        [--mixes default,gpushare40,gpuspec10] [--seeds 42-51] [--policies engine,bestfit]
        [--jobs 2] [--out /tmp/replay_seeds] [--tag NAME] [--fresh]

Each (mix, seed, policy) replay runs on ``--fleet-fraction`` of the nodes (the seed picks the
share and the tasks' declared time limits) and its summary is kept as JSON under
``OUT/TAG`` (a rerun reuses it unless ``--fresh``; give a new ``--tag`` per engine
variant, best-fit's runs are shared across tags under ``OUT/base``). Prints, per mix and
priority class, the median over seeds of the longest wait, the p95 wait and the tasks never
started, for each policy, and the seeds that miss issue 18's target: the engine's longest
wait no longer than best-fit's on the same run, and no longer than an hour where
best-fit's is longer. Prints the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "plugins"))

from gpu_pool.sim.replay import ReplayConfig, replay_summary, run_replay  # noqa: E402
from gpu_pool.sim.runner import parse_seeds  # noqa: E402
from gpu_pool.sim.trace import load_trace  # noqa: E402

CLASSES = ("critical", "high", "normal", "low")
HOUR = 3600.0


def _one(args: tuple[str, str, int, str, float, str]) -> tuple[tuple[str, int, str], dict]:
    traces, mix, seed, policy, fraction, path = args
    folder = Path(traces)
    trace = load_trace(folder / "openb_node_list_gpu_node.csv",
                       folder / f"openb_pod_list_{mix}.csv")
    summary = replay_summary(run_replay(trace, policy, ReplayConfig(
        fleet_fraction=fraction, seed=seed)))
    summary.pop("allocation_by_hour_pct", None)
    Path(path).write_text(json.dumps(summary))
    return (mix, seed, policy), summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", default=str(REPO.parent / "shared" / "traces"
                                                / "alibaba-openb-2023"))
    parser.add_argument("--mixes", default="default,gpushare40,gpuspec10")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--policies", default="engine,bestfit")
    parser.add_argument("--fleet-fraction", type=float, default=0.004)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="/tmp/replay_seeds")
    parser.add_argument("--tag", default="engine")
    parser.add_argument("--fresh", action="store_true")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    mixes = [m for m in args.mixes.split(",") if m]
    policies = [p for p in args.policies.split(",") if p]
    out = Path(args.out)
    results: dict[tuple[str, int, str], dict] = {}
    todo = []
    for mix in mixes:
        for seed in seeds:
            for policy in policies:
                folder = out / (args.tag if policy == "engine" else "base")
                folder.mkdir(parents=True, exist_ok=True)
                path = folder / f"{mix}-{seed}-{policy}.json"
                if path.exists() and not args.fresh:
                    results[mix, seed, policy] = json.loads(path.read_text())
                else:
                    todo.append((args.traces, mix, seed, policy, args.fleet_fraction, str(path)))
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for key, summary in pool.map(_one, todo):
            results[key] = summary
    print(f"machine: {platform.platform()}, {os.cpu_count()} CPUs, "
          f"Python {platform.python_version()}; engine results: {out / args.tag}")
    print(f"seeds {args.seeds}, fleet fraction {args.fleet_fraction}; medians over seeds "
          "(max / p95 wait in s, never started, mean allocation %)")
    for mix in mixes:
        print(f"\n{mix}")
        for policy in policies:
            rows = [results[mix, s, policy] for s in seeds]
            cells = []
            for c in CLASSES:
                tails = [r["queueing_delay_s"][c] for r in rows if c in r["queueing_delay_s"]]
                if tails:
                    cells.append(f"{c} {median(t['max'] for t in tails):>9.0f}/"
                                 f"{median(t['p95'] for t in tails):>6.0f}")
            never = median(r["never_started"] for r in rows)
            alloc = median(r["gpu_allocation_pct"]["mean"] for r in rows)
            print(f"  {policy:8s} " + "  ".join(cells) + f"  never {never:g}  alloc {alloc:.2f}")
        if "engine" in policies and "bestfit" in policies:
            misses = []
            for s in seeds:
                e = results[mix, s, "engine"]["queueing_delay_s"]
                b = results[mix, s, "bestfit"]["queueing_delay_s"]
                for c in CLASSES:
                    if c in e and c in b and e[c]["max"] > min(b[c]["max"], HOUR):
                        misses.append(f"{s}:{c} {e[c]['max']:.0f}/{b[c]['max']:.0f}")
            print("  seeds missing the target (engine max > min(bestfit max, 1 h)), "
                  "engine/bestfit max: "
                  + (", ".join(misses) if misses else "none"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
