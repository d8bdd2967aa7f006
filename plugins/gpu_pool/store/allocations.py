"""Allocations: a request's hold on the GPUs, CPU and RAM of one node — and their end.

Terms
-----
allocation
    One row of ``allocations`` per node a placed request holds (a gang has several), with
    one ``allocation_gpus`` row per GPU index and the milli taken on it.
end
    An active allocation becomes released, preempted or expired; its GPU rows go inactive
    (the guard triggers give the milli back) and exactly one ledger entry is appended.

Invariants: :func:`create_allocation` and :func:`end_allocation` are the only writers of
allocation state, each writing its ``allocation.*`` event in the caller's transaction;
:func:`end_allocation` is guarded on ``state = 'active'`` so a second end (a retry, a race
with another scheduler) changes nothing and writes no second ledger entry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

from sqlalchemy import Connection, text

from gpu_pool.model import Allocation, AllocationState, LedgerEntry, Outcome
from gpu_pool.store import events
from gpu_pool.store.codec import (
    allocation_from_row,
    allocation_params,
    db_time,
    new_id,
    py_time,
    to_json,
)


def _with_gpus(conn: Connection, where: str, params: Mapping[str, object]) -> list[Allocation]:
    rows = conn.execute(text(f"SELECT * FROM allocations WHERE {where} "
                             "ORDER BY started_at, request_name, node"), params).mappings().all()
    if not rows:
        return []
    indices: dict[str, list[int]] = {r["id"]: [] for r in rows}
    gpu_rows = conn.execute(text(
        "SELECT allocation_id, gpu_index FROM allocation_gpus WHERE allocation_id IN "
        f"(SELECT id FROM allocations WHERE {where})"), params)
    for allocation_id, gpu_index in gpu_rows:
        if allocation_id in indices:  # a row committed between the two reads: skip it
            indices[allocation_id].append(gpu_index)
    return [allocation_from_row(r, indices[r["id"]]) for r in rows]


def active_allocations(conn: Connection) -> list[Allocation]:
    return _with_gpus(conn, "state = 'active'", {})


def preemption_counts(conn: Connection) -> dict[str, int]:
    """Per request name, how many times it was preempted (its preempted tries: a gang's
    allocations of one try share their start)."""
    rows = conn.execute(text(
        "SELECT request_name, COUNT(DISTINCT started_at) FROM allocations "
        "WHERE state = 'preempted' GROUP BY request_name"))
    return {name: int(count) for name, count in rows}


def allocations_of(conn: Connection, request_name: str) -> list[Allocation]:
    """Every allocation a request ever had (any state), oldest first."""
    return _with_gpus(conn, "request_name = :name", {"name": request_name})


def active_allocations_of_request(conn: Connection, request_id: str) -> list[Allocation]:
    return _with_gpus(conn, "request_id = :rid AND state = 'active'", {"rid": request_id})


def create_allocation(conn: Connection, allocation: Allocation, actor: str,
                      reason: str | None = None) -> Allocation:
    """Insert an active allocation and its GPU rows (the triggers refuse any overlap)."""
    allocation_id = allocation.id or new_id()
    conn.execute(text(
        "INSERT INTO allocations (id, request_id, request_name, node, gpu_milli, cpu_milli, "
        "memory_mib, team, purpose, priority, gpu_model, preemptible, state, started_at, "
        "ends_by, borrowed_from, off_peak, grace_s, transfer_s, expected_wait_saved_s) "
        "VALUES (:id, :rid, :rname, :node, :milli, :cpu, :mem, :team, :purpose, :priority, "
        ":model, :preemptible, 'active', :started, :ends_by, :borrowed_from, :off_peak, "
        ":grace_s, :transfer_s, :saved_s)"), allocation_params(allocation, allocation_id))
    for index in sorted(allocation.gpu_indices):  # a fixed order within one allocation
        conn.execute(text("INSERT INTO allocation_gpus (allocation_id, node, gpu_index, milli, "
                          "active) VALUES (:id, :node, :idx, :milli, :active)"),
                     {"id": allocation_id, "node": allocation.node, "idx": index,
                      "milli": allocation.gpu_milli, "active": True})
    events.record(conn, allocation.started_at, "allocation", allocation_id, "allocation.created",
                  actor, reason, {"request": allocation.request_name, "node": allocation.node,
                                  "gpus": list(allocation.gpu_indices),
                                  "gpu_milli": allocation.gpu_milli})
    return Allocation(**{**allocation.__dict__, "id": allocation_id,
                         "state": AllocationState.ACTIVE})


def state_for(outcome: Outcome) -> AllocationState:
    """The state an allocation ends in for a task outcome."""
    if outcome is Outcome.PREEMPTED:
        return AllocationState.PREEMPTED
    if outcome is Outcome.TIMED_OUT:
        return AllocationState.EXPIRED
    return AllocationState.RELEASED


def end_allocation(conn: Connection, allocation: Allocation, outcome: Outcome, actor: str,
                   reason: str | None, now: datetime, price_per_gpu_hour: float,
                   metrics: Mapping[str, float] | None = None) -> LedgerEntry | None:
    """End an active allocation and append its ledger entry; None if it was not active."""
    state = state_for(outcome)
    ended = conn.execute(text("UPDATE allocations SET state = :s, ended_at = :now, end_reason = "
                              ":reason WHERE id = :id AND state = 'active'"),
                         {"s": str(state), "now": db_time(now), "reason": reason,
                          "id": allocation.id})
    if ended.rowcount != 1:
        return None
    conn.execute(text("UPDATE allocation_gpus SET active = :off WHERE allocation_id = :id "
                      "AND active = :on"), {"id": allocation.id, "off": False, "on": True})
    entry = LedgerEntry(
        allocation_id=allocation.id, request_name=allocation.request_name, team=allocation.team,
        purpose=allocation.purpose, node=allocation.node, gpu_model=allocation.gpu_model,
        gpus=allocation.gpu_milli_total / 1000.0, started_at=allocation.started_at,
        ended_at=max(now, allocation.started_at), outcome=outcome,
        price_per_gpu_hour=price_per_gpu_hour, metrics=dict(metrics or {}),
        borrowed_from=allocation.borrowed_from, off_peak=allocation.off_peak,
        transfer_s=allocation.transfer_s,
        expected_wait_saved_s=allocation.expected_wait_saved_s,
    )
    conn.execute(text(
        "INSERT INTO ledger (allocation_id, request_name, team, purpose, node, gpu_model, gpus, "
        "started_at, ended_at, gpu_hours, price_per_gpu_hour, cost, outcome, metrics, "
        "recorded_at, borrowed_from, off_peak, transfer_s, expected_wait_saved_s) VALUES "
        "(:aid, :rname, :team, :purpose, :node, :model, :gpus, :started, :ended, :hours, "
        ":price, :cost, :outcome, :metrics, :now, :borrowed_from, :off_peak, :transfer_s, "
        ":saved_s)"),
        {"aid": entry.allocation_id, "rname": entry.request_name, "team": entry.team,
         "purpose": str(entry.purpose), "node": entry.node, "model": entry.gpu_model,
         "gpus": entry.gpus, "started": db_time(entry.started_at),
         "ended": db_time(entry.ended_at), "hours": entry.gpu_hours,
         "price": entry.price_per_gpu_hour, "cost": entry.cost, "outcome": str(outcome),
         "metrics": to_json(dict(entry.metrics)), "now": db_time(now),
         "borrowed_from": entry.borrowed_from, "off_peak": bool(entry.off_peak),
         "transfer_s": float(entry.transfer_s), "saved_s": float(entry.expected_wait_saved_s)})
    events.record(conn, now, "allocation", allocation.id, f"allocation.{state}", actor, reason,
                  {"request": allocation.request_name, "outcome": str(outcome),
                   "gpu_hours": round(entry.gpu_hours, 6)})
    return entry


def held_on_node(conn: Connection, node: str) -> tuple[int, int]:
    """(cpu_milli, memory_mib) held on ``node`` by active allocations."""
    row = conn.execute(text("SELECT COALESCE(SUM(cpu_milli), 0), COALESCE(SUM(memory_mib), 0) "
                            "FROM allocations WHERE node = :n AND state = 'active'"),
                       {"n": node}).one()
    return int(row[0]), int(row[1])


def gpu_milli_held(conn: Connection, node: str, indices: Sequence[int]) -> dict[int, int]:
    rows = conn.execute(text("SELECT idx, allocated_milli FROM gpus WHERE node = :n"),
                        {"n": node}).all()
    wanted = set(indices)
    return {idx: milli for idx, milli in rows if idx in wanted}


def runtime_ratios(conn: Connection, limit: int = 500) -> tuple[float, ...]:
    """Run time / time limit of the last ``limit`` allocations that ended on their own
    (released: not preempted, not expired) and had a limit: what the start estimates
    expect of running work (:mod:`gpu_pool.engine.estimate`)."""
    rows = conn.execute(text(
        "SELECT started_at, ends_by, ended_at FROM allocations WHERE state = 'released' "
        "AND ends_by IS NOT NULL AND ended_at IS NOT NULL ORDER BY ended_at DESC, id "
        "LIMIT :k"), {"k": limit}).all()
    out = []
    for started, ends_by, ended in rows:
        start = py_time(started)
        span = (py_time(ends_by) - start).total_seconds()
        if span > 0:
            out.append(min(max((py_time(ended) - start).total_seconds() / span, 0.0), 1.0))
    return tuple(out)
