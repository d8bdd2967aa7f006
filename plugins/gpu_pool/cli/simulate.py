"""``gpu-pool simulate packing`` and ``gpu-pool simulate replay``: the trace simulator.

Both read the Alibaba ``openb`` CSV format from any path (:mod:`gpu_pool.sim.trace`); a bad
row is a :class:`~gpu_pool.errors.SpecError` naming file, line and column (exit 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

from gpu_pool import limits
from gpu_pool.errors import SpecError
from gpu_pool.sim.runner import POLICIES, packing_summary, parse_policy, parse_seeds, run_policy
from gpu_pool.sim.trace import load_trace
from gpu_pool.spec import check_output_file, parse_int, parse_number

REPLAY_POLICIES = ("engine", "fifo", "bestfit")


def register(subparsers: argparse._SubParsersAction) -> None:
    from gpu_pool.cli import add_command, add_group

    group = add_group(subparsers, "simulate", "replay GPU-cluster traces through the engine")
    packing = add_command(group, "packing",
                          "the FGD packing benchmark: unallocated GPU % at 100% arrived demand")
    packing.add_argument("--nodes", required=True, help="node list CSV (openb format)")
    packing.add_argument("--pods", required=True, help="task list CSV (openb format)")
    packing.add_argument("--policy", required=True, help="one of " + ", ".join(POLICIES))
    packing.add_argument("--seeds", default="42-51", help="seeds, like 42-51 (default)")
    packing.add_argument("--batch", default="1",
                         help="arrivals per engine cycle (default 1: online)")
    packing.add_argument("--placements", metavar="OUT.csv",
                         help="write one row per arrived task to this CSV")
    packing.add_argument("--exact", action="store_true",
                         help="bestfit/fgd: compare exact scores instead of the authors' "
                              "integer scores with random ties")
    packing.add_argument("--policy-file", metavar="FILE",
                         help="engine: a sharing-policy YAML document (gpu-pool policy check)")
    packing.add_argument("--bound", action="store_true",
                         help="also the least unallocated GPU %% any placement could reach "
                              "on each seed's arrivals (LP bound, shares packed into cards) "
                              "and the policy's distance to it")
    packing.set_defaults(func=packing_handler)

    mix = add_command(group, "mix",
                      "a task list with more GPU-sharing or model-naming tasks, made from a "
                      "trace's own (the FGD paper's gpushareNN / gpuspecNN variants)")
    mix.add_argument("--nodes", required=True,
                     help="node list CSV: a task only names a model some node can hold it on")
    mix.add_argument("--pods", required=True, help="task list CSV to start from")
    mix.add_argument("--share-fraction", metavar="F",
                     help="share tasks make F of the GPU requests (GPU-milli; gpushare40: "
                          "0.40): whole-GPU tasks are replaced by copies of the trace's own "
                          "share tasks")
    mix.add_argument("--model-fraction", metavar="F",
                     help="tasks naming a GPU model make F of the GPU requests (gpuspec10: 0.11)")
    mix.add_argument("--seed", default="42", help="seed of the draws (default 42)")
    mix.add_argument("--out", required=True, metavar="OUT.csv", help="the task list written")
    mix.set_defaults(func=mix_handler)

    replay = add_command(group, "replay",
                         "a working cluster over time: arrivals, durations, heartbeat cycles")
    replay.add_argument("--nodes", required=True, help="node list CSV (openb format)")
    replay.add_argument("--pods", required=True, help="task list CSV with timestamps")
    replay.add_argument("--policy", required=True, help="one of " + ", ".join(REPLAY_POLICIES))
    replay.add_argument("--heartbeat", default="60",
                        help="seconds of virtual time between placement cycles (default 60)")
    replay.add_argument("--sample", default="1",
                        help="keep this fraction of the tasks (seeded), to shorten a run")
    replay.add_argument("--seed", default="42", help="seed of --sample (default 42)")
    replay.add_argument("--max-cycle-tasks", default="2000",
                        help="most pending tasks the engine sees per cycle (queue head)")
    replay.add_argument("--fleet-fraction", default="1",
                        help="replay on this share of the nodes, stratified by model and "
                             "size (the openb sample loads ~0.2%% of the full fleet)")
    replay.add_argument("--reserve-after", default=None, metavar="SECONDS",
                        help="engine: a request pending this long reserves nodes "
                             "(Policy.reserve_after; default 3600, 0: off)")
    replay.add_argument("--max-reservations", default=None, metavar="N",
                        help="engine: most starving requests holding nodes per cycle "
                             "(Policy.max_reservations; default 1, 0: off)")
    replay.add_argument("--policy-file", metavar="FILE",
                        help="engine: a sharing-policy YAML document (gpu-pool policy check); "
                             "--reserve-after and --max-reservations override it")
    replay.add_argument("--teams", default="0", metavar="4",
                        help="engine: give the tasks to four teams with guarantees "
                             "(inference, train, pretrain, research; see gpu_pool.sim.teams) "
                             "and replay quotas, borrowing, reclaim and preemption")
    replay.add_argument("--no-sharing", action="store_true",
                        help="with --teams: borrowing, reclaim and off-peak lending off "
                             "(the baseline of bench/sharing_report.py)")
    replay.add_argument("--restart-overhead", default="60", metavar="SECONDS",
                        help="with --teams: a preempted task spends this long reloading its "
                             "checkpoint when it restarts (default 60)")
    replay.add_argument("--time-limit-factor", default="1,4", metavar="LO,HI",
                        help="each task declares a time limit of its run times a factor "
                             "drawn log-uniform on [LO, HI] per task (default 1,4: users "
                             "over-ask); 'none': no task declares one")
    replay.add_argument("--compress", default="1", metavar="K",
                        help="divide arrival times by K, durations kept: K times the offered "
                             "load (default 1: the trace's own timestamps)")
    replay.set_defaults(func=replay_handler)


def packing_handler(args: argparse.Namespace) -> int:
    policy = parse_policy(args.policy)
    engine_policy = _policy_file(args, policy)
    seeds = parse_seeds(args.seeds)
    batch = parse_int(args.batch, "batch", minimum=1, maximum=100_000)
    if args.placements:
        check_output_file(args.placements, "placements")  # before minutes of simulation
    trace = load_trace(args.nodes, args.pods)
    runs = run_policy(trace, policy, seeds, batch=batch, exact=args.exact,
                      engine_policy=engine_policy)
    if args.placements:
        from gpu_pool.sim.runner import write_placements
        write_placements(args.placements, runs)
    summary = packing_summary(trace, runs, curve=args.json)
    if args.bound:
        from gpu_pool.sim.bound import unallocated_bound_pct

        for item, run in zip(summary["seeds"], runs, strict=True):
            item["bound_unallocated_pct"] = unallocated_bound_pct(
                [a.task for a in run.arrivals], trace.nodes)
        summary["median_bound_unallocated_pct"] = statistics.median(
            item["bound_unallocated_pct"] for item in summary["seeds"])
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        print()
        return 0
    label = policy if batch == 1 else f"{policy} (batch {batch})"
    bound = f"  {'bound':>6}  {'above':>6}" if args.bound else ""
    print(f"{'seed':>6}  {'unallocated GPU % at 100% arrived':>34}  {'placed':>8}/{'arrived':<8}"
          + bound)
    for item in summary["seeds"]:
        line = (f"{item['seed']:>6}  {item['unallocated_pct']:>34.2f}  "
                f"{item['placed']:>8}/{item['arrived']:<8}")
        if args.bound:
            low = item["bound_unallocated_pct"]
            line += f"  {low:>6.2f}  {item['unallocated_pct'] - low:>+6.2f}"
        print(line)
    print(f"{label}: median unallocated GPU % = {summary['median_unallocated_pct']:.2f}")
    if args.bound:
        print("bound (no placement of these arrivals leaves less): median "
              f"{summary['median_bound_unallocated_pct']:.2f}")
    t = summary["decision_ms"]
    print(f"time per placement decision: median {t['median']:.3f} ms, worst {t['max']:.1f} ms")
    return 0


def mix_handler(args: argparse.Namespace) -> int:
    from gpu_pool.sim import mixes

    if args.share_fraction is None and args.model_fraction is None:
        raise SpecError("share-fraction", None, "--share-fraction F or --model-fraction F "
                        "(or both), each a fraction of the GPU requests from 0 to 1")
    share = (None if args.share_fraction is None
             else parse_number(args.share_fraction, "share-fraction", maximum=1))
    model = (None if args.model_fraction is None
             else parse_number(args.model_fraction, "model-fraction", maximum=1))
    seed = parse_int(args.seed, "seed", minimum=0, maximum=2**32 - 1)
    out = check_output_file(args.out, "out")
    trace = load_trace(args.nodes, args.pods)
    tasks = trace.tasks
    if share is not None:
        tasks = mixes.with_shares(tasks, share, seed)
    if model is not None:
        tasks = mixes.with_models(tasks, model, seed, trace.nodes)
    mixes.write_tasks(out, tasks)
    summary = {"out": str(out), "tasks": len(tasks),
               "share_fraction": mixes.share_fraction(tasks),
               "model_fraction": mixes.model_fraction(tasks),
               "changed": sum(a != b for a, b in zip(trace.tasks, tasks, strict=True))}
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        print()
        return 0
    print(f"wrote {summary['tasks']} tasks to {out} ({summary['changed']} changed): share "
          f"tasks {summary['share_fraction']:.1%} and model-naming tasks "
          f"{summary['model_fraction']:.1%} of the GPU requests")
    return 0


def _policy_file(args: argparse.Namespace, placer: str) -> Any:
    """The sharing policy of ``--policy-file`` (None when not given), parsed as the store
    and the executor parse it; only the engine has a policy."""
    if args.policy_file is None:
        return None
    from gpu_pool.policy_file import check_document
    from gpu_pool.spec import read_input_file

    if placer != "engine":
        raise SpecError("policy-file", args.policy_file, "only with --policy engine (the "
                        f"{placer} baseline has no sharing policy)")
    return check_document(read_input_file(args.policy_file, "policy-file"), args.policy_file)


def replay_handler(args: argparse.Namespace) -> int:
    from gpu_pool.sim.replay import ReplayConfig, replay_summary, run_replay
    from gpu_pool.sim.teams import parse_teams

    if args.policy not in REPLAY_POLICIES:
        raise SpecError("policy", args.policy, "one of " + ", ".join(REPLAY_POLICIES))
    day = 86_400.0
    engine_policy = _policy_file(args, args.policy)
    teams = parse_teams(args.teams)
    if teams and args.policy != "engine":
        raise SpecError("teams", args.teams, "teams only with --policy engine (the baselines "
                        "know no quotas)")
    if args.no_sharing and not teams:
        raise SpecError("no-sharing", "without --teams", "--teams 4 with it (it turns the "
                        "teams' borrowing, reclaim and off-peak lending off)")
    overhead = parse_number(args.restart_overhead, "restart-overhead", maximum=day)
    if args.no_sharing:
        from gpu_pool.sim.sharing import sharing_off

        engine_policy = sharing_off(engine_policy)
    config = ReplayConfig(
        heartbeat_s=parse_number(args.heartbeat, "heartbeat", maximum=day, strict=True),
        sample=parse_number(args.sample, "sample", maximum=1, strict=True),
        seed=parse_int(args.seed, "seed", minimum=0, maximum=2**32 - 1),
        max_cycle_tasks=parse_int(args.max_cycle_tasks, "max-cycle-tasks", minimum=1,
                                  maximum=1_000_000),
        fleet_fraction=parse_number(args.fleet_fraction, "fleet-fraction", maximum=1,
                                    strict=True),
        reserve_after_s=None if args.reserve_after is None else parse_number(
            args.reserve_after, "reserve-after", maximum=limits.MAX_DURATION.total_seconds()),
        max_reservations=None if args.max_reservations is None else parse_int(
            args.max_reservations, "max-reservations", minimum=0, maximum=10_000),
        policy=engine_policy, teams=teams, restart_overhead_s=overhead,
        compress=parse_number(args.compress, "compress", maximum=1000, strict=True),
        time_limit_factor=_factor_range(args.time_limit_factor))
    trace = load_trace(args.nodes, args.pods)
    result = run_replay(trace, args.policy, config)
    summary = replay_summary(result)
    if args.json:
        json.dump(summary, sys.stdout, indent=2)
        print()
        return 0
    _print_replay(summary)
    return 0


def _factor_range(text: str) -> tuple[float, float] | None:
    """``--time-limit-factor``: 'none' or 'LO,HI' with 1 <= LO <= HI <= 100."""
    if text.strip().lower() == "none":
        return None
    parts = text.split(",")
    if len(parts) != 2:
        raise SpecError("time-limit-factor", text, "'none' or two factors LO,HI like 1,4")
    lo, hi = (parse_number(p, "time-limit-factor", maximum=100) for p in parts)
    if not 1 <= lo <= hi:
        raise SpecError("time-limit-factor", text, "two factors with 1 <= LO <= HI (a limit "
                        "below the run would kill it), like 1,4")
    return lo, hi


def _print_replay(s: dict[str, Any]) -> None:
    a = s["gpu_allocation_pct"]
    print(f"policy {s['policy']}: {s['tasks']} tasks, {s['never_started']} never started, "
          f"{s['cycles']} cycles every {s['heartbeat_s']:g} s")
    print(f"GPU allocation %: mean {a['mean']:.1f}, peak hours {a['peak']:.1f}, "
          f"off-peak {a['off_peak']:.1f}")
    print(f"fragmentation (mean FGD frag % of free GPU): {s['fragmentation_pct']:.1f}")
    print(f"{'priority':>10} {'tasks':>7} {'median s':>10} {'p95 s':>10} {'max s':>10}")
    for name, q in s["queueing_delay_s"].items():
        print(f"{name:>10} {q['tasks']:>7} {q['median']:>10.0f} {q['p95']:>10.0f} "
              f"{q['max']:>10.0f}")
    c = s["cycle_ms"]
    print(f"solve time per cycle: median {c['median']:.2f} ms, p95 {c['p95']:.2f} ms, "
          f"max {c['max']:.1f} ms")
    if "sharing" in s:
        _print_sharing(s["sharing"])


def _print_sharing(sh: dict[str, Any]) -> None:
    p = sh["policy"]
    print(f"teams on {sh['fleet_gpus']} GPUs; borrowing {'on' if p['borrowing'] else 'off'}, "
          f"reclaim {'on' if p['reclaim_guarantees'] else 'off'}, off-peak lending "
          f"{'on' if p['lend_idle_off_peak'] else 'off'}")
    print(f"{'team':>10} {'tasks':>6} {'guarantee':>9} {'mean held':>9} "
          f"{'longest below guarantee with work, s':>37}")
    for name, t in sh["teams"].items():
        print(f"{name:>10} {t['tasks']:>6} {t['guarantee_gpus']:>9} {t['mean_held_gpus']:>9.1f} "
              f"{t['longest_below_guarantee_with_work_s']:>37.0f}")
    off = sh["off_peak_allocation_when_queued_pct"]
    print("off-peak GPU allocation % while work was queued: "
          + ("no such time" if off is None else f"{off:.1f}"))
    print(f"preemptions: {sh['preemptions']} ({sh['preemptions_per_hour']:.2f}/h, "
          f"{sh['preemptions_moot']} moot), most of one task {sh['max_preemptions_of_a_task']}; "
          f"GPU-hours lost {sh['gpu_hours_lost']:.1f} ({sh['lost_pct']:.2f}% of "
          f"{sh['gpu_hours_held']:.1f} held)")
