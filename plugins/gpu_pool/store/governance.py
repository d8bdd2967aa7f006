"""Governance: who belongs to which team, freeze windows, versioned request templates.

Terms
-----
member
    An Airflow user name in a team, ``member`` or ``lead``. A team with members on record
    is *closed*: a GPU task is charged to it only when the DAG's owner or the user who
    triggered the run is one of them (:func:`check_charge`). A team with none is *open*
    (any owner) unless the deployment requires membership everywhere.
lead
    A member who approves other teams' use of the team's templates and sets or lifts the
    team's freezes (an admin may do both for any team).
freeze
    A window (``starts_at`` to ``ends_at``, an explicit end) in which the team's quotas,
    templates and nodes (nodes labelled ``team=<team>``) may not change: each such write is
    refused naming the window, its reason and who set it. It lifts itself at its end: the
    first write after it records ``freeze.ended``; a lead or admin may lift it earlier.
    ``critical_only``: during the window only the team's critical work starts.
template
    A named set of request fields (GPUs, models, CPU/RAM, purpose, priority, time limit,
    a setup command) owned by a team. Every save is a new version, none is ever changed;
    restoring version N saves its fields as a new version. Another team uses it only with
    an approval recorded by a lead of the owning team (or an admin).

Invariant: every change here records its event (who, when, before, after) in the same
transaction (:mod:`gpu_pool.store.events`), so the audit trail is exactly what happened.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from gpu_pool.errors import ConflictError, NotFoundError, SpecError
from gpu_pool.store import events
from gpu_pool.store.codec import db_time, from_json, new_id, py_time, to_json
from gpu_pool.store.fleet import require_team

ROLES = ("member", "lead")
_USER = re.compile(r"^[A-Za-z0-9._@+\-]{1,200}$")
TEMPLATE_FIELDS = (
    "purpose", "priority", "gpus", "gpu_share", "nodes", "gpus_per_node", "gpu_models",
    "min_gpu_memory", "cpu", "memory", "time_limit", "estimated_runtime", "preemptible",
    "grace", "setup",
)


class FrozenError(ConflictError):
    """A change refused because the team it touches is inside a freeze window."""

    def __init__(self, freeze: Freeze, what: str) -> None:
        self.freeze = freeze
        super().__init__(
            f"team {freeze.team} is frozen from {_show(freeze.starts_at)} until "
            f"{_show(freeze.ends_at)} (set by {freeze.set_by}: {freeze.reason}); {what} is "
            f"refused until then — a lead of {freeze.team} or an admin may lift it early "
            f"with `gpu-pool freeze lift {freeze.id}`")


def _show(when: datetime) -> str:
    return when.strftime("%Y-%m-%d %H:%M UTC")


def parse_username(value: Any, field: str = "user") -> str:
    if not isinstance(value, str) or not _USER.match(value):
        raise SpecError(field, value, "an Airflow user name: 1 to 200 letters, digits and "
                        "._@+- (no spaces)")
    return value


# -- members ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    team: str
    username: str
    role: str
    added_by: str
    added_at: datetime


def _member(row: Mapping[str, Any]) -> Member:
    return Member(row["team"], row["username"], row["role"], row["added_by"],
                  py_time(row["added_at"]))


def add_member(conn: Connection, team: str, username: str, role: str, actor: str,
               now: datetime) -> Member:
    """Add (or change the role of) a member; one step onboards a person."""
    require_team(conn, team)
    username = parse_username(username)
    if role not in ROLES:
        raise SpecError("role", role, "member or lead")
    before = conn.execute(text("SELECT * FROM team_members WHERE team = :t AND username = :u"),
                          {"t": team, "u": username}).mappings().first()
    if before is not None and before["role"] == role:
        return _member(before)
    if before is None:
        conn.execute(text("INSERT INTO team_members (team, username, role, added_by, added_at)"
                          " VALUES (:t, :u, :r, :a, :now)"),
                     {"t": team, "u": username, "r": role, "a": actor, "now": db_time(now)})
    else:
        conn.execute(text("UPDATE team_members SET role = :r WHERE team = :t AND username = :u"),
                     {"t": team, "u": username, "r": role})
    events.record(conn, now, "team", team, "team.member_added" if before is None
                  else "team.member_role", actor,
                  data={"team": team, "user": username,
                        "before": None if before is None else {"role": before["role"]},
                        "after": {"role": role}})
    return Member(team, username, role, before["added_by"] if before else actor,
                  py_time(before["added_at"]) if before else now)


def remove_member(conn: Connection, team: str, username: str, actor: str,
                  now: datetime) -> Member:
    row = conn.execute(text("SELECT * FROM team_members WHERE team = :t AND username = :u"),
                       {"t": team, "u": username}).mappings().first()
    if row is None:
        raise NotFoundError(f"member of team {team}", username,
                            [m.username for m in members(conn, team)])
    conn.execute(text("DELETE FROM team_members WHERE team = :t AND username = :u"),
                 {"t": team, "u": username})
    events.record(conn, now, "team", team, "team.member_removed", actor,
                  data={"team": team, "user": username, "before": {"role": row["role"]},
                        "after": None})
    return _member(row)


def members(conn: Connection, team: str | None = None) -> list[Member]:
    sql = "SELECT * FROM team_members"
    params: dict[str, Any] = {}
    if team is not None:
        sql += " WHERE team = :t"
        params["t"] = team
    rows = conn.execute(text(sql + " ORDER BY team, username"), params).mappings()
    return [_member(r) for r in rows]


def is_lead(conn: Connection, team: str, username: str) -> bool:
    return conn.execute(text("SELECT 1 FROM team_members WHERE team = :t AND username = :u "
                             "AND role = 'lead'"), {"t": team, "u": username}).first() is not None


def check_charge(conn: Connection, team: str, people: Collection[str], *,
                 require_membership: bool = False) -> None:
    """Refuse to charge ``team`` unless one of ``people`` (the DAG's owners, the user who
    triggered the run) is a member of it. A team with no members is open unless
    ``require_membership``."""
    names = [m.username for m in members(conn, team)]
    if not names and not require_membership:
        return
    if set(people) & set(names):
        return
    shown = ", ".join(sorted(p for p in people if p)) or "nobody (no owner, no triggering user)"
    raise SpecError("team", team, f"a team that the DAG's owner or the user who triggered the "
                    f"run belongs to; {shown} is not a member of {team} (members: "
                    f"{', '.join(names) or 'none'}) — a lead or admin adds them with "
                    f"`gpu-pool team add-member {team} USER`")


# -- freezes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Freeze:
    id: str
    team: str
    starts_at: datetime
    ends_at: datetime
    reason: str
    critical_only: bool
    set_by: str
    created_at: datetime
    lifted_at: datetime | None = None
    lifted_by: str | None = None

    def active(self, now: datetime) -> bool:
        end = min(self.ends_at, self.lifted_at) if self.lifted_at else self.ends_at
        return self.starts_at <= now < end

    def state(self, now: datetime) -> str:
        if self.lifted_at is not None and self.lifted_at < self.ends_at:
            return "lifted"
        if now < self.starts_at:
            return "scheduled"
        return "active" if now < self.ends_at else "ended"


def _freeze(row: Mapping[str, Any]) -> Freeze:
    return Freeze(row["id"], row["team"], py_time(row["starts_at"]), py_time(row["ends_at"]),
                  row["reason"], bool(row["critical_only"]), row["set_by"],
                  py_time(row["created_at"]), py_time(row["lifted_at"]), row["lifted_by"])


def _freeze_summary(f: Freeze) -> dict[str, Any]:
    return {"team": f.team, "starts_at": f.starts_at.isoformat(), "ends_at": f.ends_at.isoformat(),
            "reason": f.reason, "critical_only": f.critical_only}


def set_freeze(conn: Connection, team: str, starts_at: datetime, ends_at: datetime,
               reason: str, critical_only: bool, actor: str, now: datetime) -> Freeze:
    require_team(conn, team)
    if ends_at <= now:
        raise SpecError("until", ends_at.isoformat(), "a time in the future")
    if ends_at <= starts_at:
        raise SpecError("until", ends_at.isoformat(), f"a time after the start "
                        f"({starts_at.isoformat()}): a freeze needs an explicit end")
    if not isinstance(reason, str) or not reason.strip() or len(reason) > 500:
        raise SpecError("reason", reason, "why the team is frozen, 1 to 500 characters")
    freeze = Freeze(new_id(), team, starts_at, ends_at, reason.strip(), critical_only, actor,
                    now)
    conn.execute(text(
        "INSERT INTO freezes (id, team, starts_at, ends_at, reason, critical_only, set_by, "
        "created_at) VALUES (:id, :team, :s, :e, :reason, :crit, :by, :now)"),
        {"id": freeze.id, "team": team, "s": db_time(starts_at), "e": db_time(ends_at),
         "reason": freeze.reason, "crit": critical_only, "by": actor, "now": db_time(now)})
    events.record(conn, now, "team", team, "freeze.set", actor, freeze.reason,
                  data={"team": team, "freeze": freeze.id, "before": None,
                        "after": _freeze_summary(freeze)})
    return freeze


def get_freeze(conn: Connection, freeze_id: str) -> Freeze:
    row = conn.execute(text("SELECT * FROM freezes WHERE id = :id"),
                       {"id": freeze_id}).mappings().first()
    if row is None:
        raise NotFoundError("freeze", freeze_id,
                            [f.id for f in list_freezes(conn)][:20])
    return _freeze(row)


def lift_freeze(conn: Connection, freeze_id: str, actor: str, now: datetime) -> Freeze:
    freeze = get_freeze(conn, freeze_id)
    if not freeze.active(now) and freeze.state(now) != "scheduled":
        raise ConflictError(f"freeze {freeze_id} of team {freeze.team} is already "
                            f"{freeze.state(now)}")
    conn.execute(text("UPDATE freezes SET lifted_at = :now, lifted_by = :by WHERE id = :id"),
                 {"now": db_time(now), "by": actor, "id": freeze_id})
    events.record(conn, now, "team", freeze.team, "freeze.lifted", actor,
                  data={"team": freeze.team, "freeze": freeze_id,
                        "before": _freeze_summary(freeze), "after": None})
    return get_freeze(conn, freeze_id)


def list_freezes(conn: Connection, team: str | None = None) -> list[Freeze]:
    sql, params = "SELECT * FROM freezes", {}
    if team is not None:
        sql, params = sql + " WHERE team = :t", {"t": team}
    return [_freeze(r) for r in conn.execute(text(sql + " ORDER BY starts_at, id"),
                                             params).mappings()]


def record_ended(conn: Connection, now: datetime) -> list[Freeze]:
    """Record ``freeze.ended`` (at its end, by ``schedule``) for each freeze whose window
    closed by itself since; returns them. Runs inside every freeze check of a write."""
    ended = [f for f in list_freezes(conn)
             if f.lifted_at is None and f.ends_at <= now]
    for f in ended:
        conn.execute(text("UPDATE freezes SET lifted_at = :e, lifted_by = 'schedule' "
                          "WHERE id = :id AND lifted_at IS NULL"),
                     {"e": db_time(f.ends_at), "id": f.id})
        events.record(conn, f.ends_at, "team", f.team, "freeze.ended", "schedule",
                      data={"team": f.team, "freeze": f.id, "before": _freeze_summary(f),
                            "after": None})
    return ended


def active_freeze(conn: Connection, team: str, now: datetime) -> Freeze | None:
    for f in list_freezes(conn, team):
        if f.active(now):
            return f
    return None


def check_not_frozen(conn: Connection, teams: Sequence[str], now: datetime, what: str) -> None:
    """Raise :class:`FrozenError` when one of ``teams`` is frozen at ``now``."""
    record_ended(conn, now)
    for team in teams:
        freeze = active_freeze(conn, team, now)
        if freeze is not None:
            raise FrozenError(freeze, what)


def critical_only_freezes(conn: Connection, now: datetime) -> dict[str, Freeze]:
    """Team -> its active critical-only freeze: only its critical work starts."""
    return {f.team: f for f in list_freezes(conn) if f.critical_only and f.active(now)}


# -- templates -------------------------------------------------------------------------


@dataclass(frozen=True)
class Template:
    name: str
    version: int
    team: str
    fields: Mapping[str, Any]
    created_by: str
    created_at: datetime
    comment: str | None = None
    restored_from: int | None = None
    approved_for: tuple[str, ...] = field(default=())


def _template(row: Mapping[str, Any]) -> Template:
    return Template(row["name"], int(row["version"]), row["team"], from_json(row["fields"]),
                    row["created_by"], py_time(row["created_at"]), row["comment"],
                    row["restored_from"])


def check_template_fields(fields: Mapping[str, Any], team: str) -> dict[str, Any]:
    """The fields, checked as a request of ``team`` would be (setup: a shell command)."""
    from gpu_pool.spec import parse_request

    if not isinstance(fields, Mapping):
        raise SpecError("fields", fields, "a mapping of request fields")
    unknown = sorted(set(fields) - set(TEMPLATE_FIELDS))
    if unknown:
        raise SpecError("fields", unknown[0], "one of " + ", ".join(TEMPLATE_FIELDS))
    setup = fields.get("setup")
    if setup is not None and (not isinstance(setup, str) or not setup.strip()
                              or len(setup) > 4000):
        raise SpecError("setup", setup, "a shell command run before the task's own, "
                        "1 to 4000 characters")
    parse_request({**{k: v for k, v in fields.items() if k != "setup"},
                   "name": "template-check", "team": team})
    return dict(fields)


def save_template(conn: Connection, name: str, team: str | None, fields: Mapping[str, Any],
                  actor: str, now: datetime, comment: str | None = None,
                  restored_from: int | None = None) -> Template:
    from gpu_pool.spec import parse_name

    name = parse_name(name, "template")
    current = latest_template(conn, name)
    if current is not None and team is not None and team != current.team:
        raise SpecError("team", team, f"{current.team}, the team that owns template {name}")
    owner = team or (current.team if current else None)
    if owner is None:
        raise SpecError("team", None, "the team that owns the new template")
    require_team(conn, owner)
    check_not_frozen(conn, [owner], now, f"changing template {name}")
    checked = check_template_fields(fields, owner)
    if current is not None and dict(current.fields) == checked and restored_from is None:
        return current
    version = (current.version + 1) if current else 1
    conn.execute(text(
        "INSERT INTO templates (name, version, team, fields, comment, restored_from, "
        "created_by, created_at) VALUES (:n, :v, :t, :f, :c, :r, :by, :now)"),
        {"n": name, "v": version, "t": owner, "f": to_json(checked), "c": comment,
         "r": restored_from, "by": actor, "now": db_time(now)})
    kind = "template.restored" if restored_from else ("template.created" if current is None
                                                      else "template.updated")
    events.record(conn, now, "template", name, kind, actor, comment,
                  data={"team": owner, "version": version, "restored_from": restored_from,
                        "before": dict(current.fields) if current else None,
                        "after": checked})
    return Template(name, version, owner, checked, actor, now, comment, restored_from)


def latest_template(conn: Connection, name: str) -> Template | None:
    row = conn.execute(text("SELECT * FROM templates WHERE name = :n ORDER BY version DESC"),
                       {"n": name}).mappings().first()
    return None if row is None else _template(row)


def get_template(conn: Connection, name: str, version: int | None = None) -> Template:
    if version is None:
        found = latest_template(conn, name)
    else:
        row = conn.execute(text("SELECT * FROM templates WHERE name = :n AND version = :v"),
                           {"n": name, "v": version}).mappings().first()
        found = None if row is None else _template(row)
    if found is None:
        known = [r[0] for r in conn.execute(text("SELECT DISTINCT name FROM templates"))]
        what = "template" if version is None else f"version {version} of template"
        raise NotFoundError(what, name, known if version is None else
                            [str(t.version) for t in template_history(conn, name)])
    approvals = tuple(r[0] for r in conn.execute(
        text("SELECT team FROM template_approvals WHERE template = :n ORDER BY team"),
        {"n": name}))
    return Template(found.name, found.version, found.team, found.fields, found.created_by,
                    found.created_at, found.comment, found.restored_from, approvals)


def template_history(conn: Connection, name: str) -> list[Template]:
    rows = conn.execute(text("SELECT * FROM templates WHERE name = :n ORDER BY version"),
                        {"n": name}).mappings()
    return [_template(r) for r in rows]


def list_templates(conn: Connection) -> list[Template]:
    rows = conn.execute(text(
        "SELECT t.* FROM templates t WHERE t.version = (SELECT MAX(version) FROM templates u "
        "WHERE u.name = t.name) ORDER BY t.name")).mappings()
    return [get_template(conn, r["name"]) for r in rows]


def restore_template(conn: Connection, name: str, version: int, actor: str, now: datetime,
                     comment: str | None = None) -> Template:
    old = get_template(conn, name, version)
    return save_template(conn, name, old.team, old.fields, actor, now,
                         comment or f"restored version {version}", restored_from=version)


def approve_template(conn: Connection, name: str, team: str, actor: str, now: datetime) -> bool:
    """Record ``team``'s approval to use template ``name``; False when it already had one."""
    template = get_template(conn, name)
    require_team(conn, team)
    if team == template.team:
        raise SpecError("team", team, f"another team than {template.team}, which owns "
                        f"{name} and needs no approval")
    if team in template.approved_for:
        return False
    conn.execute(text("INSERT INTO template_approvals (template, team, approved_by, approved_at)"
                      " VALUES (:n, :t, :by, :now)"),
                 {"n": name, "t": team, "by": actor, "now": db_time(now)})
    events.record(conn, now, "template", name, "template.approved", actor,
                  data={"team": template.team, "for_team": team, "before": None,
                        "after": {"approved_for": team}})
    return True


def template_for(conn: Connection, name: str, team: str) -> Template:
    """The template ``team`` may use: its own, or another team's it was approved for."""
    template = get_template(conn, name)
    if team != template.team and team not in template.approved_for:
        raise SpecError("template", name, f"a template of team {team}, or one a lead of "
                        f"{template.team} approved for it (`gpu-pool template approve {name} "
                        f"--team {team}`)")
    return template
