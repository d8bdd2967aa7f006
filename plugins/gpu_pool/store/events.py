"""The event log: one row per state change of a request, allocation, node, GPU, quota or team.

Terms
-----
subject
    What changed: ``subject_kind`` (request, allocation, node, gpu, quota, team) and its
    name or id (``subject``; a GPU is ``node/index``).
kind
    What happened, dotted: ``request.submitted``, ``request.placed``, ``request.finished``,
    ``allocation.created``, ``allocation.released``, ``node.state``, ``quota.set`` ...

Invariant: :func:`record` is only ever called inside the transaction that makes the change
it records, by the one function that owns that change; so an event exists if and only if
its change was committed. Rows are never updated; their integer id is the commit order
within one writer and is what :func:`read` orders by.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from gpu_pool.store.codec import db_time, from_json, py_time, to_json


@dataclass(frozen=True)
class Event:
    at: datetime
    subject_kind: str
    subject: str
    kind: str
    actor: str
    reason: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)


def record(conn: Connection, at: datetime, subject_kind: str, subject: str, kind: str,
           actor: str, reason: str | None = None, data: Mapping[str, Any] | None = None) -> None:
    conn.execute(
        text("INSERT INTO events (at, subject_kind, subject, kind, actor, reason, data) "
             "VALUES (:at, :sk, :s, :k, :actor, :reason, :data)"),
        {"at": db_time(at), "sk": subject_kind, "s": subject, "k": kind, "actor": actor,
         "reason": reason, "data": to_json(dict(data or {}))},
    )


def read(conn: Connection, since: datetime | None = None, subject: str | None = None,
         limit: int | None = None) -> list[Event]:
    """Events oldest first; with ``limit``, the most recent ``limit`` of them."""
    where, params = [], {}
    if since is not None:
        where.append("at >= :since")
        params["since"] = db_time(since)
    if subject is not None:
        where.append("subject = :subject")
        params["subject"] = subject
    sql = "SELECT * FROM events" + (" WHERE " + " AND ".join(where) if where else "")
    sql += " ORDER BY id DESC"
    if limit is not None:
        sql += " LIMIT :limit"
        params["limit"] = int(limit)
    rows = conn.execute(text(sql), params).mappings().all()
    return [_event(r) for r in reversed(rows)]


def _event(r: Mapping[str, Any]) -> Event:
    return Event(at=py_time(r["at"]), subject_kind=r["subject_kind"], subject=r["subject"],
                 kind=r["kind"], actor=r["actor"], reason=r["reason"], data=from_json(r["data"]))


# The changes an audit lists: everything but the placement traffic (requests, allocations,
# GPU health readings), which `gpu-pool why` and the ledger tell.
AUDIT_KINDS = ("quota", "team", "node", "template", "freeze", "policy", "lending")


def audit(conn: Connection, *, team: str | None = None, kind: str | None = None,
          actor: str | None = None, since: datetime | None = None,
          until: datetime | None = None, limit: int | None = None) -> list[Event]:
    """Change events oldest first. ``kind``: a family (``quota``) or one kind
    (``quota.updated``); ``team``: events about the team or carrying it (a quota, a
    template, a freeze, a member); with ``limit``, the most recent ``limit`` of them."""
    families = AUDIT_KINDS
    if kind is not None:
        family = kind.split(".", 1)[0]
        if family not in AUDIT_KINDS:
            from gpu_pool.errors import SpecError

            raise SpecError("kind", kind, "one of " + ", ".join(AUDIT_KINDS)
                            + " (a family), or one kind of them such as quota.updated")
        families = (family,)
    where = ["(" + " OR ".join(f"kind LIKE :f{i}" for i in range(len(families))) + ")"]
    params: dict[str, Any] = {f"f{i}": f"{f}.%" for i, f in enumerate(families)}
    if kind is not None and "." in kind:
        where.append("kind = :kind")
        params["kind"] = kind
    if actor is not None:
        where.append("actor = :actor")
        params["actor"] = actor
    if since is not None:
        where.append("at >= :since")
        params["since"] = db_time(since)
    if until is not None:
        where.append("at < :until")
        params["until"] = db_time(until)
    rows = conn.execute(text("SELECT * FROM events WHERE " + " AND ".join(where)
                             + " ORDER BY id"), params).mappings().all()
    found = [_event(r) for r in rows]
    if team is not None:
        found = [e for e in found if team in teams_of(e)]
    return found[-limit:] if limit else found


def teams_of(event: Event) -> set[str]:
    """The teams a change is about (its subject, or a team its data names)."""
    teams = {event.subject} if event.subject_kind == "team" else set()
    data = event.data or {}
    for source in (data, data.get("before") or {}, data.get("after") or {}):
        if isinstance(source, Mapping):
            teams.update(str(source[k]) for k in ("team", "for_team") if source.get(k))
            labels = source.get("labels")
            if isinstance(labels, Mapping) and labels.get("team"):  # a node of the team
                teams.add(str(labels["team"]))
    return teams
