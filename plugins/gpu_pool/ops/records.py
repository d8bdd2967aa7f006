"""The ops tables (``sql/020_ops.sql``): notices claimed, reclaim records, snapshot exports.

Invariants
----------
* A notice key (kind, subject, threshold, ref) is inserted at most once: the primary key
  refuses a second insert, so two concurrent or repeated runs cannot both send it. A run
  *claims* the key before sending, marks it ``sent`` after, and deletes the claim when
  every channel failed (so the next run retries). A crash between send and mark leaves the
  claim: at most once, never twice.
* Times are stored as ISO-8601 UTC text and read back as aware datetimes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError


def iso(when: datetime | None) -> str | None:
    return None if when is None else when.astimezone(UTC).isoformat()


def parse_iso(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value).astimezone(UTC)


@dataclass(frozen=True)
class NoticeKey:
    kind: str
    subject: str
    threshold: int
    ref: str


@dataclass(frozen=True)
class ReclaimRecord:
    """What the sweep did to (or found on) one allocation or GPU, and why."""

    at: datetime
    action: str  # released | idle_warned | idle_ended | foreign_process
    node: str
    reason: str
    actor: str
    request_name: str = ""
    team: str = ""
    gpu_indices: tuple[int, ...] = ()
    gpus: float = 0.0
    held_since: datetime | None = None
    held_seconds: float = 0.0
    idle_gpu_hours: float = 0.0
    id: str = ""


def engine_of(store: Any) -> Engine:
    """The SQLAlchemy engine behind a :class:`gpu_pool.store.Store`."""
    engine = getattr(store, "engine", None)
    if not isinstance(engine, Engine):
        raise TypeError(f"{type(store).__name__} exposes no SQLAlchemy engine as .engine")
    return engine


class OpsRecords:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # ------------------------------------------------------------------ notices
    def claim(self, key: NoticeKey, team: str, title: str, now: datetime,
              status: str = "sending") -> bool:
        """Insert the key; False when it was already there (sent, covered or being sent)."""
        try:
            with self.engine.begin() as conn:
                conn.execute(text(
                    "INSERT INTO ops_notifications (kind, subject, threshold, ref, team, status,"
                    " title, claimed_at) VALUES (:kind, :subject, :threshold, :ref, :team,"
                    " :status, :title, :now)"),
                    {**key.__dict__, "team": team, "status": status, "title": title,
                     "now": iso(now)})
        except IntegrityError:
            return False
        return True

    def mark_sent(self, key: NoticeKey, channels: tuple[str, ...], now: datetime) -> None:
        with self.engine.begin() as conn:
            conn.execute(text(
                "UPDATE ops_notifications SET status = 'sent', channels = :channels,"
                " sent_at = :now WHERE kind = :kind AND subject = :subject"
                " AND threshold = :threshold AND ref = :ref"),
                {**key.__dict__, "channels": ",".join(channels), "now": iso(now)})

    def unclaim(self, key: NoticeKey) -> None:
        with self.engine.begin() as conn:
            conn.execute(text(
                "DELETE FROM ops_notifications WHERE kind = :kind AND subject = :subject"
                " AND threshold = :threshold AND ref = :ref AND status = 'sending'"),
                key.__dict__)

    def notices(self, kind: str | None = None) -> list[dict[str, Any]]:
        sql = "SELECT * FROM ops_notifications"
        params: dict[str, Any] = {}
        if kind:
            sql += " WHERE kind = :kind"
            params["kind"] = kind
        with self.engine.connect() as conn:
            rows = conn.execute(text(sql + " ORDER BY claimed_at, kind, subject, threshold"),
                                params).mappings().all()
        return [dict(r) for r in rows]

    # ------------------------------------------------------------------ reclaims
    def add_reclaim(self, record: ReclaimRecord) -> ReclaimRecord:
        rid = record.id or uuid.uuid4().hex
        with self.engine.begin() as conn:
            conn.execute(text(
                "INSERT INTO ops_reclaims (id, at, action, request_name, team, node,"
                " gpu_indices, gpus, held_since, held_seconds, idle_gpu_hours, reason, actor)"
                " VALUES (:id, :at, :action, :request_name, :team, :node, :gpu_indices, :gpus,"
                " :held_since, :held_seconds, :idle_gpu_hours, :reason, :actor)"),
                {"id": rid, "at": iso(record.at), "action": record.action,
                 "request_name": record.request_name, "team": record.team, "node": record.node,
                 "gpu_indices": ",".join(map(str, record.gpu_indices)), "gpus": record.gpus,
                 "held_since": iso(record.held_since), "held_seconds": record.held_seconds,
                 "idle_gpu_hours": record.idle_gpu_hours, "reason": record.reason,
                 "actor": record.actor})
        return ReclaimRecord(**{**record.__dict__, "id": rid})

    def reclaims(self, since: datetime | None = None,
                 until: datetime | None = None) -> list[ReclaimRecord]:
        sql, params = "SELECT * FROM ops_reclaims WHERE 1 = 1", {}
        if since is not None:
            sql += " AND at >= :since"
            params["since"] = iso(since)
        if until is not None:
            sql += " AND at < :until"
            params["until"] = iso(until)
        with self.engine.connect() as conn:
            rows = conn.execute(text(sql + " ORDER BY at, id"), params).mappings().all()
        return [ReclaimRecord(
            id=r["id"], at=parse_iso(r["at"]), action=r["action"], node=r["node"],
            reason=r["reason"], actor=r["actor"], request_name=r["request_name"],
            team=r["team"],
            gpu_indices=tuple(int(i) for i in r["gpu_indices"].split(",") if i),
            gpus=float(r["gpus"]), held_since=parse_iso(r["held_since"]),
            held_seconds=float(r["held_seconds"]), idle_gpu_hours=float(r["idle_gpu_hours"]),
        ) for r in rows]

    # ------------------------------------------------------------------ exports
    def record_export(self, dataset: str, period: str, keys: list[str], rows: int,
                      now: datetime) -> None:
        """Upsert the export of one period (a rerun replaces its row, as it does the objects)."""
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM ops_exports WHERE dataset = :d AND period = :p"),
                         {"d": dataset, "p": period})
            conn.execute(text(
                "INSERT INTO ops_exports (dataset, period, exported_at, object_keys, row_count)"
                " VALUES (:d, :p, :now, :keys, :rows)"),
                {"d": dataset, "p": period, "now": iso(now), "keys": "\n".join(keys),
                 "rows": rows})

    def last_export(self, dataset: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(text("SELECT MAX(period) FROM ops_exports WHERE dataset = :d"),
                                {"d": dataset}).scalar()

    def last_exported_at(self, dataset: str) -> datetime | None:
        """When the latest export of ``dataset`` was written (None before the first)."""
        with self.engine.connect() as conn:
            value = conn.execute(text("SELECT MAX(exported_at) FROM ops_exports"
                                      " WHERE dataset = :d"), {"d": dataset}).scalar()
        return parse_iso(value) if isinstance(value, str) else value

    def exports(self, dataset: str) -> list[dict[str, Any]]:
        with self.engine.connect() as conn:
            rows = conn.execute(text("SELECT * FROM ops_exports WHERE dataset = :d"
                                     " ORDER BY period"), {"d": dataset}).mappings().all()
        return [dict(r) for r in rows]
