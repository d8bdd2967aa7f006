"""Workload commands: ``submit``, ``queue``, ``place``, ``why`` and ``release``.

``queue`` and ``why`` run the placement engine as a what-if (nothing is written); ``place``
runs one cycle and applies it, unless ``--dry-run``. ``queue`` shows each team's decayed
use (fair share: ``used`` in GPU-hours; among equals the team with less goes first) and,
in text, one line per team ("team cv: 41.2 decayed GPU-h, rank 2/4").
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpu_pool.cli import add_command
from gpu_pool.cli.context import open_store, policy
from gpu_pool.cli.output import emit, emit_object
from gpu_pool.engine.types import Plan
from gpu_pool.errors import NotFoundError, SpecError
from gpu_pool.model import Outcome, Request
from gpu_pool.spec import (
    parse_enum,
    parse_name,
    parse_request,
    parse_text,
    parse_yaml,
    read_input_file,
)

ACTOR = "cli"

_SUBMIT_FLAGS = (
    ("--name", "name", "a unique name for the request"),
    ("--team", "team", "the team whose quota it uses"),
    ("--gpus", "gpus", "whole GPUs in all (default 1)"),
    ("--share", "gpu_share", "a share of one GPU in thousandths, 1..999"),
    ("--nodes", "nodes", "nodes of a multi-node gang"),
    ("--gpus-per-node", "gpus_per_node", "GPUs on each node of a gang"),
    ("--models", "gpu_models", "acceptable GPU models, e.g. A100|H100"),
    ("--min-gpu-memory", "min_gpu_memory", "e.g. 40GiB"),
    ("--cpu", "cpu", "cores, or millicores like 500m"),
    ("--memory", "memory", "host RAM, e.g. 64GiB"),
    ("--purpose", "purpose", "training, inference or pretraining"),
    ("--priority", "priority", "critical, high, normal, low or batch"),
    ("--dataset", "dataset", "the dataset's URI"),
    ("--dataset-zone", "dataset_zone", "the zone where the dataset lives"),
    ("--dataset-size-gib", "dataset_size_gib", "its size in GiB"),
    ("--time-limit", "time_limit", "e.g. 6h"),
    ("--estimated-runtime", "estimated_runtime", "e.g. 2h"),
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = add_command(subparsers, "submit", "ask for GPUs (refused at once if it can never fit)")
    for flag, dest, text in _SUBMIT_FLAGS:
        p.add_argument(flag, dest=dest, help=text)
    p.add_argument("--not-ready", dest="data_ready", action="store_const", const=False,
                   help="its data is not ready yet: it waits holding nothing")
    p.add_argument("--preemptible", action="store_const", const=True)
    p.add_argument("--file", type=Path, help="a YAML file with one request or a list of them "
                                              "(all are submitted, or none)")
    p.set_defaults(func=submit)

    p = add_command(subparsers, "queue", "pending requests in placement order, with reasons")
    p.add_argument("--team", help="only this team's requests")
    p.set_defaults(func=queue)

    p = add_command(subparsers, "place", "run one placement cycle and apply it")
    p.add_argument("--dry-run", action="store_true", help="show the plan, change nothing")
    p.set_defaults(func=place)

    p = add_command(subparsers, "why", "why a request waits, or where it runs")
    p.add_argument("name")
    p.set_defaults(func=why)

    p = add_command(subparsers, "release", "end a request and free its GPUs")
    p.add_argument("name")
    p.add_argument("--outcome", default="success", help=", ".join(o.value for o in Outcome))
    p.add_argument("--reason", default="released from the CLI")
    p.set_defaults(func=release)


def _requests_from(args: argparse.Namespace) -> list[dict[str, Any]]:
    flags = {dest: getattr(args, dest) for _, dest, _ in _SUBMIT_FLAGS}
    flags.update(data_ready=args.data_ready, preemptible=args.preemptible)
    given = {k: v for k, v in flags.items() if v is not None}
    if args.file is None:
        return [given]
    if given:
        raise SpecError(sorted(given)[0], given[sorted(given)[0]],
                        "nothing beside --file: the file holds every field of its requests")
    source = str(args.file)
    document = parse_yaml(read_input_file(args.file), source)
    items = document if isinstance(document, list) else [document]
    if not items or not all(isinstance(i, dict) for i in items):
        raise SpecError("file", source, "a mapping of request fields, or a list of them")
    return items


def submit(args: argparse.Namespace) -> int:
    items = _requests_from(args)
    store = open_store(args)
    teams = {t.name for t in store.list_teams()}
    nodes = store.list_nodes()
    now = datetime.now(UTC)
    in_force = policy(store)
    requests: list[Request] = []
    seen: dict[str, int] = {}
    for i, fields in enumerate(items):
        try:
            request = parse_request(fields, policy=in_force, known_teams=teams, nodes=nodes,
                                    now=now)
            if request.name in seen:
                raise SpecError("name", request.name, "a name given once in the file (request "
                                f"#{seen[request.name] + 1} has it)")
        except SpecError as error:
            raise (error.located(f"{args.file}: request #{i + 1}") if args.file else error) from None
        seen[request.name] = i
        requests.append(request)
    try:
        saved = store.submit_requests(requests, actor=ACTOR, now=now)  # all or none
    except SpecError as error:
        if not args.file:
            raise
        index = next((i for i, r in enumerate(requests) if r.name == error.value), None)
        where = f"{args.file}: request #{index + 1}" if index is not None else str(args.file)
        raise error.located(where) from None
    rows = [_request_row(r, now) for r in saved]
    emit(args.json, rows, ("request", "team", "priority", "gpus", "models", "state"))
    return 0


def _request_row(r: Request, now: datetime) -> dict[str, Any]:
    waited = now - r.submitted_at if r.submitted_at else None
    return {"request": r.name, "team": r.team, "purpose": r.purpose, "priority": r.priority,
            "gpus": _shape(r), "models": r.gpu_models or "any", "waited": waited,
            "state": "pending"}


def _shape(r: Request) -> str:
    if r.is_share:
        return f"{r.gpu_milli}m of 1"
    if r.is_gang:
        return f"{r.nodes}x{r.gpus}"
    return str(r.gpus)


def _estimate(at: datetime | None, now: datetime) -> str:
    """A start estimate in words: '~14:20 UTC (in 2 h 5 min)', or why there is none."""
    if at is None:
        return "unknown"
    wait = max(int((at - now).total_seconds()), 0)
    if wait < 60:
        return "now"
    hours, minutes = divmod(wait // 60, 60)
    span = f"{hours} h {minutes} min" if hours else f"{minutes} min"
    day = "%H:%M" if at.date() == now.date() else "%Y-%m-%d %H:%M"
    return f"~{at.strftime(day)} UTC (in {span})"


def _dry_run(store: Any, now: datetime) -> tuple[Any, Plan]:
    from gpu_pool.engine import plan as run_engine

    snapshot = store.load_snapshot(policy(store), now)
    return snapshot, run_engine(snapshot)


def queue(args: argparse.Namespace) -> int:
    team = None if args.team is None else parse_name(args.team, "team")
    store = open_store(args)
    now = datetime.now(UTC)
    snapshot, plan = _dry_run(store, now)
    by_name = {r.name: r for r in snapshot.requests}
    usage = snapshot.team_usage
    rows = []
    for p in plan.placements:  # what would start now, in the engine's order
        node_list = ",".join(f"{a.node}/{','.join(map(str, a.gpu_indices))}" for a in p.assignments)
        note = f"; {p.note}" if p.note else ""
        rows.append({**_request_row(by_name[p.request_name], now), "state": "next",
                     "reason": f"would start now on {node_list}{note}"})
    for reason in plan.pending:
        rows.append({**_request_row(by_name[reason.request_name], now), "state": reason.code,
                     "starts": _estimate(plan.estimates.get(reason.request_name), now),
                     "reason": reason.message})
    for row in rows:
        row["used"] = round(usage.get(row["team"], 0.0), 1)
        row.setdefault("starts", "now")
    if team is not None:
        rows = [r for r in rows if r["team"] == team]
    emit(args.json, rows,
         ("request", "team", "priority", "gpus", "waited", "used", "state", "starts", "reason"),
         empty="the queue is empty")
    if not args.json and usage:
        print()
        for line in fair_share_lines(usage, {r["team"] for r in rows}):
            print(line)
    return 0


def fair_share_lines(usage: dict[str, float], teams: set[str]) -> list[str]:
    """One line per team of ``teams`` (sorted by rank): its decayed use and its rank among
    every team with use or in ``teams`` (1 = least used, goes first among equals)."""
    from gpu_pool.store.usage import ranks

    rank = ranks(usage, teams)
    return [f"team {t}: {usage.get(t, 0.0):.1f} decayed GPU-h, rank {rank[t]}/{len(rank)}"
            for t in sorted(teams, key=lambda t: rank[t])]


def place(args: argparse.Namespace) -> int:
    store = open_store(args)
    now = datetime.now(UTC)
    _, plan = _dry_run(store, now)
    dropped: dict[str, str] = {}
    if not args.dry_run:
        result = store.apply_plan(plan, now=now, actor=ACTOR)
        dropped = dict(getattr(result, "dropped", {}) or {})
    rows = []
    for p in plan.placements:
        note = f" ({p.note})" if p.note else ""
        for a in p.assignments:
            rows.append({"request": p.request_name, "node": a.node,
                         "gpus": ",".join(map(str, a.gpu_indices)) or "-", "milli": a.gpu_milli,
                         "result": ("dropped: " + dropped[p.request_name]) if p.request_name in
                         dropped else ("would place" if args.dry_run else "placed") + note})
    for x in plan.preemptions:
        rows.append({"request": x.request_name, "node": None, "gpus": None, "milli": None,
                     "result": x.message})
    for r in plan.pending:
        rows.append({"request": r.request_name, "node": None, "gpus": None, "milli": None,
                     "result": f"{r.code}: {r.message}"})
    if args.json:
        emit_object(True, {"dry_run": args.dry_run, "stats": plan.stats, "rows": rows})
    else:
        emit(False, rows, ("request", "node", "gpus", "milli", "result"), empty="nothing pending")
        s = plan.stats
        print(f"\n{len(plan.placements)} placed, {len(plan.pending)} waiting; solver {s.status} in "
              f"{s.wall_seconds * 1000:.1f} ms (objective {s.objective:g}, greedy "
              f"{s.greedy_objective:g})", file=sys.stdout)
    return 0


def why(args: argparse.Namespace) -> int:
    name = parse_name(args.name)
    store = open_store(args)
    request = store.get_request(name)
    if request is None:
        raise NotFoundError("request", name)
    now = datetime.now(UTC)
    held = [a for a in store.active_allocations() if a.request_name == name]
    info: dict[str, Any] = {"request": name, "team": request.team, "priority": request.priority,
                            "gpus": _shape(request)}
    if held:
        info["state"] = "running"
        info["where"] = "; ".join(f"gpu://{a.node}/{','.join(map(str, a.gpu_indices))}"
                                  for a in held)
        info["until"] = min((a.ends_by for a in held if a.ends_by), default=None)
        lender = next((a.borrowed_from for a in held if a.borrowed_from is not None), None)
        if lender is not None:
            info["borrowed"] = (f"from team {lender}'s idle guarantee" if lender else
                                "capacity no team's guarantee covers") + \
                "; preemptible, may be reclaimed"
    else:
        snapshot, plan = _dry_run(store, now)
        if not any(r.name == name for r in snapshot.requests):
            info["state"] = "not pending (finished, cancelled or refused)"
        elif (placement := plan.placement_of(name)) is not None:
            info["state"] = "next"
            info["why"] = "fits now; it starts at the next placement cycle on " + ", ".join(
                a.node for a in placement.assignments) + (f" ({placement.note})"
                                                          if placement.note else "")
        else:
            reason = plan.reason_of(name)
            info["state"] = reason.code if reason else "pending"
            info["why"] = reason.message if reason else "no reason given"
            info["starts"] = _estimate(plan.estimates.get(name), now)
    emit_object(args.json, info)
    return 0


def release(args: argparse.Namespace) -> int:
    name = parse_name(args.name)
    outcome = parse_enum(args.outcome, Outcome, "outcome")
    reason = parse_text(args.reason, "reason")
    store = open_store(args)
    store.release_request(name, outcome=outcome, actor=ACTOR,
                          reason=reason, now=datetime.now(UTC), policy=policy(store))
    emit_object(args.json, {"request": args.name, "outcome": outcome})
    return 0
