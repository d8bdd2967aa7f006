"""How domain values travel to and from SQL rows, the same way on both dialects.

Terms
-----
db time
    Naive UTC, written as text ``YYYY-MM-DD HH:MM:SS.ffffff`` (fixed width, so text order is
    time order on SQLite; PostgreSQL casts it to TIMESTAMP). Read back as aware UTC.
JSON column
    TEXT holding ``json.dumps`` output with sorted keys.

Invariant: every function here is pure; rows come in as SQLAlchemy ``Row`` mappings.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from gpu_pool.model import (
    Allocation,
    AllocationState,
    Dataset,
    Gpu,
    LedgerEntry,
    Node,
    NodeState,
    Outcome,
    PriorityClass,
    Purpose,
    Quota,
    Request,
    Team,
    Tier,
)


def new_id() -> str:
    return uuid.uuid4().hex


def db_time(when: datetime | None) -> str | None:
    """``when`` (aware; naive is taken as UTC) as db time text."""
    if when is None:
        return None
    if when.tzinfo is not None:
        when = when.astimezone(UTC).replace(tzinfo=None)
    return when.isoformat(sep=" ", timespec="microseconds")


def py_time(value: Any) -> datetime | None:
    """A db time (datetime from psycopg2, text from SQLite) as aware UTC."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def to_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def from_json(value: str | None) -> Any:
    return json.loads(value) if value else {}


def seconds(delta: timedelta | None) -> float | None:
    return None if delta is None else delta.total_seconds()


def duration(value: float | None) -> timedelta | None:
    return None if value is None else timedelta(seconds=value)


def team_from_row(r: Mapping[str, Any]) -> Team:
    return Team(name=r["name"], notify_email=r["notify_email"], notify_webhook=r["notify_webhook"])


def gpu_from_row(r: Mapping[str, Any]) -> Gpu:
    return Gpu(index=r["idx"], model=r["model"], memory_mib=r["memory_mib"],
               healthy=bool(r["healthy"]), utilization_pct=r["utilization_pct"])


def node_from_row(r: Mapping[str, Any], gpus: Sequence[Gpu]) -> Node:
    return Node(name=r["name"], gpus=tuple(sorted(gpus, key=lambda g: g.index)),
                cpu_milli=r["cpu_milli"], memory_mib=r["memory_mib"], zone=r["zone"],
                tier=Tier(r["tier"]), ssh_conn_id=r["ssh_conn_id"],
                bandwidth_mb_s=float(r["bandwidth_mb_s"]), labels=from_json(r["labels"]),
                state=NodeState(r["state"]))


def node_params(node: Node, now: datetime) -> dict[str, Any]:
    return {"name": node.name, "zone": node.zone, "tier": str(node.tier),
            "ssh_conn_id": node.ssh_conn_id, "cpu_milli": node.cpu_milli,
            "memory_mib": node.memory_mib, "bandwidth_mb_s": node.bandwidth_mb_s,
            "labels": to_json(dict(node.labels)), "state": str(node.state), "now": db_time(now)}


def quota_from_row(r: Mapping[str, Any]) -> Quota:
    return Quota(team=r["team"], purpose=Purpose(r["purpose"]), gpus=float(r["gpus"]),
                 valid_from=py_time(r["valid_from"]), expires_at=py_time(r["expires_at"]),
                 gpu_model=r["gpu_model"], borrow_limit_gpus=float(r["borrow_limit_gpus"]),
                 gpu_hour_budget=(None if r["gpu_hour_budget"] is None
                                  else float(r["gpu_hour_budget"])),
                 id=r["id"])


def quota_params(q: Quota, quota_id: str, now: datetime) -> dict[str, Any]:
    return {"id": quota_id, "team": q.team, "purpose": str(q.purpose), "gpu_model": q.gpu_model,
            "gpus": q.gpus, "borrow": q.borrow_limit_gpus, "budget": q.gpu_hour_budget,
            "valid_from": db_time(q.valid_from), "expires_at": db_time(q.expires_at),
            "now": db_time(now)}


def request_from_row(r: Mapping[str, Any]) -> Request:
    dataset = None
    if r["dataset_uri"] is not None:
        dataset = Dataset(uri=r["dataset_uri"], zone=r["dataset_zone"],
                          size_gib=float(r["dataset_size_gib"] or 0.0))
    return Request(
        name=r["name"], team=r["team"], purpose=Purpose(r["purpose"]),
        priority=PriorityClass(r["priority"]), gpus=r["gpus"], gpu_milli=r["gpu_milli"],
        nodes=r["nodes"], gpu_models=frozenset(json.loads(r["gpu_models"] or "[]")),
        min_gpu_memory_mib=r["min_gpu_memory_mib"], cpu_milli=r["cpu_milli"],
        memory_mib=r["memory_mib"], dataset=dataset, data_ready=bool(r["data_ready"]),
        time_limit=duration(r["time_limit_s"]),
        estimated_runtime=duration(r["estimated_runtime_s"]),
        preemptible=bool(r["preemptible"]), submitted_at=py_time(r["submitted_at"]), id=r["id"],
        grace=duration(r.get("grace_s")),
    )


def request_params(req: Request, request_id: str, submitted_at: datetime,
                   now: datetime) -> dict[str, Any]:
    ds = req.dataset
    return {
        "id": request_id, "name": req.name, "team": req.team, "purpose": str(req.purpose),
        "priority": str(req.priority), "gpus": req.gpus, "gpu_milli": req.gpu_milli,
        "nodes": req.nodes, "gpu_models": json.dumps(sorted(req.gpu_models)),
        "min_gpu_memory_mib": req.min_gpu_memory_mib, "cpu_milli": req.cpu_milli,
        "memory_mib": req.memory_mib, "dataset_uri": ds.uri if ds else None,
        "dataset_zone": ds.zone if ds else None, "dataset_size_gib": ds.size_gib if ds else None,
        "data_ready": bool(req.data_ready), "time_limit_s": seconds(req.time_limit),
        "estimated_runtime_s": seconds(req.estimated_runtime),
        "preemptible": bool(req.preemptible), "submitted_at": db_time(submitted_at),
        "grace_s": seconds(req.grace), "now": db_time(now),
    }


def allocation_from_row(r: Mapping[str, Any], gpu_indices: Sequence[int]) -> Allocation:
    return Allocation(
        request_name=r["request_name"], node=r["node"], gpu_indices=tuple(sorted(gpu_indices)),
        gpu_milli=r["gpu_milli"], cpu_milli=r["cpu_milli"], memory_mib=r["memory_mib"],
        team=r["team"], purpose=Purpose(r["purpose"]), priority=PriorityClass(r["priority"]),
        gpu_model=r["gpu_model"], started_at=py_time(r["started_at"]),
        ends_by=py_time(r["ends_by"]), preemptible=bool(r["preemptible"]),
        state=AllocationState(r["state"]), id=r["id"], request_id=r["request_id"],
        borrowed_from=r.get("borrowed_from"), off_peak=bool(r.get("off_peak") or False),
        grace=duration(r.get("grace_s")), transfer_s=float(r.get("transfer_s") or 0.0),
        expected_wait_saved_s=float(r.get("expected_wait_saved_s") or 0.0),
    )


def allocation_params(a: Allocation, allocation_id: str) -> dict[str, Any]:
    return {"id": allocation_id, "rid": a.request_id, "rname": a.request_name,
            "node": a.node, "milli": a.gpu_milli, "cpu": a.cpu_milli, "mem": a.memory_mib,
            "team": a.team, "purpose": str(a.purpose), "priority": str(a.priority),
            "model": a.gpu_model, "preemptible": bool(a.preemptible),
            "started": db_time(a.started_at), "ends_by": db_time(a.ends_by),
            "borrowed_from": a.borrowed_from, "off_peak": bool(a.off_peak),
            "grace_s": seconds(a.grace), "transfer_s": float(a.transfer_s),
            "saved_s": float(a.expected_wait_saved_s)}


def ledger_from_row(r: Mapping[str, Any]) -> LedgerEntry:
    return LedgerEntry(
        allocation_id=r["allocation_id"], request_name=r["request_name"], team=r["team"],
        purpose=Purpose(r["purpose"]), node=r["node"], gpu_model=r["gpu_model"],
        gpus=float(r["gpus"]), started_at=py_time(r["started_at"]),
        ended_at=py_time(r["ended_at"]), outcome=Outcome(r["outcome"]),
        price_per_gpu_hour=float(r["price_per_gpu_hour"]), metrics=from_json(r["metrics"]),
        borrowed_from=r.get("borrowed_from"), off_peak=bool(r.get("off_peak") or False),
        transfer_s=float(r.get("transfer_s") or 0.0),
        expected_wait_saved_s=float(r.get("expected_wait_saved_s") or 0.0),
    )
