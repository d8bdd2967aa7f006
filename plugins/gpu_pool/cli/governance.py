"""Governance commands: team members, freeze windows, request templates, the audit trail.

The CLI holds the store's credentials, so it acts as an admin. ``--as USER`` acts for a
person instead and applies that person's permissions: a team lead may approve the use of
the team's templates and set or lift the team's freezes; anyone else is refused. Every change
is an event with its actor (``--as USER``, else ``cli:<login>``): ``gpu-pool audit`` lists
them.
"""

from __future__ import annotations

import argparse
import getpass
import json
from datetime import datetime
from typing import Any

from gpu_pool.cli import add_command, add_group
from gpu_pool.cli.context import open_store
from gpu_pool.cli.output import emit, emit_object
from gpu_pool.errors import NotFoundError, SpecError
from gpu_pool.spec import parse_datetime, parse_yaml, read_input_file
from gpu_pool.store.governance import parse_username


def _as(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--as", dest="as_user", metavar="USER",
                        help="act for this Airflow user, with their permissions "
                             "(default: an admin, recorded as cli:<login>)")


def actor_of(args: argparse.Namespace) -> str:
    user = getattr(args, "as_user", None)
    return parse_username(user, "as") if user else f"cli:{getpass.getuser()}"


def require_lead(store: Any, args: argparse.Namespace, team: str, what: str) -> None:
    """With ``--as USER``, USER must lead ``team``."""
    user = getattr(args, "as_user", None)
    if user and not store.is_lead(team, parse_username(user, "as")):
        raise SpecError("as", user, f"a lead of team {team} (or an admin, without --as) to "
                        f"{what}; leads of {team}: "
                        + (", ".join(m.username for m in store.members(team)
                                     if m.role == "lead") or "none"))


def require_admin(args: argparse.Namespace, what: str) -> None:
    user = getattr(args, "as_user", None)
    if user:
        raise SpecError("as", user, f"no --as: only an admin may {what}")


def register_members(team: argparse._SubParsersAction) -> None:
    """``gpu-pool team add-member / remove-member / members`` (into the team group)."""
    p = add_command(team, "add-member", "add a person to a team (or change their role)")
    p.add_argument("team")
    p.add_argument("user", help="the Airflow user name")
    p.add_argument("--lead", action="store_true", help="a team lead (approves template use "
                   "and freezes for the team)")
    _as(p)
    p.set_defaults(func=member_add)
    p = add_command(team, "remove-member", "remove a person from a team")
    p.add_argument("team")
    p.add_argument("user")
    _as(p)
    p.set_defaults(func=member_remove)
    p = add_command(team, "members", "the members of one team or of all")
    p.add_argument("team", nargs="?")
    p.set_defaults(func=member_list)


def register(subparsers: argparse._SubParsersAction) -> None:
    freeze = add_group(subparsers, "freeze", "freeze a team's quotas, templates and nodes "
                       "for a window")
    p = add_command(freeze, "set", "freeze a team until a time (an explicit end)")
    p.add_argument("team")
    p.add_argument("--until", required=True, help="ISO time the freeze lifts itself")
    p.add_argument("--from", dest="starts_at", help="ISO time it starts (default: now)")
    p.add_argument("--reason", required=True)
    p.add_argument("--critical-only", action="store_true",
                   help="only the team's critical work starts during the window")
    _as(p)
    p.set_defaults(func=freeze_set)
    p = add_command(freeze, "lift", "end a freeze before its end")
    p.add_argument("id")
    _as(p)
    p.set_defaults(func=freeze_lift)
    p = add_command(freeze, "list", "freezes with their state (scheduled, active, ended, "
                    "lifted)")
    p.add_argument("--team")
    p.set_defaults(func=freeze_list)

    tpl = add_group(subparsers, "template", "named, versioned request templates")
    p = add_command(tpl, "save", "save a template's fields as its next version")
    p.add_argument("name")
    p.add_argument("--team", help="the owning team (required for a new template)")
    p.add_argument("--file", help="a YAML mapping of fields")
    p.add_argument("--set", dest="pairs", action="append", default=[], metavar="FIELD=VALUE",
                   help="a field (YAML value), repeatable; with --file, overrides it")
    p.add_argument("--replace", action="store_true",
                   help="start from no fields (default: from the latest version's)")
    p.add_argument("--comment")
    _as(p)
    p.set_defaults(func=template_save)
    p = add_command(tpl, "show", "a template's fields (the latest version, or --version)")
    p.add_argument("name")
    p.add_argument("--version", type=int)
    p.set_defaults(func=template_show)
    add_command(tpl, "list", "every template, latest versions").set_defaults(func=template_list)
    p = add_command(tpl, "history", "every version of a template: who changed what")
    p.add_argument("name")
    p.set_defaults(func=template_history)
    p = add_command(tpl, "restore", "save an earlier version's fields as the next version")
    p.add_argument("name")
    p.add_argument("version", type=int)
    p.add_argument("--comment")
    _as(p)
    p.set_defaults(func=template_restore)
    p = add_command(tpl, "approve", "let another team use a template (its team's lead)")
    p.add_argument("name")
    p.add_argument("--team", required=True, help="the team allowed to use it")
    _as(p)
    p.set_defaults(func=template_approve)

    p = add_command(subparsers, "audit", "every change: quota, node, template, approval, "
                    "freeze, member, policy, lending — who, when, before, after")
    p.add_argument("--team")
    p.add_argument("--kind", help="quota, team, node, template, freeze, policy, lending, "
                   "or one kind such as quota.updated")
    p.add_argument("--actor")
    p.add_argument("--since", help="ISO time")
    p.add_argument("--until", help="ISO time")
    p.add_argument("--limit", type=int, help="the most recent N")
    p.set_defaults(func=audit)


def member_add(args: argparse.Namespace) -> int:
    require_admin(args, "add team members")
    store = open_store(args)
    m = store.add_member(args.team, args.user, actor_of(args),
                         role="lead" if args.lead else "member")
    emit_object(args.json, {"team": m.team, "user": m.username, "role": m.role,
                            "added_by": m.added_by, "added_at": m.added_at})
    return 0


def member_remove(args: argparse.Namespace) -> int:
    require_admin(args, "remove team members")
    m = open_store(args).remove_member(args.team, args.user, actor_of(args))
    emit_object(args.json, {"team": m.team, "user": m.username, "removed": True})
    return 0


def member_list(args: argparse.Namespace) -> int:
    rows = [{"team": m.team, "user": m.username, "role": m.role, "added_by": m.added_by,
             "added_at": m.added_at} for m in open_store(args).members(args.team)]
    emit(args.json, rows, ["team", "user", "role", "added_by", "added_at"])
    return 0


def _freeze_row(f: Any, now: datetime) -> dict[str, Any]:
    return {"id": f.id, "team": f.team, "state": f.state(now), "from": f.starts_at,
            "until": f.ends_at, "critical_only": f.critical_only, "reason": f.reason,
            "set_by": f.set_by, "lifted_by": f.lifted_by}


def freeze_set(args: argparse.Namespace) -> int:
    store = open_store(args)
    require_lead(store, args, args.team, "freeze it")
    until = parse_datetime(args.until, "until")
    starts = parse_datetime(args.starts_at, "from") if args.starts_at else None
    f = store.set_freeze(args.team, until, args.reason, actor_of(args), starts_at=starts,
                         critical_only=args.critical_only)
    emit_object(args.json, _freeze_row(f, store.clock()))
    return 0


def freeze_lift(args: argparse.Namespace) -> int:
    store = open_store(args)
    require_lead(store, args, store.get_freeze(args.id).team, "lift its freeze")
    f = store.lift_freeze(args.id, actor_of(args))
    emit_object(args.json, _freeze_row(f, store.clock()))
    return 0


def freeze_list(args: argparse.Namespace) -> int:
    store = open_store(args)
    now = store.clock()
    rows = [_freeze_row(f, now) for f in store.freezes(args.team)]
    emit(args.json, rows, ["id", "team", "state", "from", "until", "critical_only", "reason",
                           "set_by"])
    return 0


def _fields(args: argparse.Namespace, base: dict[str, Any]) -> dict[str, Any]:
    fields: dict[str, Any] = dict(base)
    given = bool(args.file or args.pairs)
    if args.file:
        doc = parse_yaml(read_input_file(args.file), args.file)
        if not isinstance(doc, dict):
            raise SpecError("file", args.file, "a YAML mapping of template fields")
        fields.update(doc)
    for pair in args.pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SpecError("set", pair, "FIELD=VALUE, such as gpus=2")
        fields[key.strip()] = parse_yaml(value, f"--set {key}") if value else None
    if not given:
        raise SpecError("fields", None, "--file FILE or --set FIELD=VALUE (at least one)")
    return {k: v for k, v in fields.items() if v is not None}  # FIELD= drops a field


def _template_row(t: Any) -> dict[str, Any]:
    return {"template": t.name, "version": t.version, "team": t.team,
            "fields": json.dumps(dict(t.fields), sort_keys=True), "by": t.created_by,
            "at": t.created_at, "comment": t.comment, "restored_from": t.restored_from,
            "approved_for": ",".join(t.approved_for)}


def template_save(args: argparse.Namespace) -> int:
    store = open_store(args)
    try:
        current = store.template(args.name)
    except NotFoundError:
        if args.team is None:  # changing a template needs one; a new one needs its team
            raise
        current = None
    owner = args.team or current.team
    require_lead(store, args, owner, f"change template {args.name}")
    base = {} if args.replace or current is None else dict(current.fields)
    t = store.save_template(args.name, _fields(args, base), actor_of(args), team=args.team,
                            comment=args.comment)
    emit_object(args.json, _template_row(t))
    return 0


def template_show(args: argparse.Namespace) -> int:
    emit_object(args.json, _template_row(open_store(args).template(args.name, args.version)))
    return 0


def template_list(args: argparse.Namespace) -> int:
    rows = [_template_row(t) for t in open_store(args).templates()]
    emit(args.json, rows, ["template", "version", "team", "fields", "approved_for"])
    return 0


def template_history(args: argparse.Namespace) -> int:
    rows = [_template_row(t) for t in open_store(args).template_history(args.name)]
    emit(args.json, rows, ["version", "by", "at", "fields", "comment", "restored_from"])
    return 0


def template_restore(args: argparse.Namespace) -> int:
    store = open_store(args)
    require_lead(store, args, store.template(args.name).team, f"restore template {args.name}")
    t = store.restore_template(args.name, args.version, actor_of(args), args.comment)
    emit_object(args.json, _template_row(t))
    return 0


def template_approve(args: argparse.Namespace) -> int:
    store = open_store(args)
    owner = store.template(args.name).team
    require_lead(store, args, owner, f"approve the use of template {args.name}")
    added = store.approve_template(args.name, args.team, actor_of(args))
    emit_object(args.json, {"template": args.name, "team": args.team,
                            "approved": "recorded" if added else "already approved"})
    return 0


def audit(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise SpecError("limit", args.limit, "a whole number of events, 1 or more")
    since = parse_datetime(args.since, "since") if args.since else None
    until = parse_datetime(args.until, "until") if args.until else None
    found = open_store(args).audit(team=args.team, kind=args.kind, actor=args.actor,
                                   since=since, until=until, limit=args.limit)
    rows = [{"at": e.at, "kind": e.kind, "subject": e.subject, "actor": e.actor,
             "before": json.dumps(e.data.get("before"), sort_keys=True, default=str)
             if "before" in e.data else "",
             "after": json.dumps(e.data.get("after"), sort_keys=True, default=str)
             if "after" in e.data else json.dumps(dict(e.data), sort_keys=True, default=str),
             "reason": e.reason or ""} for e in found]
    emit(args.json, rows, ["at", "kind", "subject", "actor", "before", "after", "reason"])
    return 0
