"""One call per chore, gluing the store to the pure cores: what the DAGs and the CLI run.

Each takes the store, its side-effect interfaces (channels, object store, liveness, probe)
and ``now`` from the caller, and returns a result to print or log. None imports Airflow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from gpu_pool.model import Policy
from gpu_pool.notify.channels import TeamChannels
from gpu_pool.objectstore import ObjectStore
from gpu_pool.ops import alerts, crosszone, reclaim, report, snapshot
from gpu_pool.ops.config import OpsConfig
from gpu_pool.ops.records import OpsRecords, engine_of
from gpu_pool.ops.storeviews import TaskLink, gpu_samples, metrics_with_usage, task_links

Liveness = Callable[[Mapping[str, TaskLink]], Mapping[str, str | None]]
"""Request name → Airflow state of its task instance try (None: unknown, keep)."""


def records_for(store: Any) -> OpsRecords:
    return OpsRecords(engine_of(store))


def run_alerts(store: Any, channels: TeamChannels, config: OpsConfig,
               now: datetime, policy: Policy | None = None) -> alerts.AlertRun:
    quotas = store.list_quotas()
    since = min((q.valid_from for q in quotas), default=now)
    planned = alerts.plan_alerts(quotas, store.ledger(since=since, until=now),
                                 store.active_allocations(), store.pending_requests(),
                                 config, now, policy)
    return alerts.deliver_alerts(planned, store.list_teams(), records_for(store), channels, now)


def run_sweep(store: Any, liveness: Liveness, channels: TeamChannels | None,
              config: OpsConfig, now: datetime, *, actor: str = "reclaim-sweep",
              processes: Sequence[reclaim.GpuProcess] = ()) -> reclaim.SweepResult:
    engine = engine_of(store)
    allocations = store.active_allocations()
    links = task_links(engine, sorted({a.request_name for a in allocations}))
    states = dict(liveness(links))
    samples = gpu_samples(engine, now - timedelta(minutes=config.idle_minutes), now)
    plan = reclaim.plan_sweep(allocations, states, samples, processes, config, now)
    teams = {t.name: t for t in store.list_teams()}
    return reclaim.apply_sweep(plan, store, OpsRecords(engine), channels, teams, config, actor,
                               now)


@dataclass(frozen=True)
class ProbeRun:
    probed: tuple[str, ...]
    down: tuple[str, ...]
    foreign: tuple[reclaim.GpuProcess, ...]
    records: tuple[Any, ...]


def run_probe(store: Any, probe: Callable[[Any, datetime], Any], now: datetime, *,
              actor: str = "node-probe") -> ProbeRun:
    """Probe every node (``probe(node, now) -> gpu_pool.probe.NodeProbe``), record readings and
    up/down, and report processes on GPUs that gpu-pool did not hand out."""
    from gpu_pool.probe import record_probe

    probed, down, processes = [], [], []
    for node in store.list_nodes():
        result = probe(node, now)
        record_probe(store, result, current=node.state, actor=actor)
        probed.append(node.name)
        if result.error or not result.reachable:
            down.append(node.name)
        index_of = {r.uuid: r.index for r in result.readings}
        processes.extend(reclaim.GpuProcess(node.name, index_of[p.gpu_uuid], p.pid,
                                            used_memory_mib=float(p.used_memory_mib or 0))
                         for p in result.processes if p.gpu_uuid in index_of)
    foreign = reclaim.find_foreign(processes, store.active_allocations())
    plan = reclaim.SweepPlan((), (), foreign, ())
    done = reclaim.apply_sweep(plan, store, records_for(store), None, {}, OpsConfig(), actor,
                               now)
    return ProbeRun(tuple(probed), tuple(down), foreign, done.records)


def _ledger_with_usage(store: Any, since: datetime, until: datetime) -> Any:
    engine = engine_of(store)
    frame = snapshot.ledger_frame(e for e in store.ledger(since=since, until=until)
                                  if since <= e.ended_at < until)
    frame["metrics"] = [metrics_with_usage(engine, a, m)
                        for a, m in zip(frame["allocation_id"], frame["metrics"], strict=True)]
    return frame


def run_snapshots(store: Any, objstore: ObjectStore, config: OpsConfig, now: datetime, *,
                  days: Sequence[date] | None = None) -> list[snapshot.PeriodExport]:
    return snapshot.export_snapshots(store, objstore, records_for(store), now,
                                     max_periods=config.catchup_max_periods, days=days)


def previous_month(now: datetime) -> str:
    first = now.astimezone(UTC).date().replace(day=1)
    return (first - timedelta(days=1)).strftime("%Y-%m")


def cross_zone_moves(store: Any, since: datetime, until: datetime
                     ) -> list[crosszone.Move]:
    """The moves whose allocations ended in [since, until), whether each paid measured
    from the holds on record up to ``until`` (:mod:`gpu_pool.ops.crosszone`)."""
    ended = [e for e in store.ledger(since=since, until=until)
             if since <= e.ended_at < until and e.cross_zone]
    if not ended:
        return []
    first = min(e.started_at for e in ended)
    holds = crosszone.holds_of(store.ledger(since=first), store.active_allocations())
    datasets = {}
    for name in sorted({e.request_name for e in ended}):
        request = store.get_request(name)
        datasets[name] = request.dataset if request is not None else None
    return crosszone.moves_of(ended, holds, store.list_nodes(), datasets, until)


def build_monthly_report(store: Any, month: str, policy: Policy) -> report.MonthlyReport:
    lo, hi = report.month_bounds(month)
    reclaims = records_for(store).reclaims(since=lo, until=hi)
    return report.build_report(month, _ledger_with_usage(store, lo, hi), store.list_quotas(),
                               reclaims, policy, moves=cross_zone_moves(store, lo, hi))


def run_report(store: Any, objstore: ObjectStore, month: str, policy: Policy,
               now: datetime) -> tuple[report.MonthlyReport, list[str]]:
    built = build_monthly_report(store, month, policy)
    keys = report.write_report(objstore, built, now)
    records_for(store).record_export("monthly_report", month, keys, len(built.teams), now)
    return built, keys


def _next_month(month: str) -> str:
    return report.month_bounds(month)[1].strftime("%Y-%m")


def months_due(store: Any, now: datetime, limit: int = 24) -> list[str]:
    """Finished months without a report yet: after the last one written (or from the first
    ledger month), up to the month before ``now``."""
    last_done = previous_month(now)
    last = records_for(store).last_export("monthly_report")
    if last is not None:
        month = _next_month(last)
    else:
        ends = [e.ended_at for e in store.ledger(until=now)]
        month = min(ends).strftime("%Y-%m") if ends else last_done
    months = []
    while month <= last_done and len(months) < limit:
        months.append(month)
        month = _next_month(month)
    return months
