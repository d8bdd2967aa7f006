"""Read queries the REST API needs and :class:`gpu_pool.store.Store` does not offer.

They read the schema of ``sql/001_store.sql`` (column names as written there) with
SQLAlchemy Core and never write. Times go through the store's codec (naive UTC text on
SQLite, TIMESTAMP on PostgreSQL) and come back timezone-aware.

Terms
-----
request row
    A ``requests`` row as a mapping, including the persisted ``reason_code`` /
    ``reason_message`` of the last placement cycle and the Airflow task instance fields
    (``dag_id``, ``task_id``, ``run_id``, ``map_index``, ``try_number``).
allocation window
    An allocation's [started_at, ended_at) with ``ended_at`` None while it is active, and the
    GPU milli it held in total: what the usage charts integrate over time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Engine, bindparam, text

from gpu_pool.store.codec import db_time, py_time


@dataclass(frozen=True)
class AllocationWindow:
    team: str
    started_at: datetime
    ended_at: datetime | None
    gpu_milli: int


@dataclass(frozen=True)
class CrossZoneMove:
    request: str
    team: str
    dataset: str | None
    from_zone: str
    to_zone: str
    size_gib: float
    bandwidth_mb_s: float
    started_at: datetime


def request_rows(engine: Engine, *, state: str | None = None,
                 names: Sequence[str] | None = None) -> list[dict[str, Any]]:
    """Requests (all, of one ``state``, or the named ones), oldest submission first."""
    where, params = [], {}
    if state is not None:
        where.append("state = :state")
        params["state"] = state
    if names is not None:
        if not names:
            return []
        where.append("name IN :names")
        params["names"] = list(names)
    sql = "SELECT * FROM requests" + (" WHERE " + " AND ".join(where) if where else "")
    stmt = text(sql + " ORDER BY submitted_at, created_at, name")
    if names is not None:
        stmt = stmt.bindparams(bindparam("names", expanding=True))
    with engine.connect() as conn:
        return [_plain(r) for r in conn.execute(stmt, params).mappings()]


def request_by_task(engine: Engine, dag_id: str, task_id: str, run_id: str | None,
                    map_index: int | None) -> dict[str, Any] | None:
    """The newest request of an Airflow task instance (any try), or None."""
    where = ["dag_id = :dag_id", "task_id = :task_id"]
    params: dict[str, Any] = {"dag_id": dag_id, "task_id": task_id}
    if run_id is not None:
        where.append("run_id = :run_id")
        params["run_id"] = run_id
    if map_index is not None:
        where.append("COALESCE(map_index, -1) = :map_index")
        params["map_index"] = map_index
    sql = text("SELECT * FROM requests WHERE " + " AND ".join(where)
               + " ORDER BY submitted_at DESC, created_at DESC LIMIT 1")
    with engine.connect() as conn:
        row = conn.execute(sql, params).mappings().first()
    return None if row is None else _plain(row)


def node_state_reasons(engine: Engine) -> dict[str, str | None]:
    with engine.connect() as conn:
        return {name: reason for name, reason in
                conn.execute(text("SELECT name, state_reason FROM nodes"))}


def allocation_windows(engine: Engine, since: datetime, until: datetime) -> list[AllocationWindow]:
    """Allocations that overlap [since, until), with the GPU milli each held."""
    sql = text(
        "SELECT a.team, a.started_at, a.ended_at, COALESCE(SUM(g.milli), 0) AS milli "
        "FROM allocations a LEFT JOIN allocation_gpus g ON g.allocation_id = a.id "
        "WHERE a.started_at < :until AND (a.ended_at IS NULL OR a.ended_at > :since) "
        "GROUP BY a.id, a.team, a.started_at, a.ended_at")
    with engine.connect() as conn:
        rows = conn.execute(sql, {"since": db_time(since), "until": db_time(until)}).all()
    return [AllocationWindow(team, py_time(start), py_time(end), int(milli))
            for team, start, end, milli in rows]


def cross_zone_moves(engine: Engine, since: datetime) -> list[CrossZoneMove]:
    """Allocations started since ``since`` on a node outside their dataset's zone."""
    sql = text(
        "SELECT r.name, r.team, r.dataset_uri, r.dataset_zone, n.zone, r.dataset_size_gib, "
        "n.bandwidth_mb_s, MIN(a.started_at) AS started_at "
        "FROM allocations a JOIN requests r ON r.id = a.request_id "
        "JOIN nodes n ON n.name = a.node "
        "WHERE a.started_at >= :since AND r.dataset_zone IS NOT NULL "
        "AND r.dataset_zone <> n.zone "
        "GROUP BY r.name, r.team, r.dataset_uri, r.dataset_zone, n.zone, r.dataset_size_gib, "
        "n.bandwidth_mb_s ORDER BY started_at")
    with engine.connect() as conn:
        rows = conn.execute(sql, {"since": db_time(since)}).all()
    return [CrossZoneMove(name, team, uri, src, dst, float(size or 0.0), float(bw or 0.0),
                          py_time(start))
            for name, team, uri, src, dst, size, bw, start, in rows]


def _plain(row: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for key in ("submitted_at", "created_at", "updated_at", "finished_at"):
        if key in out:
            out[key] = py_time(out[key])
    return out
