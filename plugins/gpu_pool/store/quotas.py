"""Quotas in the store, and their usage derived from active allocations.

Terms
-----
scope
    A quota's (team, purpose, GPU model or any). One quota per scope: setting a quota for a
    scope that has one updates it (renew, extend, grow, shrink) and keeps its id.
usage
    GPUs held now by active allocations charged to a quota: same team and purpose, and the
    allocation's GPU model equals the quota's (or the quota is for any model). One
    allocation can count against a model quota and an any-model quota of its team alike.
    Borrowed allocations (``borrowed_from`` set) run beyond the guarantee and do not count.

Invariants: usage is computed from ``allocations`` each time it is asked for — there is no
stored counter that could drift; every set writes a ``quota.set`` event in its transaction.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from gpu_pool.model import Quota
from gpu_pool.store import events, governance
from gpu_pool.store.allocations import active_allocations
from gpu_pool.store.checks import check_quota
from gpu_pool.store.codec import new_id, quota_from_row, quota_params
from gpu_pool.store.fleet import require_team


def set_quota(conn: Connection, quota: Quota, actor: str, now: datetime) -> Quota:
    require_team(conn, quota.team)
    check_quota(quota)
    governance.check_not_frozen(conn, [quota.team], now, f"changing its quotas ({quota.purpose})")
    existing = _existing_row(conn, quota)
    if existing is None:
        quota_id = quota.id or new_id()
        conn.execute(text(
            "INSERT INTO quotas (id, team, purpose, gpu_model, gpus, borrow_limit_gpus, "
            "gpu_hour_budget, valid_from, expires_at, created_at, updated_at) VALUES (:id, "
            ":team, :purpose, :gpu_model, :gpus, :borrow, :budget, :valid_from, :expires_at, "
            ":now, :now)"), quota_params(quota, quota_id, now))
        kind, before = "quota.created", None
    else:
        quota_id = existing["id"]
        conn.execute(text(
            "UPDATE quotas SET team = :team, purpose = :purpose, gpu_model = :gpu_model, "
            "gpus = :gpus, borrow_limit_gpus = :borrow, gpu_hour_budget = :budget, valid_from = "
            ":valid_from, expires_at = :expires_at, updated_at = :now WHERE id = :id"),
            quota_params(quota, quota_id, now))
        kind, before = "quota.updated", _summary(quota_from_row(existing))
    saved = quota_from_row(conn.execute(text("SELECT * FROM quotas WHERE id = :id"),
                                        {"id": quota_id}).mappings().one())
    events.record(conn, now, "quota", quota_id, kind, actor,
                  data={"before": before, "after": _summary(saved)})
    return saved


def _existing_row(conn: Connection, quota: Quota) -> Any:
    """The stored quota ``quota`` would replace: same id, else same team, purpose, model."""
    existing = None
    if quota.id is not None:
        existing = conn.execute(text("SELECT * FROM quotas WHERE id = :id"),
                                {"id": quota.id}).mappings().first()
    if existing is None:
        existing = conn.execute(
            text("SELECT * FROM quotas WHERE team = :t AND purpose = :p AND "
                 "COALESCE(gpu_model, '') = :m"),
            {"t": quota.team, "p": str(quota.purpose), "m": quota.gpu_model or ""},
        ).mappings().first()
    return existing


def replaced_quota(conn: Connection, quota: Quota) -> Quota | None:
    """The stored quota that setting ``quota`` would replace, if any."""
    row = _existing_row(conn, quota)
    return None if row is None else quota_from_row(row)


def _summary(q: Quota) -> dict[str, object]:
    return {"team": q.team, "purpose": str(q.purpose), "gpu_model": q.gpu_model, "gpus": q.gpus,
            "borrow_limit_gpus": q.borrow_limit_gpus, "gpu_hour_budget": q.gpu_hour_budget,
            "valid_from": q.valid_from.isoformat(), "expires_at": q.expires_at.isoformat()}


def list_quotas(conn: Connection) -> list[Quota]:
    rows = conn.execute(text("SELECT * FROM quotas ORDER BY team, purpose, "
                             "COALESCE(gpu_model, ''), valid_from")).mappings()
    return [quota_from_row(r) for r in rows]


def quota_usage(conn: Connection, now: datetime) -> dict[str, float]:
    """GPUs in use per quota id, from the active allocations (``now`` kept for the API:
    usage is what is held at the moment of reading)."""
    del now
    held = active_allocations(conn)
    usage: dict[str, float] = {}
    for quota in list_quotas(conn):
        usage[quota.id] = sum(
            a.gpu_milli_total for a in held if a.borrowed_from is None
            and quota.matches(a.team, a.purpose, a.gpu_model)
        ) / 1000.0
    return usage
