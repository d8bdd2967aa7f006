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
    return [Event(at=py_time(r["at"]), subject_kind=r["subject_kind"], subject=r["subject"],
                  kind=r["kind"], actor=r["actor"], reason=r["reason"],
                  data=from_json(r["data"])) for r in reversed(rows)]
