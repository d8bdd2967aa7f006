"""``gpu-pool demo``: the whole idea in one run, on an embedded SQLite store.

It migrates a fresh store, loads a sample fleet (six hosts, two zones, four GPU models),
teams, quotas and a queue, then runs placement cycles on a virtual clock and prints who got
which GPUs and why the rest wait: a request that can never fit is refused at submission, a
critical job jumps the queue, finished jobs give their GPUs back at once, and data that
becomes ready lets its job start. Last, the quota alerts chore runs: the teams' notices
land in files of the demo's folder (``file://`` webhooks), so nothing leaves the machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpu_pool.cli import add_command
from gpu_pool.cli.context import display_url, policy
from gpu_pool.cli.output import format_duration, table
from gpu_pool.engine import plan as run_engine
from gpu_pool.errors import SpecError
from gpu_pool.model import Outcome
from gpu_pool.spec import parse_nodes_document, parse_quota, parse_request, parse_team

ACTOR = "demo"
START = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)  # a weekday morning: peak hours


def register(subparsers: argparse._SubParsersAction) -> None:
    from gpu_pool.cli.airflow_demo import add_arguments

    p = add_command(subparsers, "demo", "run the demo: the engine on a fresh embedded store, "
                                        "or with --airflow in a real Airflow")
    add_arguments(p)
    p.set_defaults(func=demo)


def _data(name: str) -> str:
    return resources.files("gpu_pool").joinpath("demo_data", name).read_text()


def demo_org(alerts_dir: Path) -> dict[str, Any]:
    """The demo's teams and quotas; the teams' notices go to files in ``alerts_dir``."""
    return yaml.safe_load(_data("teams.yaml").replace("{alerts}", str(alerts_dir)))


def demo(args: argparse.Namespace, out: Any = None) -> int:
    import sys

    if getattr(args, "airflow", False):
        from gpu_pool.cli.airflow_demo import airflow_demo

        return airflow_demo(args, out)

    from gpu_pool.store import Store

    out = out or sys.stdout
    folder = Path(tempfile.mkdtemp(prefix="gpu-pool-demo-"))
    alerts_dir = folder / "alerts"
    alerts_dir.mkdir()
    url = args.db or f"sqlite:///{folder / 'store.db'}"
    if args.db is not None and not args.db.strip():
        raise SpecError("db", args.db, "a store URL for the demo, or no --db (a fresh one)")
    store = Store.from_url(url)
    store.migrate()
    if store.list_teams() or store.list_nodes():  # the demo loads its own fleet and teams
        store.close()
        raise SpecError("db", display_url(url), "a new or empty store: the demo loads its "
                        "own fleet, teams and queue (this one holds a fleet already)")
    say = out.write
    say(f"gpu-pool demo: store {display_url(url)} (migrated)\n\n")
    in_force = policy(store)

    nodes = parse_nodes_document(_data("fleet.yaml"), "fleet.yaml", policy=in_force)
    store.import_nodes(nodes, actor=ACTOR)
    say(f"Fleet: {len(nodes)} nodes, {sum(n.gpu_count for n in nodes)} GPUs\n")
    table([{"node": n.name, "zone": n.zone, "model": n.gpu_model, "gpus": n.gpu_count}
           for n in nodes], ("node", "zone", "model", "gpus"), out)

    org = demo_org(alerts_dir)
    for t in org["teams"]:
        store.upsert_team(parse_team(t), actor=ACTOR)
    for q in org["quotas"]:
        fields = {k: v for k, v in q.items() if k not in ("from_days", "expires_days")}
        fields["valid_from"] = START + timedelta(days=q["from_days"])
        fields["expires_at"] = START + timedelta(days=q["expires_days"])
        store.set_quota(parse_quota(fields, policy=in_force), actor=ACTOR)
    say(f"\nTeams and quotas loaded: {', '.join(t['name'] for t in org['teams'])}\n")

    teams = {t.name for t in store.list_teams()}
    say("\nSubmitting the queue:\n")
    for item in yaml.safe_load(_data("queue.yaml")):
        fields = {k: v for k, v in item.items() if k != "minutes_ago"}
        fields["submitted_at"] = START - timedelta(minutes=item["minutes_ago"])
        request = parse_request(fields, policy=in_force, known_teams=teams, nodes=nodes)
        store.submit_request(request, actor=ACTOR, now=fields["submitted_at"])
        say(f"  + {request.name}\n")
    try:
        parse_request({"name": "vision-huge", "team": "vision", "gpus": 16}, policy=in_force,
                      known_teams=teams, nodes=nodes)
    except SpecError as refusal:
        say(f"  x vision-huge refused at submission: {refusal}\n")

    now = START
    _cycle(store, now, "Cycle 1 (09:00, peak hours)", out)

    now = START + timedelta(minutes=30)
    # The two running jobs with the shortest time limits finish first.
    running = sorted({a.request_name: a for a in store.active_allocations()}.values(),
                     key=lambda a: (a.ends_by or now + timedelta(days=365), a.request_name))
    finished = [a.request_name for a in running[:2]]
    say(f"\n09:30: {' and '.join(finished)} finish; their GPUs go back at once.\n")
    for name in finished:
        store.release_request(name, outcome=Outcome.SUCCESS, actor=ACTOR,
                              reason="task succeeded", now=now, policy=in_force)
    say("09:30: the ablation's dataset lands (its Asset event arrives).\n")
    store.set_data_ready("research-ablation", True, actor=ACTOR)
    urgent = parse_request({"name": "nlp-hotfix-eval", "team": "nlp", "purpose": "inference",
                            "gpus": 2, "priority": "critical", "time_limit": "30m",
                            "submitted_at": now}, policy=in_force, known_teams=teams, nodes=nodes)
    store.submit_request(urgent, actor=ACTOR, now=now)
    say("09:30: nlp submits a critical 2-GPU evaluation, last in the queue.\n")
    _cycle(store, now, "Cycle 2 (09:30)", out)

    say("\nWho holds what now:\n")
    rows = [{"request": a.request_name, "team": a.team, "node": a.node,
             "gpus": ",".join(map(str, a.gpu_indices)), "share": a.gpu_milli,
             "since": a.started_at, "until": a.ends_by} for a in store.active_allocations()]
    table(rows, ("request", "team", "node", "gpus", "share", "since", "until"), out)
    ledger = store.ledger()
    say(f"\nLedger: {len(ledger)} finished allocations, "
        f"{sum(e.gpu_hours for e in ledger):.2f} GPU-hours, "
        f"${sum(e.cost for e in ledger):.2f}\n")
    _alerts(store, now, alerts_dir, url, out)
    return 0


def _alerts(store: Any, now: datetime, alerts_dir: Path, url: str, out: Any) -> None:
    """The quota alerts chore on the demo's clock, delivered to the teams' files."""
    from gpu_pool.notify.channels import TeamChannels
    from gpu_pool.ops.config import OpsConfig
    from gpu_pool.ops.runs import run_alerts

    result = run_alerts(store, TeamChannels(email=None), OpsConfig(), now)
    out.write(f"\nQuota alerts ({now:%Y-%m-%d %H:%M} UTC): {len(result.sent)} sent, "
              f"{len(result.failed)} failed\n")
    for path in sorted(alerts_dir.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            notice = json.loads(line)
            out.write(f"  -> {path}: {notice['blocks'][0]['text']['text']}\n")
    for key, error in result.failed:
        out.write(f"  x {key.kind} {key.subject}: {error}\n")
    out.write(f"Each team's webhook is a file in {alerts_dir}; run the chore again with "
              f"`gpu-pool --db {display_url(url)} alerts run`\n")


def _cycle(store: Any, now: datetime, title: str, out: Any) -> None:
    snapshot = store.load_snapshot(policy(store), now)
    plan = run_engine(snapshot)
    result = store.apply_plan(plan, now=now, actor=ACTOR)
    dropped = getattr(result, "dropped", {}) or {}
    out.write(f"\n{title}: {len(plan.placements)} placed, {len(plan.pending)} waiting "
              f"(solver {plan.stats.status}, {plan.stats.wall_seconds * 1000:.0f} ms)\n")
    by_name = {r.name: r for r in snapshot.requests}
    rows = []
    for p in plan.placements:
        req = by_name[p.request_name]
        where = " + ".join(f"{a.node}/{','.join(map(str, a.gpu_indices))}" for a in p.assignments)
        share = f" ({req.gpu_milli}m)" if req.is_share else ""
        rows.append({"request": p.request_name, "priority": req.priority,
                     "decision": ("dropped: " + dropped[p.request_name]) if p.request_name
                     in dropped else f"placed on {where}{share}"})
    for r in plan.pending:
        req = by_name[r.request_name]
        waited = format_duration(now - req.submitted_at) if req.submitted_at else "-"
        rows.append({"request": r.request_name, "priority": req.priority,
                     "decision": f"waits ({waited}): {r.message}"})
    table(rows, ("request", "priority", "decision"), out)
