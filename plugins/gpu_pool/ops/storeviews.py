"""Read-only views of store tables that the chores need and the Store API does not offer:
the Airflow task behind each request, the GPU utilisation samples, and per-allocation usage.

These read the schema of ``sql/001_store.sql`` (columns named there) and never write.
Times use the store's codec (naive UTC text on SQLite, TIMESTAMP on PostgreSQL).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import bindparam, text
from sqlalchemy.engine import Engine

from gpu_pool.ops.reclaim import GpuSample
from gpu_pool.store.codec import db_time, py_time


@dataclass(frozen=True)
class TaskLink:
    """The Airflow task instance try a request stands for (all None for CLI requests)."""

    request_name: str
    dag_id: str | None
    task_id: str | None
    run_id: str | None
    map_index: int | None
    try_number: int | None
    ti_id: str | None


def task_links(engine: Engine, names: Sequence[str]) -> dict[str, TaskLink]:
    if not names:
        return {}
    sql = text("SELECT name, dag_id, task_id, run_id, map_index, try_number, executor_key "
               "FROM requests WHERE name IN :names").bindparams(
        bindparam("names", expanding=True))
    with engine.connect() as conn:
        rows = conn.execute(sql, {"names": list(names)}).mappings().all()
    return {r["name"]: TaskLink(r["name"], r["dag_id"], r["task_id"], r["run_id"],
                                r["map_index"], r["try_number"], r["executor_key"])
            for r in rows}


def gpu_samples(engine: Engine, since: datetime, until: datetime) -> list[GpuSample]:
    sql = text("SELECT node, gpu_index, at, utilization_pct, memory_used_mib FROM gpu_samples "
               "WHERE at >= :since AND at <= :until ORDER BY node, gpu_index, at")
    with engine.connect() as conn:
        rows = conn.execute(sql, {"since": db_time(since), "until": db_time(until)}).all()
    return [GpuSample(node, int(idx), py_time(at), float(util) if util is not None else 0.0,
                      float(used) if used is not None else None)
            for node, idx, at, util, used in rows]


def held_usage(engine: Engine, allocation_id: str) -> dict[str, float]:
    """Mean utilisation and peak memory of an allocation's GPUs while it was held, from the
    probe's samples: the metrics the monthly report's right-sizing reads."""
    sql = text(
        "SELECT AVG(s.utilization_pct), MAX(s.memory_used_mib) FROM allocations a "
        "JOIN allocation_gpus g ON g.allocation_id = a.id "
        "JOIN gpu_samples s ON s.node = g.node AND s.gpu_index = g.gpu_index "
        "AND s.at >= a.started_at AND (a.ended_at IS NULL OR s.at <= a.ended_at) "
        "WHERE a.id = :id")
    with engine.connect() as conn:
        mean, peak = conn.execute(sql, {"id": allocation_id}).one()
    out: dict[str, float] = {}
    if mean is not None:
        out["gpu_util_mean_pct"] = round(float(mean), 3)
    if peak is not None:
        out["gpu_mem_peak_mib"] = float(peak)
    return out


def metrics_with_usage(engine: Engine, allocation_id: str, metrics_json: str) -> str:
    """A ledger entry's metrics, completed with held usage where the task did not say."""
    metrics = json.loads(metrics_json or "{}")
    for key, value in held_usage(engine, allocation_id).items():
        metrics.setdefault(key, value)
    return json.dumps(metrics, sort_keys=True)
