"""Ledger and state snapshots to object storage, one UTC day per period, idempotent.

Keys (below the object store's prefix)
--------------------------------------
``ledger/dt=YYYY-MM-DD/part-0.parquet`` and ``.csv``
    ledger entries whose allocation *ended* that day.
``events/dt=YYYY-MM-DD/part-0.parquet`` and ``.csv``
    the store's events of that day.
``fleet/dt=…``, ``queue/dt=…``, ``allocations/dt=…``
    nodes and GPUs, pending requests and active allocations as of the run (only written for
    the day that contains ``now``: the past state is not kept in the store).
``audit/dt=YYYY-MM-DD/part-0.parquet`` and ``.csv``
    the day's changes (quota, node, template, approval, freeze, member, policy, lending):
    who, when, before, after.
``by_team/team=<team>/year=<YYYY>/ledger/dt=…`` and ``…/audit/dt=…``
    the same rows of one team, so "team cv, 2026" is one listing of
    ``by_team/team=cv/year=2026/`` (the monthly reports are there too).

On a bucket that keeps no history (versioning off, as on many S3-compatible stores), each
export of a period goes under its own folder, ``ledger/dt=YYYY-MM-DD/exported_at=<UTC
time>/part-0.parquet``: a rerun never destroys an earlier snapshot; readers take the latest
``exported_at`` of a day.

Every CSV has its header, an empty table's too (``pandas.read_csv`` reads it as no rows).

Invariants
----------
* On a versioned bucket the same period always goes to the same keys: a rerun overwrites
  (versioning keeps the history) and two runs of one period never leave two current copies.
* A period is recorded in ``ops_exports`` only after all of its objects were written; the
  next run resumes at the latest recorded period (re-exporting it, since it may have been
  partial) and catches up every day since. If the object store is down nothing is recorded,
  the run fails with an :class:`~gpu_pool.objectstore.ObjectStoreError`, and the next one
  covers the gap: the store is the source of truth, nothing is lost.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

import pandas as pd

from gpu_pool.model import Allocation, LedgerEntry, Request
from gpu_pool.objectstore import ObjectStore, export_key
from gpu_pool.ops.records import OpsRecords
from gpu_pool.store.events import Event, teams_of

DATASET = "daily"
LEDGER_COLUMNS = ("allocation_id", "request_name", "team", "purpose", "node", "gpu_model",
                  "gpus", "started_at", "ended_at", "gpu_hours", "cost", "outcome",
                  "price_per_gpu_hour", "metrics", "borrowed_from", "off_peak", "transfer_s",
                  "expected_wait_saved_s")


def day_start(day: date) -> datetime:
    return datetime.combine(day, time(0), tzinfo=UTC)


def key_for(table: str, day: date, ext: str, exported_at: datetime | None = None) -> str:
    return export_key(f"{table}/dt={day.isoformat()}", f"part-0.{ext}", exported_at)


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC)
    if hasattr(value, "value") and type(value).__module__.startswith("gpu_pool"):
        return value.value  # an enum of the domain
    if isinstance(value, dict | list | tuple | frozenset | set):
        return json.dumps(value if isinstance(value, dict) else sorted(map(str, value)),
                          sort_keys=True, default=str)
    return value


AUDIT_COLUMNS = ("at", "kind", "subject", "actor", "teams", "reason", "before", "after")


def audit_frame(changes: Iterable[Event]) -> pd.DataFrame:
    rows = [{"at": c.at.astimezone(UTC), "kind": c.kind, "subject": c.subject,
             "actor": c.actor, "teams": ",".join(sorted(teams_of(c))), "reason": c.reason,
             "before": json.dumps(c.data.get("before"), sort_keys=True, default=str),
             "after": json.dumps(c.data.get("after", dict(c.data)), sort_keys=True,
                                 default=str)} for c in changes]
    return pd.DataFrame(rows, columns=list(AUDIT_COLUMNS))


def ledger_frame(entries: Iterable[LedgerEntry]) -> pd.DataFrame:
    rows = [{
        "allocation_id": str(e.allocation_id), "request_name": e.request_name, "team": e.team,
        "purpose": str(e.purpose.value if hasattr(e.purpose, "value") else e.purpose),
        "node": e.node, "gpu_model": e.gpu_model, "gpus": float(e.gpus),
        "started_at": e.started_at.astimezone(UTC), "ended_at": e.ended_at.astimezone(UTC),
        "gpu_hours": float(e.gpu_hours), "cost": float(e.cost),
        "outcome": str(e.outcome.value if hasattr(e.outcome, "value") else e.outcome),
        "price_per_gpu_hour": float(e.price_per_gpu_hour),
        "metrics": json.dumps(dict(e.metrics), sort_keys=True),
        # The lender team ("": capacity no guarantee covers; None: within its quota).
        "borrowed_from": e.borrowed_from,
        "off_peak": bool(e.off_peak),
        "transfer_s": float(e.transfer_s),
        "expected_wait_saved_s": float(e.expected_wait_saved_s),
    } for e in entries]
    frame = pd.DataFrame(rows, columns=list(LEDGER_COLUMNS))
    for col in ("started_at", "ended_at"):
        frame[col] = pd.to_datetime(frame[col], utc=True)
    return frame.sort_values(["ended_at", "allocation_id"], kind="stable").reset_index(drop=True)


def records_frame(items: Iterable[Any], of: type) -> pd.DataFrame:
    """A frame of dataclasses or mappings, nested values as JSON text; its columns are the
    fields of the dataclass ``of``, so a table without rows still has its header."""
    rows = []
    for item in items:
        if dataclasses.is_dataclass(item) and not isinstance(item, type):
            raw = {f.name: getattr(item, f.name) for f in dataclasses.fields(item)}
        else:
            raw = dict(item)
        rows.append({k: _plain(v) for k, v in raw.items()})
    return pd.DataFrame(rows, columns=[f.name for f in dataclasses.fields(of)])


def fleet_frame(nodes: Iterable[Any]) -> pd.DataFrame:
    rows = []
    for n in nodes:
        for g in n.gpus:
            rows.append({"node": n.name, "zone": n.zone, "state": _plain(n.state),
                         "gpu_index": g.index, "gpu_model": g.model,
                         "memory_mib": g.memory_mib, "healthy": g.healthy,
                         "utilization_pct": g.utilization_pct})
    return pd.DataFrame(rows, columns=["node", "zone", "state", "gpu_index", "gpu_model",
                                       "memory_mib", "healthy", "utilization_pct"])


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    buf = io.BytesIO()
    frame.to_parquet(buf, index=False, engine="pyarrow")
    return buf.getvalue()


def read_parquet(data: bytes) -> pd.DataFrame:
    return pd.read_parquet(io.BytesIO(data), engine="pyarrow")


def write_table(objstore: ObjectStore, table: str, day: date, frame: pd.DataFrame,
                exported_at: datetime | None = None) -> list[str]:
    """Parquet for machines and CSV for people, under the period's keys (see the module
    docstring for ``exported_at``)."""
    return [
        objstore.put_bytes(key_for(table, day, "parquet", exported_at), parquet_bytes(frame),
                           "application/vnd.apache.parquet"),
        objstore.put_bytes(key_for(table, day, "csv", exported_at),
                           frame.to_csv(index=False).encode(), "text/csv"),
    ]


@dataclass(frozen=True)
class PeriodExport:
    period: date
    keys: tuple[str, ...]
    ledger_rows: int


def export_day(store: Any, objstore: ObjectStore, day: date, now: datetime,
               exported_at: datetime | None = None) -> PeriodExport:
    lo, hi = day_start(day), day_start(day + timedelta(days=1))
    entries = [e for e in store.ledger(since=lo, until=hi) if lo <= e.ended_at < hi]
    keys = write_table(objstore, "ledger", day, ledger_frame(entries), exported_at)
    events = [e for e in store.events(since=lo) if _event_time(e) is None
              or lo <= _event_time(e) < hi]
    keys += write_table(objstore, "events", day, records_frame(events, Event), exported_at)
    changes = store.audit(since=lo, until=hi)
    keys += write_table(objstore, "audit", day, audit_frame(changes), exported_at)
    change_teams = [teams_of(c) for c in changes]  # once per change, not once per team
    teams = {e.team for e in entries}.union(*change_teams)
    for team in sorted(teams):
        folder = f"by_team/team={team}/year={day.year}"
        keys += write_table(objstore, f"{folder}/ledger", day,
                            ledger_frame(e for e in entries if e.team == team), exported_at)
        keys += write_table(objstore, f"{folder}/audit", day,
                            audit_frame(c for c, ts in zip(changes, change_teams, strict=True)
                                        if team in ts), exported_at)
    if lo <= now < hi:
        keys += write_table(objstore, "fleet", day, fleet_frame(store.list_nodes()),
                            exported_at)
        keys += write_table(objstore, "queue", day,
                            records_frame(store.pending_requests(), Request), exported_at)
        keys += write_table(objstore, "allocations", day,
                            records_frame(store.active_allocations(), Allocation), exported_at)
    return PeriodExport(day, tuple(keys), len(entries))


def _event_time(event: Any) -> datetime | None:
    for name in ("at", "when", "created_at", "time"):
        value = event.get(name) if isinstance(event, dict) else getattr(event, name, None)
        if isinstance(value, datetime):
            return value
    return None


def periods_due(records: OpsRecords, store: Any, now: datetime, max_periods: int,
                first: date | None = None) -> list[date]:
    """Days to export: from the latest recorded one (again) up to today."""
    today = now.astimezone(UTC).date()
    last = records.last_export(DATASET)
    if last is not None:
        start = date.fromisoformat(last)
    elif first is not None:
        start = first
    else:
        ends = [e.ended_at for e in store.ledger(until=now)]
        start = min(ends).astimezone(UTC).date() if ends else today
    days = [start + timedelta(days=i) for i in range((today - start).days + 1)]
    return days[-max_periods:] if len(days) > max_periods else days


def export_snapshots(store: Any, objstore: ObjectStore, records: OpsRecords, now: datetime,
                     *, max_periods: int = 400, days: Sequence[date] | None = None,
                     ) -> list[PeriodExport]:
    """Export every due day (or exactly ``days``), recording each once it is complete."""
    todo = list(days) if days is not None else periods_due(records, store, now, max_periods)
    # Asked once, when the export starts: without history, this export gets keys of its own.
    exported_at = None if objstore.keeps_history() else now
    done = []
    for day in todo:
        export = export_day(store, objstore, day, now, exported_at)
        records.record_export(DATASET, day.isoformat(), list(export.keys), export.ledger_rows,
                              now)
        done.append(export)
    return done
