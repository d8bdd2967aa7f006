"""Requests in the store: submission, their states, readiness, reasons and their end.

Terms
-----
state
    pending → running (placed: :mod:`gpu_pool.store.apply`) → finished; running → pending
    (preempted by a plan); pending or running → cancelled. ``refused`` is reserved for
    requests recorded only to say why they were refused.
reason
    ``reason_code`` / ``reason_message``: why a pending request waits, as the last plan said.
external
    The Airflow task instance a request stands for: dag_id, task_id, run_id, map_index,
    try_number, executor_key; and the template the task used (``name@vN``) with its setup
    command, run on the node before the task's own.

Invariants: :func:`change_state` is the one writer of ``requests.state`` after submission;
it is guarded (``WHERE id = :id AND state IN (...)``) and writes its ``request.*`` event in
the caller's transaction. :func:`release_request` is idempotent: a request already finished
or cancelled is left as it is and yields no ledger entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, text

from gpu_pool.errors import NotFoundError, SpecError
from gpu_pool.model import LedgerEntry, Node, Outcome, Policy, Request, RequestState
from gpu_pool.store import events
from gpu_pool.store.allocations import active_allocations_of_request, end_allocation
from gpu_pool.store.checks import check_request
from gpu_pool.store.codec import db_time, new_id, py_time, request_from_row, request_params
from gpu_pool.store.fleet import fleet_shapes, require_team
from gpu_pool.store.ledger import price_of

EXTERNAL_FIELDS = ("dag_id", "task_id", "run_id", "map_index", "try_number", "executor_key",
                   "template", "setup")
_EVENT_OF = {
    RequestState.RUNNING: "request.placed",
    RequestState.PENDING: "request.requeued",
    RequestState.FINISHED: "request.finished",
    RequestState.CANCELLED: "request.cancelled",
    RequestState.REFUSED: "request.refused",
}
# Which words of engine.never_fits' sentence point at which request field.
_NEVER_FITS_FIELDS = (("distinct nodes", "nodes"), ("CPU cores", "cpu"), ("MiB RAM", "memory"),
                      ("on one node", "gpus"), ("GPUs; the fleet has", "gpu_models"))


def check_external(external: Mapping[str, Any] | None) -> dict[str, Any]:
    values = dict(external or {})
    unknown = sorted(set(values) - set(EXTERNAL_FIELDS))
    if unknown:
        raise SpecError("external", unknown[0], "one of " + ", ".join(EXTERNAL_FIELDS))
    return {k: values.get(k) for k in EXTERNAL_FIELDS}


def check_fits(request: Request, nodes: Sequence[Node], policy: Policy | None) -> None:
    """Refuse a request no node or gang of the fleet could ever hold.

    An empty fleet refuses nothing: it is a store being set up, not a verdict.
    """
    if not nodes:
        return
    try:
        from gpu_pool.engine import never_fits
    except ImportError:  # the engine is optional at this layer; spec checks still ran
        return
    why = never_fits(request, nodes, policy)
    if why is None:
        return
    field = next((f for words, f in _NEVER_FITS_FIELDS if words in why), "gpus")
    if field == "gpu_models" and request.min_gpu_memory_mib and not request.gpu_models:
        field = "min_gpu_memory"  # any model would do: it is the memory floor that fails
    value = {"nodes": request.nodes, "cpu": request.cpu_milli, "memory": request.memory_mib,
             "gpus": request.gpus, "gpu_models": sorted(request.gpu_models) or "any",
             "min_gpu_memory": request.min_gpu_memory_mib}[field]
    raise SpecError(field, value, f"a request some node or gang of the fleet can hold ({why})")


def submit_request(conn: Connection, request: Request, actor: str, now: datetime,
                   external: Mapping[str, Any], policy: Policy | None) -> Request:
    check_request(request)
    require_team(conn, request.team)
    clash = conn.execute(text("SELECT state FROM requests WHERE name = :n"),
                         {"n": request.name}).scalar()
    if clash is not None:
        raise SpecError("name", request.name, f"a name no other request has (one is {clash})")
    check_fits(request, fleet_shapes(conn), policy)
    request_id = request.id or new_id()
    submitted_at = request.submitted_at or now
    params = {**request_params(request, request_id, submitted_at, now), **external}
    conn.execute(text(
        "INSERT INTO requests (id, name, team, purpose, priority, gpus, gpu_milli, nodes, "
        "gpu_models, min_gpu_memory_mib, cpu_milli, memory_mib, dataset_uri, dataset_zone, "
        "dataset_size_gib, data_ready, time_limit_s, estimated_runtime_s, preemptible, state, "
        "submitted_at, created_at, updated_at, dag_id, task_id, run_id, map_index, try_number, "
        "executor_key, grace_s, template, setup) VALUES (:id, :name, :team, :purpose, :priority, :gpus, "
        ":gpu_milli, "
        ":nodes, :gpu_models, :min_gpu_memory_mib, :cpu_milli, :memory_mib, :dataset_uri, "
        ":dataset_zone, :dataset_size_gib, :data_ready, :time_limit_s, :estimated_runtime_s, "
        ":preemptible, 'pending', :submitted_at, :now, :now, :dag_id, :task_id, :run_id, "
        ":map_index, :try_number, :executor_key, :grace_s, :template, :setup)"), params)
    events.record(conn, now, "request", request.name, "request.submitted", actor,
                  data={"team": request.team, "gpus": request.total_gpus,
                        "priority": str(request.priority),
                        **{k: v for k, v in external.items() if v is not None}})
    return get_request(conn, request.name)


def get_request(conn: Connection, name: str) -> Request | None:
    row = conn.execute(text("SELECT * FROM requests WHERE name = :n"), {"n": name}).mappings()
    first = row.first()
    return request_from_row(first) if first else None


def request_row(conn: Connection, name: str) -> Mapping[str, Any]:
    row = conn.execute(text("SELECT * FROM requests WHERE name = :n"), {"n": name}).mappings()
    first = row.first()
    if first is None:
        raise NotFoundError("request", name)
    return first


def request_state(conn: Connection, name: str) -> RequestState | None:
    state = conn.execute(text("SELECT state FROM requests WHERE name = :n"), {"n": name}).scalar()
    return RequestState(state) if state else None


def pending_requests(conn: Connection) -> list[Request]:
    rows = conn.execute(text("SELECT * FROM requests WHERE state = 'pending' "
                             "ORDER BY submitted_at, created_at, name")).mappings()
    return [request_from_row(r) for r in rows]


def change_state(conn: Connection, request_id: str, name: str, from_states: Sequence[RequestState],
                 to: RequestState, actor: str, reason: str | None, now: datetime,
                 data: Mapping[str, Any] | None = None) -> bool:
    """Move a request to ``to`` if it is in one of ``from_states``; False if it was not."""
    allowed = {f"s{i}": str(s) for i, s in enumerate(from_states)}
    finished = to in (RequestState.FINISHED, RequestState.CANCELLED, RequestState.REFUSED)
    changed = conn.execute(text(
        "UPDATE requests SET state = :to, updated_at = :now"
        + (", finished_at = :now" if finished else ", finished_at = NULL")
        + (", reason_code = NULL, reason_message = NULL, estimated_start = NULL"
           if to is not RequestState.PENDING else "")
        + f" WHERE id = :id AND state IN ({', '.join(':' + k for k in allowed)})"),
        {"to": str(to), "now": db_time(now), "id": request_id, **allowed})
    if changed.rowcount != 1:
        return False
    events.record(conn, now, "request", name, _EVENT_OF[to], actor, reason, data)
    return True


def set_data_ready(conn: Connection, name: str, ready: bool, actor: str, now: datetime) -> bool:
    row = request_row(conn, name)
    if bool(row["data_ready"]) == bool(ready):
        return False
    conn.execute(text("UPDATE requests SET data_ready = :r, updated_at = :now WHERE id = :id"),
                 {"r": bool(ready), "now": db_time(now), "id": row["id"]})
    events.record(conn, now, "request", name, "request.data_ready", actor,
                  "dataset ready" if ready else "dataset not ready", {"data_ready": bool(ready)})
    return True


def set_reasons(conn: Connection, reasons: Sequence[tuple[str, str, str, datetime | None]],
                now: datetime) -> None:
    """Record why pending requests wait and when they are expected to start: (name, code,
    message, estimated start or None).

    Only changed reasons are written, in one batch: a cycle restates thousands of unchanged
    reasons and must not cost a statement each. A reason is not a state change, so no event
    is written.
    """
    current = {r[0]: (r[1], r[2], py_time(r[3])) for r in conn.execute(text(
        "SELECT name, reason_code, reason_message, estimated_start FROM requests "
        "WHERE state = 'pending'"))}
    changed = [{"c": code, "m": message, "e": db_time(start), "now": db_time(now), "n": name}
               for name, code, message, start in reasons
               if name in current and current[name] != (code, message, _second(start))]
    if changed:
        conn.execute(text("UPDATE requests SET reason_code = :c, reason_message = :m, "
                          "estimated_start = :e, updated_at = :now "
                          "WHERE name = :n AND state = 'pending'"), changed)


def _second(when: datetime | None) -> datetime | None:
    """``when`` as the store gives it back (aware UTC): compare like with like."""
    return py_time(db_time(when))


def estimated_start(conn: Connection, name: str) -> datetime | None:
    """The start the last placement cycle expects for pending request ``name``, if any."""
    row = conn.execute(text("SELECT estimated_start FROM requests WHERE name = :n "
                            "AND state = 'pending'"), {"n": name}).first()
    return None if row is None else py_time(row[0])


def release_request(conn: Connection, name: str, outcome: Outcome, actor: str, reason: str | None,
                    now: datetime, policy: Policy, metrics: Mapping[str, float] | None
                    ) -> list[LedgerEntry]:
    """End a request: its active allocations end (one ledger entry each), it finishes."""
    row = request_row(conn, name)
    state = RequestState(row["state"])
    if state not in (RequestState.PENDING, RequestState.RUNNING):
        return []
    entries = []
    for allocation in active_allocations_of_request(conn, row["id"]):
        entry = end_allocation(conn, allocation, outcome, actor, reason, now,
                               price_of(policy, allocation.gpu_model), metrics)
        if entry is not None:
            entries.append(entry)
    to = RequestState.CANCELLED if outcome is Outcome.CANCELLED else RequestState.FINISHED
    change_state(conn, row["id"], name, (RequestState.PENDING, RequestState.RUNNING), to, actor,
                 reason, now, {"outcome": str(outcome), "allocations": len(entries)})
    return entries


def finished_outcomes(conn: Connection, names: Iterable[str]) -> dict[str, Outcome]:
    """The outcome each of ``names`` that has finished ended with (its ledger rows')."""
    names = sorted(set(names))
    if not names:
        return {}
    rows = conn.execute(text(
        "SELECT r.name, l.outcome FROM requests r JOIN allocations a ON a.request_id = r.id "
        "JOIN ledger l ON l.allocation_id = a.id WHERE r.state = 'finished' "
        "AND r.name IN :names").bindparams(bindparam("names", expanding=True)),
        {"names": names})
    return {name: Outcome(outcome) for name, outcome in rows}
