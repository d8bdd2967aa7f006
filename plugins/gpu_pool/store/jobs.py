"""Remote jobs of running GPU tasks, and the stops a preemption asks for (an outbox).

Terms
-----
job
    One run of a task's command on one node (:class:`gpu_pool.remote.job.RemoteJob`): the
    operator records it here right after starting it (:func:`record_jobs`), with the node's
    SSH connection id and the task's own preemption grace, if it set one.
stop request
    ``stop_reason`` (``preempted``), ``stop_grace_s`` and ``stop_message`` on a job row,
    written by :func:`request_stop` in the transaction that ends the request's allocations
    PREEMPTED (:func:`gpu_pool.store.apply.preempt`). The executor sends the detached kill
    over SSH later, outside any transaction, and marks it sent (:func:`mark_stop_sent`).

Invariants
----------
* A preemption and the stop of its jobs commit together or not at all: a scheduler killed
  between the commit and the SSH kill leaves the stop pending in the store, and the next
  cycle of any executor sends it (:func:`stops_due`). A stop is sent at least once; the
  node-side kill is idempotent (the first reason written to ``killed`` stays).
* A job recorded after its request lost its allocations (preempted while the operator was
  starting it) is recorded with its stop already requested, so no job ever runs on GPUs its
  request no longer holds. On PostgreSQL :func:`record_jobs` locks the request row first, so
  it serialises with :func:`request_stop` (which updates that row's state).
* Nothing here runs a command; the SSH kill is the executor's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import Connection, bindparam, text

from gpu_pool.model import AllocationState
from gpu_pool.store.allocations import allocations_of
from gpu_pool.store.codec import db_time

STOP_PREEMPTED = "preempted"


@dataclass(frozen=True)
class JobRecord:
    """One remote job of a request, and the stop asked of it, if any."""

    job_id: str
    request_name: str
    node: str
    ssh_conn_id: str
    base_dir: str
    grace_s: float | None = None
    stop_reason: str | None = None
    stop_grace_s: float | None = None
    stop_message: str | None = None

    def to_spec(self) -> dict[str, str]:
        """The job spec the operator and the trigger pass around."""
        return {"node": self.node, "ssh_conn_id": self.ssh_conn_id, "job_id": self.job_id,
                "base_dir": self.base_dir}


def _record(row: Mapping[str, object]) -> JobRecord:
    def num(key: str) -> float | None:
        value = row[key]
        return None if value is None else float(value)  # type: ignore[arg-type]

    return JobRecord(str(row["job_id"]), str(row["request_name"]), str(row["node"]),
                     str(row["ssh_conn_id"]), str(row["base_dir"]), num("grace_s"),
                     row["stop_reason"] and str(row["stop_reason"]), num("stop_grace_s"),
                     row["stop_message"] and str(row["stop_message"]))


def record_jobs(conn: Connection, request_name: str, jobs: Sequence[Mapping[str, str]],
                grace_s: float | None, now: datetime) -> str | None:
    """Record the jobs a task started; returns the stop reason when its request no longer
    holds GPUs (the jobs are then recorded with that stop already requested), else None."""
    lock = " FOR UPDATE" if conn.dialect.name == "postgresql" else ""
    row = conn.execute(text(f"SELECT id, state FROM requests WHERE name = :n{lock}"),
                       {"n": request_name}).mappings().first()
    active = row is not None and conn.execute(text(
        "SELECT COUNT(*) FROM allocations WHERE request_id = :rid AND state = 'active'"),
        {"rid": row["id"]}).scalar_one() > 0
    preempted = None
    if row is not None and not active:
        preempted = conn.execute(text(
            "SELECT end_reason FROM allocations WHERE request_id = :rid AND state = 'preempted' "
            "ORDER BY ended_at DESC"), {"rid": row["id"]}).first()
    stop = STOP_PREEMPTED if preempted is not None else None
    for job in jobs:
        conn.execute(text(
            "INSERT INTO jobs (job_id, request_name, node, ssh_conn_id, base_dir, grace_s, "
            "started_at, stop_reason, stop_grace_s, stop_message, stop_requested_at) VALUES "
            "(:job_id, :req, :node, :conn, :base, :grace, :now, :stop, :sgrace, :smsg, :sat)"),
            {"job_id": job["job_id"], "req": request_name, "node": job["node"],
             "conn": job["ssh_conn_id"], "base": job["base_dir"], "grace": grace_s,
             "now": db_time(now), "stop": stop, "sgrace": grace_s if stop else None,
             "smsg": preempted[0] if preempted is not None else None,
             "sat": db_time(now) if stop else None})
    return stop


def request_stop(conn: Connection, request_name: str, reason: str, grace_s: float,
                 message: str, now: datetime) -> int:
    """Ask for the request's unstopped jobs to be stopped; returns how many rows changed.

    The task's own grace (recorded with its jobs) wins over ``grace_s`` (the plan's)."""
    return conn.execute(text(
        "UPDATE jobs SET stop_reason = :r, stop_grace_s = COALESCE(grace_s, :g), "
        "stop_message = :m, stop_requested_at = :now "
        "WHERE request_name = :n AND stop_requested_at IS NULL"),
        {"r": reason, "g": float(grace_s), "m": message, "now": db_time(now),
         "n": request_name}).rowcount


def stops_due(conn: Connection, limit: int = 100) -> list[JobRecord]:
    """Jobs whose stop was requested and not yet sent, oldest request first."""
    rows = conn.execute(text(
        "SELECT * FROM jobs WHERE stop_requested_at IS NOT NULL AND stop_sent_at IS NULL "
        "ORDER BY stop_requested_at, job_id LIMIT :lim"), {"lim": int(limit)}).mappings()
    return [_record(r) for r in rows]


def mark_stop_sent(conn: Connection, job_ids: Iterable[str], now: datetime) -> int:
    ids = sorted(set(job_ids))
    if not ids:
        return 0
    return conn.execute(text(
        "UPDATE jobs SET stop_sent_at = :now WHERE job_id IN :ids AND stop_sent_at IS NULL")
        .bindparams(bindparam("ids", expanding=True)), {"now": db_time(now), "ids": ids}).rowcount


def jobs_of(conn: Connection, request_name: str) -> list[JobRecord]:
    rows = conn.execute(text("SELECT * FROM jobs WHERE request_name = :n ORDER BY started_at, "
                             "job_id"), {"n": request_name}).mappings()
    return [_record(r) for r in rows]


def stopping_on(conn: Connection, node: str, gpu_indices: Iterable[int], since: datetime
                ) -> list[JobRecord]:
    """Jobs on ``node`` whose stop a preemption asked for at or after ``since``, of an
    allocation that held one of ``gpu_indices`` there: what a placement won by that
    preemption waits for (they keep the GPUs through their grace to checkpoint)."""
    wanted = set(gpu_indices)
    rows = conn.execute(text(
        "SELECT * FROM jobs WHERE node = :node AND stop_reason = :r "
        "AND stop_requested_at >= :since ORDER BY stop_requested_at, job_id"),
        {"node": node, "r": STOP_PREEMPTED, "since": db_time(since)}).mappings()
    found = []
    for job in [_record(r) for r in rows]:
        held = {i for a in allocations_of(conn, job.request_name)
                if a.node == node and a.state is AllocationState.PREEMPTED
                for i in a.gpu_indices}
        if held & wanted:
            found.append(job)
    return found


def preemption_notes(conn: Connection) -> dict[str, str]:
    """For each pending request whose jobs a preemption stopped: what its stop said."""
    rows = conn.execute(text(
        "SELECT j.request_name, j.stop_message FROM jobs j JOIN requests r "
        "ON r.name = j.request_name WHERE r.state = 'pending' AND j.stop_reason = :r "
        "AND j.stop_message IS NOT NULL ORDER BY j.stop_requested_at"), {"r": STOP_PREEMPTED})
    return {str(name): str(message) for name, message in rows}
