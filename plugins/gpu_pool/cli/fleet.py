"""Fleet commands: ``db migrate``, ``team``, ``nodes`` and ``quota``."""

from __future__ import annotations

import argparse
import dataclasses
from datetime import UTC, datetime
from pathlib import Path

from gpu_pool.cli import add_command, add_group
from gpu_pool.cli.context import display_url, open_store, policy
from gpu_pool.cli.output import emit, emit_object
from gpu_pool.errors import SpecError
from gpu_pool.model import NodeState
from gpu_pool.spec import (
    parse_lending,
    parse_name,
    parse_nodes_document,
    parse_quota,
    parse_team,
    parse_text,
    parse_yaml,
    read_input_file,
)

ACTOR = "cli"


def register(subparsers: argparse._SubParsersAction) -> None:
    db = add_group(subparsers, "db", "the store's schema")
    add_command(db, "migrate", "create or upgrade the store's schema (idempotent)").set_defaults(
        func=db_migrate)

    team = add_group(subparsers, "team", "teams that own quota")
    p = add_command(team, "add", "add a team, or change the channels given of an existing one")
    p.add_argument("name")
    p.add_argument("--email", dest="notify_email", help="where alerts go by e-mail")
    p.add_argument("--webhook", dest="notify_webhook", help="a Slack-style webhook URL")
    p.set_defaults(func=team_add)
    add_command(team, "list", "list teams").set_defaults(func=team_list)
    p = add_command(team, "lend", "let other teams borrow this team's idle guaranteed GPUs")
    p.add_argument("name")
    p.add_argument("--to", help="all, none, or team names separated by commas (nlp,speech)")
    p.add_argument("--limit", help="at most this many GPUs lent at once (default: no limit)")
    p.add_argument("--revoke", action="store_true",
                   help="forget the consent: lend to every team without limit (the default)")
    p.set_defaults(func=team_lend)
    add_command(team, "lending", "list the lending consents of every team").set_defaults(
        func=team_lending)
    from gpu_pool.cli.governance import register_members

    register_members(team)

    nodes = add_group(subparsers, "nodes", "the GPU hosts of the fleet")
    p = add_command(nodes, "import", "add nodes from a YAML file (all of them, or none)")
    p.add_argument("file", type=Path)
    p.add_argument("--replace", action="store_true", help="update nodes that already exist")
    p.set_defaults(func=nodes_import)
    add_command(nodes, "list", "list nodes with free and held GPUs").set_defaults(func=nodes_list)
    for verb, state, text in (("drain", NodeState.DRAINING, "give a node nothing new"),
                              ("undrain", NodeState.UP, "put a drained or down node back up")):
        p = add_command(nodes, verb, text)
        p.add_argument("name")
        p.add_argument("--reason", default=f"{verb} from the CLI")
        p.set_defaults(func=nodes_set_state, state=state)

    quota = add_group(subparsers, "quota", "guaranteed GPUs per team, purpose and model")
    p = add_command(quota, "set", "grant a quota")
    p.add_argument("--team", required=True)
    p.add_argument("--purpose", required=True, help="training, inference or pretraining")
    p.add_argument("--gpus", required=True, help="guaranteed GPUs")
    p.add_argument("--model", dest="gpu_model", help="a GPU model, or any (the default)")
    p.add_argument("--from", dest="valid_from", help="ISO time (default: now)")
    p.add_argument("--expires", dest="expires_at", required=True, help="ISO time")
    p.add_argument("--borrow", dest="borrow_limit_gpus", help="GPUs it may borrow when idle")
    p.add_argument("--budget", dest="gpu_hour_budget", help="GPU-hours per period")
    p.set_defaults(func=quota_set)
    p = add_command(quota, "import", "grant the quotas of a YAML file (all of them, or none)")
    p.add_argument("file", type=Path)
    p.set_defaults(func=quota_import)
    add_command(quota, "list", "list quotas with their usage").set_defaults(func=quota_list)


def db_migrate(args: argparse.Namespace) -> int:
    store = open_store(args, create=True)  # making the store is this command's job
    applied = store.migrate()
    emit_object(args.json, {"store": display_url(str(store.url)),
                            "applied": list(applied) or "none (up to date)"})
    return 0


def team_add(args: argparse.Namespace) -> int:
    """A new team, or only the given channels of an existing one (nothing given: a no-op
    that says so; a channel not given is never wiped)."""
    given = {k: getattr(args, k) for k in ("notify_email", "notify_webhook")
             if getattr(args, k) is not None}
    team = parse_team({"name": args.name, **given})
    store = open_store(args)
    existing = next((t for t in store.list_teams() if t.name == team.name), None)
    if existing is not None:
        merged = dataclasses.replace(existing, **given)
        if merged == existing:
            emit_object(args.json, {"team": team.name, "email": existing.notify_email,
                                    "webhook": existing.notify_webhook,
                                    "changed": "nothing (it exists; give --email or --webhook "
                                               "to change its channels)"})
            return 0
        team = merged
    store.upsert_team(team, actor=ACTOR)
    changed = ("added" if existing is None else ", ".join(
        f"{k.removeprefix('notify_')} {getattr(existing, k) or '-'} -> {v}"
        for k, v in given.items() if getattr(existing, k) != v))
    emit_object(args.json, {"team": team.name, "email": team.notify_email,
                            "webhook": team.notify_webhook, "changed": changed})
    return 0


def team_list(args: argparse.Namespace) -> int:
    rows = [{"team": t.name, "email": t.notify_email, "webhook": t.notify_webhook}
            for t in open_store(args).list_teams()]
    emit(args.json, rows, ("team", "email", "webhook"), empty="no teams")
    return 0


def team_lend(args: argparse.Namespace) -> int:
    """Record, change or revoke a team's consent to lend its idle guaranteed GPUs."""
    from gpu_pool.store.lending import describe

    store = open_store(args)
    if args.revoke:
        if args.to is not None or args.limit is not None:
            raise SpecError("revoke", True, "--revoke alone (no --to or --limit)")
        name = parse_name(args.name, "team")
        before = store.revoke_lending(name, actor=ACTOR)
        emit_object(args.json, {"team": name, "lends_to": describe(None),
                                "was": describe(before) if before else "the default already"})
        return 0
    if args.to is None:
        raise SpecError("to", None, "all, none, or team names separated by commas (or "
                        "--revoke)")
    consent = parse_lending(args.name, args.to, args.limit)
    before = next((x for x in store.lending() if x.team == consent.team), None)
    saved = store.set_lending(consent, actor=ACTOR)
    emit_object(args.json, {"team": saved.team, "lends_to": describe(saved),
                            "was": describe(before) + ("" if before else " (default)")})
    return 0


def team_lending(args: argparse.Namespace) -> int:
    from gpu_pool.store.lending import describe

    store = open_store(args)
    consents = {x.team: x for x in store.lending()}
    rows = []
    for t in store.list_teams():
        c = consents.get(t.name)
        rows.append({"team": t.name,
                     "lends_to": "every team" if c is None or c.to is None else
                     (", ".join(sorted(c.to)) or "nobody"),
                     "limit_gpus": None if c is None else c.limit_gpus,
                     "set_by": c.set_by if c else "(default)",
                     "set_at": c.set_at if c else None,
                     "summary": describe(c)})
    emit(args.json, rows, ("team", "lends_to", "limit_gpus", "set_by", "set_at"),
         empty="no teams")
    return 0


def nodes_import(args: argparse.Namespace) -> int:
    text = read_input_file(args.file)
    store = open_store(args)
    nodes = parse_nodes_document(text, str(args.file), policy=policy(store))
    store.import_nodes(nodes, actor=ACTOR, replace=args.replace)  # one transaction
    rows = [{"node": n.name, "zone": n.zone, "model": n.gpu_model, "gpus": n.gpu_count,
             "state": n.state} for n in nodes]
    emit(args.json, rows, ("node", "zone", "model", "gpus", "state"))
    return 0


def nodes_list(args: argparse.Namespace) -> int:
    store = open_store(args)
    held: dict[str, dict[int, int]] = {}
    for a in store.active_allocations():
        for i in a.gpu_indices:
            held.setdefault(a.node, {}).setdefault(i, 0)
            held[a.node][i] += a.gpu_milli
    rows = []
    for n in store.list_nodes():
        taken = held.get(n.name, {})
        rows.append({"node": n.name, "zone": n.zone, "model": n.gpu_model, "gpus": n.gpu_count,
                     "free_gpus": sum(1 for g in n.gpus if not taken.get(g.index)),
                     "held_milli": sum(taken.values()), "state": n.state,
                     "ssh_conn_id": n.ssh_conn_id})
    emit(args.json, rows, ("node", "zone", "model", "gpus", "free_gpus", "held_milli", "state",
                           "ssh_conn_id"), empty="no nodes (add some with `gpu-pool nodes import`)")
    return 0


def nodes_set_state(args: argparse.Namespace) -> int:
    name, reason = parse_name(args.name), parse_text(args.reason, "reason")
    store = open_store(args)
    store.set_node_state(name, args.state, actor=ACTOR, reason=reason)
    emit_object(args.json, {"node": args.name, "state": args.state})
    return 0


def quota_set(args: argparse.Namespace) -> int:
    fields = {k: getattr(args, k) for k in ("team", "purpose", "gpus", "gpu_model", "valid_from",
                                            "expires_at", "borrow_limit_gpus", "gpu_hour_budget")
              if getattr(args, k) is not None}
    fields.setdefault("valid_from", datetime.now(UTC))
    store = open_store(args)
    quota = parse_quota(fields, policy=policy(store),
                        known_teams={t.name for t in store.list_teams()})
    ((saved, replaced),) = store.set_quotas([quota], actor=ACTOR)
    emit_object(args.json, {**_quota_row(saved, None), "replaced": _replaced(replaced)})
    return 0


def quota_import(args: argparse.Namespace) -> int:
    """Every quota of a YAML file (``quotas: [...]`` or a bare list) in one transaction."""
    source = str(args.file)
    document = parse_yaml(read_input_file(args.file), source)
    items = document.get("quotas") if isinstance(document, dict) else document
    if not isinstance(items, list) or not items:
        raise SpecError("quotas", type(items).__name__, "a list of quotas (or a mapping with "
                        "a 'quotas' list)", where=source)
    store = open_store(args)
    teams = {t.name for t in store.list_teams()}
    in_force = policy(store)
    parsed = []
    for i, item in enumerate(items):
        where = f"{source}: quota #{i + 1}"
        if not isinstance(item, dict):
            raise SpecError("quota", item, "a mapping of quota fields", where=where)
        try:
            parsed.append(parse_quota(item, policy=in_force, known_teams=teams))
        except SpecError as error:
            raise error.located(where) from None
    done = store.set_quotas(parsed, actor=ACTOR)  # all or nothing
    rows = [{**_quota_row(saved, None), "replaced": _replaced(replaced)}
            for saved, replaced in done]
    emit(args.json, rows, ("team", "purpose", "model", "gpus", "valid_from", "expires_at",
                           "replaced"))
    return 0


def _replaced(before) -> str:  # noqa: ANN001 - a Quota or None
    """What an upsert replaced, in one phrase ('-' when the quota is new)."""
    if before is None:
        return "-"
    budget = f", budget {before.gpu_hour_budget:g} GPU-h" if before.gpu_hour_budget else ""
    return (f"{before.gpus:g} GPUs (borrow {before.borrow_limit_gpus:g}{budget}) valid "
            f"{before.valid_from:%Y-%m-%d %H:%M} to {before.expires_at:%Y-%m-%d %H:%M}")


def quota_list(args: argparse.Namespace) -> int:
    store = open_store(args)
    now = datetime.now(UTC)
    usage = store.quota_usage(now)
    rows = [_quota_row(q, usage.get(q.id)) for q in store.list_quotas()]
    emit(args.json, rows, ("team", "purpose", "model", "gpus", "in_use", "borrow", "budget",
                           "valid_from", "expires_at", "status"), empty="no quotas")
    return 0


def _quota_row(q, in_use: float | None) -> dict:  # noqa: ANN001 - a Quota
    now = datetime.now(UTC)
    status = ("expired" if q.expires_at <= now else "not yet valid" if q.valid_from > now
              else f"expires in {(q.expires_at - now).days}d")
    return {"id": q.id, "team": q.team, "purpose": q.purpose, "model": q.gpu_model or "any",
            "gpus": q.gpus, "in_use": in_use, "borrow": q.borrow_limit_gpus,
            "budget": q.gpu_hour_budget, "valid_from": q.valid_from, "expires_at": q.expires_at,
            "status": status}
