"""gpu-pool's metrics: computed from the store as a cycle sees it, sent through Airflow's own
stats — unit tests with a recording stats object, then a real StatsD receiver on 127.0.0.1
fed by Airflow's StatsD client in a scheduler-like and in a task-like process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from gpu_pool.engine import plan
from gpu_pool.executor_support.cycle import PlacementCycle
from gpu_pool.model import Outcome, Policy, Team
from gpu_pool.spec import parse_node, parse_request
from gpu_pool.store import Store
from gpu_pool.telemetry import Metrics, fleet_gauges, label


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []

    def gauge(self, name: str, value: float) -> None:
        self.calls.append(("gauge", name, value))

    def incr(self, name: str, count: int = 1) -> None:
        self.calls.append(("incr", name, count))

    def timing(self, name: str, dt: Any) -> None:
        self.calls.append(("timing", name, dt))

    def last(self, kind: str) -> dict[str, Any]:
        return {name: value for k, name, value in self.calls if k == kind}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    s.migrate()
    s.upsert_team(Team("nlp"), actor="t")
    s.import_nodes([
        parse_node({"name": "node-a", "gpu_model": "A100", "gpus": 2, "cpu": 8,
                    "memory": "64GiB", "ssh_conn_id": "gpu_node_a"}),
        parse_node({"name": "node-t", "gpu_model": "T4", "gpus": 1, "cpu": 8,
                    "memory": "64GiB", "ssh_conn_id": "gpu_node_t"})], actor="t")
    yield s
    s.close()


def test_a_cycle_reports_held_free_pending_and_the_oldest_wait(store: Store) -> None:
    now = datetime(2026, 12, 5, 12, tzinfo=UTC)
    stats = Recorder()
    cycle = PlacementCycle(store=store, policy=Policy(), planner=plan, actor="t",
                           clock=lambda: now, idle_replan_s=0, telemetry=Metrics(stats=stats))
    cycle.admit(parse_request({"name": "big", "team": "nlp", "gpus": 2,
                               "gpu_models": ["A100"]}), {})
    cycle.admit(parse_request({"name": "half", "team": "nlp", "gpu_share": 500,
                               "gpu_models": ["T4"]}), {})
    cycle.admit(parse_request({"name": "waits", "team": "nlp", "gpus": 2, "priority": "high",
                               "gpu_models": ["A100"]}), {})
    report = cycle.run({"big", "half", "waits"})
    Metrics(stats=stats).cycle(report)
    gauges = stats.last("gauge")
    # As the first cycle saw the store: nothing held yet, three pending.
    assert gauges["gpu_pool.gpus.free.A100"] == 2 and gauges["gpu_pool.gpus.held.A100"] == 0
    assert gauges["gpu_pool.pending.normal"] == 2 and gauges["gpu_pool.pending.high"] == 1
    assert gauges["gpu_pool.pending.critical"] == 0  # every class, so a gauge can drop
    counters = stats.last("incr")
    assert counters["gpu_pool.placements"] == len(report.placed) == 2
    assert set(report.placed) == {"waits", "half"}  # high priority first; big waits
    assert stats.last("timing")["gpu_pool.cycle_duration"] == timedelta(seconds=report.seconds)

    later = now + timedelta(minutes=3)
    cycle.clock = lambda: later
    cycle.mark_dirty()
    Metrics(stats=stats).cycle(cycle.run({"big"}))
    gauges = stats.last("gauge")
    assert gauges["gpu_pool.gpus.held.A100"] == 2 and gauges["gpu_pool.gpus.free.A100"] == 0
    assert gauges["gpu_pool.gpus.held.T4"] == 0.5 and gauges["gpu_pool.gpus.free.T4"] == 0.5
    assert gauges["gpu_pool.pending.normal"] == 1 and gauges["gpu_pool.pending.high"] == 0
    assert gauges["gpu_pool.oldest_wait_seconds"] == 180

    cycle.release("waits", Outcome.SUCCESS, reason="done")
    cycle.release("half", Outcome.FAILED, reason="exit 1")
    assert [(n, v) for k, n, v in stats.calls if n.startswith("gpu_pool.releases")] == [
        ("gpu_pool.releases.success", 1), ("gpu_pool.releases.failed", 1)]


def test_gauges_follow_the_store_when_nothing_is_held(store: Store) -> None:
    """A drained queue, or work another scheduler placed: the idle cycle still reads them."""
    quiet = PlacementCycle(store=store, policy=Policy(), planner=plan, actor="t",
                           idle_replan_s=0)  # no metrics: an idle cycle reads nothing for them
    cycle = PlacementCycle(store=store, policy=Policy(), planner=plan, actor="t",
                           idle_replan_s=0, telemetry=Metrics(stats=Recorder()))
    store.submit_request(parse_request({"name": "elsewhere", "team": "nlp", "gpus": 1}),
                         actor="other", now=datetime.now(UTC), policy=Policy())
    assert quiet.run(set()).gauges == {}
    report = cycle.run(set())
    assert not report.planned
    assert report.gauges == fleet_gauges(store.load_snapshot(Policy(), datetime.now(UTC))) | {
        "gpu_pool.oldest_wait_seconds": report.gauges["gpu_pool.oldest_wait_seconds"]}
    assert report.gauges["gpu_pool.pending.normal"] == 1


def test_a_failing_stats_backend_never_reaches_the_caller() -> None:
    class Broken:
        def __getattr__(self, name: str) -> Any:
            raise OSError("statsd host unreachable")

    metrics = Metrics(stats=Broken())
    metrics.release(Outcome.SUCCESS)
    metrics.alerts_sent(3)
    assert metrics.export_lag(datetime(2026, 1, 1, tzinfo=UTC),
                              datetime(2026, 1, 1, 0, 5, tzinfo=UTC)) == 300


def test_metrics_are_enabled_by_airflows_metrics_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "False")
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_ON", "False")
    assert Metrics("scheduler").enabled is False
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    assert Metrics("scheduler").enabled is True
    assert Metrics(stats=Recorder()).enabled is True


def test_names_are_safe_for_statsd() -> None:
    assert label("A100 80GB/SXM") == "A100_80GB_SXM"
    assert label("") == "none"
    with pytest.raises(ValueError, match="where: got 'worker'"):
        Metrics("worker")


SCRIPT = r"""
import sys
from datetime import UTC, datetime
from gpu_pool.engine import plan
from gpu_pool.executor_support.cycle import PlacementCycle
from gpu_pool.model import Outcome, Policy, Team
from gpu_pool.spec import parse_node, parse_request
from gpu_pool.store import Store
from gpu_pool.telemetry import Metrics

where = sys.argv[2]
if where == "scheduler":  # as BaseExecutor.__init__ configures Airflow core's stats
    from airflow.configuration import conf
    from airflow.observability.metrics import stats_utils
    from airflow._shared.observability.metrics import stats
else:  # as the task runner configures the task SDK's
    from airflow.sdk.configuration import conf
    from airflow.sdk.observability.metrics import stats_utils
    from airflow.sdk._shared.observability.metrics import stats
stats.initialize(factory=stats_utils.get_stats_factory(),
                 export_legacy_names=conf.getboolean("metrics", "legacy_names_on"))
metrics = Metrics(where)
if where == "scheduler":
    store = Store.from_url(sys.argv[1]); store.migrate()
    store.upsert_team(Team("nlp"), actor="t")
    store.import_nodes([parse_node({"name": "n", "gpu_model": "H100", "gpus": 4, "cpu": 8,
                                    "memory": "64GiB", "ssh_conn_id": "c"})], actor="t")
    cycle = PlacementCycle(store=store, policy=Policy(), planner=plan, actor="t",
                           idle_replan_s=0, telemetry=metrics)
    cycle.admit(parse_request({"name": "r", "team": "nlp", "gpus": 3}), {})
    metrics.cycle(cycle.run({"r"}))
    cycle.mark_dirty()
    metrics.cycle(cycle.run({"r"}))
    cycle.release("r", Outcome.SUCCESS, reason="done")
else:
    metrics.alerts_sent(2)
    metrics.export_lag(datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 1, tzinfo=UTC))
print("sent")
"""


@pytest.fixture
def statsd() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    yield sock
    sock.close()


def received(sock: socket.socket) -> list[str]:
    lines: list[str] = []
    sock.settimeout(1)
    try:
        while True:
            lines.extend(sock.recv(65536).decode().splitlines())
    except TimeoutError:
        return lines


@pytest.mark.airflow
@pytest.mark.parametrize("where", ["scheduler", "task"])
def test_metrics_reach_a_real_statsd_receiver(statsd: socket.socket, tmp_path: Path,
                                              where: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({"AIRFLOW_HOME": str(tmp_path / "home"), "AIRFLOW__METRICS__STATSD_ON": "True",
                "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(statsd.getsockname()[1]),
                "AIRFLOW__METRICS__STATSD_PREFIX": "airflow"})
    done = subprocess.run([sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path / 's.db'}",
                           where], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = received(statsd)
    if where == "scheduler":
        assert "airflow.gpu_pool.placements:1|c" in lines
        assert "airflow.gpu_pool.gpus.held.H100:3.0|g" in lines  # the second cycle's view
        assert "airflow.gpu_pool.gpus.free.H100:1.0|g" in lines
        assert "airflow.gpu_pool.pending.normal:1|g" in lines  # the first cycle's view
        assert "airflow.gpu_pool.releases.success:1|c" in lines
        assert any(line.startswith("airflow.gpu_pool.cycle_duration:") and
                   line.endswith("|ms") for line in lines)
    else:
        assert "airflow.gpu_pool.alerts_sent:2|c" in lines
        assert "airflow.gpu_pool.export_lag_seconds:3600.0|g" in lines
