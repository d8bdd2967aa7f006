"""Reading the ledger, and the price an allocation is charged at.

Terms
-----
ledger entry
    Written once when an allocation ends (:func:`gpu_pool.store.allocations.end_allocation`):
    GPUs = GPU indices × milli / 1000, GPU-hours = GPUs × hours held, cost = GPU-hours ×
    the model's price per GPU-hour from the policy in force at release.

Invariant: the ledger is append-only — the database refuses UPDATE and DELETE on it — and
holds at most one entry per allocation (its primary key), so replays are idempotent.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, text

from gpu_pool.model import LedgerEntry, Policy
from gpu_pool.store.codec import db_time, ledger_from_row


def price_of(policy: Policy, gpu_model: str | None) -> float:
    info = policy.model_info(gpu_model) if gpu_model else None
    return info.price_per_gpu_hour if info else 0.0


def read(conn: Connection, since: datetime | None = None,
         until: datetime | None = None) -> list[LedgerEntry]:
    """Entries whose allocation ended in [since, until), in order of their end."""
    where, params = [], {}
    if since is not None:
        where.append("ended_at >= :since")
        params["since"] = db_time(since)
    if until is not None:
        where.append("ended_at < :until")
        params["until"] = db_time(until)
    sql = "SELECT * FROM ledger" + (" WHERE " + " AND ".join(where) if where else "")
    rows = conn.execute(text(sql + " ORDER BY ended_at, allocation_id"), params).mappings()
    return [ledger_from_row(r) for r in rows]
