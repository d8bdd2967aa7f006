"""Metrics an operator can alert on, sent through Airflow's own stats (StatsD or
OpenTelemetry, as the deployment's ``[metrics]`` section configures Airflow; nothing when
metrics are off). Kueue exports pending workloads, admission wait and quota usage; these are
gpu-pool's, under the deployment's prefix (``airflow.`` by default):

=====================================  =======  ==========================================
name                                   kind     what
=====================================  =======  ==========================================
``gpu_pool.gpus.held.<model>``         gauge    GPUs held on nodes that are up (a share
                                                counts as its fraction), as the cycle saw it
``gpu_pool.gpus.free.<model>``         gauge    GPUs free on nodes that are up
``gpu_pool.pending.<priority>``        gauge    pending requests per priority class (every
                                                class, zeros included, so a gauge drops)
``gpu_pool.oldest_wait_seconds``       gauge    the longest a pending request has waited
``gpu_pool.cycle_duration``            timer    one placement cycle, in ms
``gpu_pool.placements``                counter  requests placed
``gpu_pool.preemptions``               counter  allocations the plan preempted
``gpu_pool.dropped``                   counter  placements lost to a racing scheduler
``gpu_pool.releases.<outcome>``        counter  GPU tasks ended (success, failed, ...)
``gpu_pool.alerts_sent``               counter  notices delivered by the alerts DAG
``gpu_pool.export_lag_seconds``        gauge    time since the last ledger export, read by
                                                each snapshot run before it exports
=====================================  =======  ==========================================

Metrics never fail the caller: an error sending one is logged and dropped.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from gpu_pool.model import MILLI_PER_GPU, NodeState, PriorityClass

PREFIX = "gpu_pool"
_log = logging.getLogger(__name__)
_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]+")


def label(value: object) -> str:
    """A name part StatsD and Airflow's stat-name check accept (``A100 80GB`` → ``A100_80GB``)."""
    return _UNSAFE.sub("_", str(value)).strip("_") or "none"


def fleet_gauges(snapshot: Any) -> dict[str, float]:
    """The gauges of one :class:`gpu_pool.engine.types.Snapshot`."""
    held: dict[str, float] = defaultdict(float)
    total: dict[str, float] = defaultdict(float)
    up = {n.name: n for n in snapshot.nodes if n.state is NodeState.UP}
    for node in up.values():
        if node.gpu_model is not None:
            total[label(node.gpu_model)] += node.gpu_count
    for a in snapshot.allocations:
        node = up.get(a.node)
        if node is not None and node.gpu_model is not None:
            held[label(node.gpu_model)] += a.gpu_milli_total / MILLI_PER_GPU
    gauges: dict[str, float] = {}
    for model in sorted(total):
        gauges[f"{PREFIX}.gpus.held.{model}"] = round(held[model], 3)
        gauges[f"{PREFIX}.gpus.free.{model}"] = round(total[model] - held[model], 3)
    pending = {p: 0 for p in PriorityClass}
    oldest = 0.0
    for r in snapshot.requests:
        pending[r.priority] += 1
        if r.submitted_at is not None:
            oldest = max(oldest, (snapshot.now - r.submitted_at).total_seconds())
    for priority, count in pending.items():
        gauges[f"{PREFIX}.pending.{priority.value}"] = count
    gauges[f"{PREFIX}.oldest_wait_seconds"] = round(oldest, 3)
    return gauges


class Metrics:
    """Sends gpu-pool's metrics. ``where``: ``scheduler`` (the executor, in the scheduler
    process: Airflow core's stats) or ``task`` (a DAG's task: the task SDK's stats); each
    process's stats are configured by Airflow itself. ``stats`` overrides (tests)."""

    def __init__(self, where: str = "scheduler", stats: Any | None = None) -> None:
        if where not in ("scheduler", "task"):
            raise ValueError(f"where: got {where!r}; expected 'scheduler' or 'task'")
        self.where = where
        self._stats = stats

    @cached_property
    def enabled(self) -> bool:
        """Whether the deployment sends metrics at all (``[metrics] statsd_on`` or
        ``otel_on``); work done only for metrics is skipped when it does not."""
        if self._stats is not None:
            return True
        if self.where == "task":
            from airflow.sdk.configuration import conf
        else:
            from airflow.configuration import conf
        return (conf.getboolean("metrics", "statsd_on", fallback=False)
                or conf.getboolean("metrics", "otel_on", fallback=False))

    @property
    def stats(self) -> Any:
        if self._stats is None:
            if self.where == "task":
                from airflow.sdk.observability import stats
            else:
                from airflow.observability import stats
            self._stats = stats
        return self._stats

    def _send(self, kind: str, name: str, value: float | timedelta) -> None:
        try:
            if kind == "gauge":
                self.stats.gauge(name, value)
            elif kind == "incr":
                self.stats.incr(name, count=int(value))
            else:
                self.stats.timing(name, value)
        except Exception:  # metrics must never stall the scheduler or fail a task
            _log.debug("gpu-pool metric %s not sent", name, exc_info=True)

    def gauges(self, values: Mapping[str, float]) -> None:
        for name, value in values.items():
            self._send("gauge", name, value)

    def cycle(self, report: Any) -> None:
        """After one placement cycle (:class:`~gpu_pool.executor_support.cycle.CycleReport`)."""
        self._send("timing", f"{PREFIX}.cycle_duration", timedelta(seconds=report.seconds))
        for name, items in (("placements", report.placed), ("preemptions", report.preempted),
                            ("dropped", report.dropped)):
            if items:
                self._send("incr", f"{PREFIX}.{name}", len(items))
        self.gauges(getattr(report, "gauges", None) or {})

    def release(self, outcome: object) -> None:
        self._send("incr", f"{PREFIX}.releases.{label(getattr(outcome, 'value', outcome))}", 1)

    def alerts_sent(self, count: int) -> None:
        if count:
            self._send("incr", f"{PREFIX}.alerts_sent", count)

    def export_lag(self, last_export: datetime | None, now: datetime) -> float | None:
        """Seconds since the last export (None, and nothing sent, before the first)."""
        if last_export is None:
            return None
        lag = max(0.0, (now - last_export).total_seconds())
        self._send("gauge", f"{PREFIX}.export_lag_seconds", lag)
        return lag
