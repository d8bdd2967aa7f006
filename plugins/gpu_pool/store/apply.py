"""Applying a plan: preemptions, then placements, then the reasons of what still waits.

Terms
-----
guarded write
    Every write re-checks, inside its transaction, what the plan assumed: the request is
    still pending and the placement has its shape (nodes, GPUs per node, share), its nodes
    are still up, each GPU still has room, CPU and RAM are still free. A check that fails
    drops that placement (with the reason) instead of raising.
drop
    A placement that lost a race or went stale. It changes nothing; the request stays
    pending and the next cycle plans it again.

Invariants
----------
* One transaction per plan (one commit, so a plan of hundreds of placements fits in a
  heartbeat) and a savepoint per preemption and per placement, so one lost race drops only
  that placement; a gang is placed whole or not at all (all its allocations in one
  savepoint).
* On PostgreSQL the transaction first takes ``pg_advisory_xact_lock`` on
  :data:`APPLY_LOCK_KEY`, so schedulers apply one plan at a time; the database's own guard
  (the ``gpus.allocated_milli`` CHECK and triggers, the unique index on whole GPUs) forbids
  double allocation even without that lock.
* Within a placement GPU rows are written in (node, index) order. Across placements the
  plan's order holds, so two writers without the lock can form a lock cycle; PostgreSQL
  then aborts one statement (deadlock detected) and that placement is dropped like any
  lost race.
* Data readiness is not re-checked here: the executor's cycle decides it from Airflow asset
  events in the snapshot it plans on, which the stored flag may lag behind.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from gpu_pool.model import Allocation, Outcome, Policy, PriorityClass, Purpose, RequestState
from gpu_pool.store.allocations import (
    active_allocations_of_request,
    create_allocation,
    end_allocation,
    held_on_node,
)
from gpu_pool.store.codec import duration
from gpu_pool.store.jobs import STOP_PREEMPTED, request_stop
from gpu_pool.store.ledger import price_of
from gpu_pool.store.requests import change_state, set_reasons

if TYPE_CHECKING:  # the engine (OR-Tools, numpy) costs seconds to import; types only
    from gpu_pool.engine.types import Placement, Plan, Preemption

APPLY_LOCK_KEY = 0x6770755F61707079  # any constant unique to gpu-pool's apply step

WriteTx = Callable[[], AbstractContextManager[Connection]]


@dataclass
class ApplyResult:
    """What applying a plan did: who was placed, who was dropped and why."""

    placed: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)  # request name -> why
    allocations: dict[str, list[Allocation]] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)  # allocation ids ended by the plan

    @property
    def applied(self) -> list[str]:
        """The placed request names (the name the executor's cycle reads)."""
        return self.placed


class Dropped(Exception):
    """A guarded write found the plan stale; ``reason`` says what changed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def lock_apply(conn: Connection) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": APPLY_LOCK_KEY})


def apply_plan(write: WriteTx, plan: Plan, now: datetime, actor: str, policy: Policy,
               serialize: bool = True) -> ApplyResult:
    result = ApplyResult()
    with write() as conn:
        if serialize:
            lock_apply(conn)
        for preemption in plan.preemptions:
            with conn.begin_nested():
                if preempt(conn, preemption, now, actor, policy):
                    result.preempted.append(preemption.allocation_id)
        for placement in plan.placements:
            name = placement.request_name
            try:
                with conn.begin_nested():
                    made = place(conn, placement, now, actor)
            except Dropped as stale:
                result.dropped[name] = stale.reason
            except DBAPIError as error:
                if not _lost_race(error):
                    raise
                result.dropped[name] = ("lost a race: another writer took its GPUs first "
                                        f"({_first_line(error)})")
            else:
                result.allocations[name] = made
                result.placed.append(name)
        if plan.pending:
            set_reasons(conn, [(r.request_name, str(r.code), r.message,
                                plan.estimates.get(r.request_name)) for r in plan.pending], now)
    return result


def place(conn: Connection, placement: Placement, now: datetime, actor: str) -> list[Allocation]:
    """Write one placement's allocations with guarded writes; raises :class:`Dropped`."""
    req = conn.execute(text("SELECT * FROM requests WHERE name = :n"),
                       {"n": placement.request_name}).mappings().first()
    if req is None:
        raise Dropped("no such request in the store")
    if req["state"] != RequestState.PENDING:
        raise Dropped(f"the request is {req['state']}, no longer pending")
    _check_shape(req, placement)
    ends_by = now + timedelta(seconds=float(req["time_limit_s"])) if req["time_limit_s"] is not None else None
    made = []
    for part in sorted(placement.assignments, key=lambda a: a.node):
        node = conn.execute(text("SELECT state, cpu_milli, memory_mib FROM nodes WHERE name = :n"),
                            {"n": part.node}).mappings().first()
        if node is None:
            raise Dropped(f"node {part.node!r} is not in the store")
        if node["state"] != "up":
            raise Dropped(f"node {part.node} is {node['state']}")
        gpus = {r["idx"]: r for r in conn.execute(
            text("SELECT idx, model, healthy, allocated_milli FROM gpus WHERE node = :n"),
            {"n": part.node}).mappings()}
        for idx in part.gpu_indices:
            gpu = gpus.get(idx)
            if gpu is None:
                raise Dropped(f"node {part.node} has no GPU {idx}")
            if not gpu["healthy"]:
                raise Dropped(f"GPU {part.node}/{idx} is unhealthy")
            if gpu["allocated_milli"] + part.gpu_milli > 1000:
                raise Dropped(f"GPU {part.node}/{idx} already has {gpu['allocated_milli']} "
                              f"of 1000 milli held")
        cpu_held, mem_held = held_on_node(conn, part.node)
        if cpu_held + part.cpu_milli > node["cpu_milli"]:
            raise Dropped(f"node {part.node} has {node['cpu_milli'] - cpu_held} millicores free")
        if mem_held + part.memory_mib > node["memory_mib"]:
            raise Dropped(f"node {part.node} has {node['memory_mib'] - mem_held} MiB RAM free")
        model = gpus[part.gpu_indices[0]]["model"] if part.gpu_indices else None
        made.append(create_allocation(conn, Allocation(
            request_name=req["name"], node=part.node, gpu_indices=tuple(part.gpu_indices),
            gpu_milli=part.gpu_milli, cpu_milli=part.cpu_milli, memory_mib=part.memory_mib,
            team=req["team"], purpose=Purpose(req["purpose"]),
            priority=PriorityClass(req["priority"]), gpu_model=model, started_at=now,
            ends_by=ends_by, preemptible=bool(req["preemptible"]), request_id=req["id"],
            borrowed_from=placement.borrowed_from, off_peak=bool(placement.off_peak),
            grace=duration(req["grace_s"]),
            transfer_s=float(placement.transfer_seconds) if placement.cross_zone else 0.0,
            expected_wait_saved_s=float(placement.expected_wait_saved_s),
        ), actor, placement.note or "placed by plan"))
    if not change_state(conn, req["id"], req["name"], (RequestState.PENDING,),
                        RequestState.RUNNING, actor, "placed by plan", now,
                        {"nodes": [a.node for a in made]}):
        raise Dropped("the request changed while it was being placed")
    return made


def _check_shape(req: Any, placement: Placement) -> None:
    """A plan must place the request as submitted: its nodes, GPUs per node and share."""
    parts = placement.assignments
    if len(parts) != req["nodes"] or len({p.node for p in parts}) != len(parts):
        raise Dropped(f"the plan gives {len(parts)} node(s); the request needs {req['nodes']} "
                      "distinct nodes")
    for p in parts:
        if len(set(p.gpu_indices)) != req["gpus"] or len(p.gpu_indices) != req["gpus"]:
            raise Dropped(f"the plan gives {len(p.gpu_indices)} GPU(s) on {p.node}; the request "
                          f"needs {req['gpus']}")
        if req["gpus"] and p.gpu_milli != req["gpu_milli"]:
            raise Dropped(f"the plan gives {p.gpu_milli} milli per GPU; the request needs "
                          f"{req['gpu_milli']}")


def preempt(conn: Connection, preemption: Preemption, now: datetime, actor: str,
            policy: Policy) -> bool:
    """End a request's active allocations for a more urgent one; it goes back to pending."""
    row = conn.execute(text("SELECT request_id, request_name, state FROM allocations "
                            "WHERE id = :id"), {"id": preemption.allocation_id}).mappings().first()
    if row is None or row["state"] != "active":
        return False  # already ended: the plan was stale, nothing to undo
    # The engine's sentences say who and why ("preempted: team cv reclaimed its guarantee,
    # grace 120 s"); a bare message gets the request it was preempted for.
    reason = (preemption.message if preemption.message.startswith("preempted")
              else f"preempted for {preemption.for_request}: {preemption.message}")
    # A gang is preempted whole: a part of it alone cannot run.
    for allocation in active_allocations_of_request(conn, row["request_id"]):
        end_allocation(conn, allocation, Outcome.PREEMPTED, actor, reason, now,
                       price_of(policy, allocation.gpu_model))
    change_state(conn, row["request_id"], row["request_name"], (RequestState.RUNNING,),
                 RequestState.PENDING, actor, reason, now,
                 {"for": preemption.for_request or None, "kind": preemption.kind})
    # Until a plan says otherwise, the request waits because it was preempted, by whom.
    conn.execute(text("UPDATE requests SET reason_code = 'preempted', reason_message = :m "
                      "WHERE id = :id"), {"m": reason, "id": row["request_id"]})
    # Its remote jobs are to be stopped with grace, in this same transaction (an outbox the
    # executor empties over SSH: see gpu_pool.store.jobs). After change_state, which updated
    # the request row: on PostgreSQL a concurrent record_jobs (which locks that row) either
    # committed its rows before, or sees the allocations ended and requests the stop itself.
    grace = preemption.grace_s or policy.preemption_grace.total_seconds()
    request_stop(conn, row["request_name"], STOP_PREEMPTED, grace, reason, now)
    return True


def _lost_race(error: DBAPIError) -> bool:
    """The database's guard refused an overlap, or PostgreSQL broke a lock cycle."""
    code = getattr(getattr(error, "orig", None), "pgcode", None)
    return isinstance(error, IntegrityError) or code in ("40001", "40P01", "55P03")


def _first_line(error: BaseException) -> str:
    orig = getattr(error, "orig", None) or error
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0]
