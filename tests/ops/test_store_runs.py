"""The chores against a real store (SQLite and PostgreSQL) and real SMTP/HTTP/S3 servers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpu_pool.model import AllocationState, Outcome
from gpu_pool.notify import EmailChannel, TeamChannels
from gpu_pool.ops.config import OpsConfig
from gpu_pool.ops.records import OpsRecords
from gpu_pool.ops.runs import run_alerts, run_sweep

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
H = timedelta(hours=1)
DAY = timedelta(days=1)


def test_alerts_from_the_store_once(fleet, store, smtp_server, webhook) -> None:
    fleet.team("vision", email="vision@example.org", webhook=webhook.url)
    fleet.node("n1")
    fleet.quota("vision", 4, NOW - 30 * DAY, NOW + 5 * DAY, gpu_hour_budget=100)
    fleet.run("vision-long", "vision", 2, NOW - 30 * H, time_limit=10 * DAY)  # 60 GPU-h so far
    channels = TeamChannels(EmailChannel(smtp_server.host, smtp_server.port))
    first = run_alerts(store, channels, OpsConfig(), NOW)
    assert sorted(k.kind for k, _ in first.sent) == ["quota_expiring", "run_past_expiry"]
    subjects = sorted(str(m["Subject"]) for _, m in smtp_server.messages)
    assert any("expires within 5 days" in s for s in subjects)
    assert any("vision-long would outlive its quota" in s for s in subjects)
    # 6 more hours running: 72 GPU-h of 100 -> not yet 80%; 10 more hours: 92 -> 90%
    assert run_alerts(store, channels, OpsConfig(), NOW + 6 * H).sent == ()
    later = run_alerts(store, channels, OpsConfig(), NOW + 16 * H)
    assert [(k.kind, k.threshold) for k, _ in later.sent] == [("budget", 90)]
    assert len(webhook.posts) == 3 and len(smtp_server.messages) == 3
    # extending the quota stops the expiry series; the budget notice is not repeated
    q = store.list_quotas()[0]
    from dataclasses import replace

    store.set_quota(replace(q, expires_at=NOW + 90 * DAY), "test")
    assert run_alerts(store, channels, OpsConfig(), NOW + 17 * H).sent == ()


def test_sweep_never_releases_live_tasks(fleet, store) -> None:
    fleet.team("vision")
    fleet.node("n1", gpus=8)
    for name in ("alive", "done", "vanished", "fresh", "by-hand"):
        at = NOW - (2 * 60 * timedelta(seconds=1) if name == "fresh" else 3 * H)
        fleet.run(name, "vision", 1, at, link=name != "by-hand")
    airflow = {"alive": "running", "done": "success", "fresh": "removed"}

    def liveness(links):
        # what the Task SDK answers: a state per task of the run; missing ones are removed
        return {name: (airflow.get(link.task_id, "removed") if link.dag_id else None)
                for name, link in links.items()}

    result = run_sweep(store, liveness, None, OpsConfig(), NOW)
    assert sorted(h.request_name for h in result.plan.dead) == ["done", "vanished"]
    active = sorted({a.request_name for a in store.active_allocations()})
    assert active == ["alive", "by-hand", "fresh"]
    ledger = {e.request_name: e for e in store.ledger()}
    assert {n: ledger[n].outcome for n in ledger} == {"done": Outcome.RECLAIMED,
                                                     "vanished": Outcome.RECLAIMED}
    recs = {r.request_name: r for r in OpsRecords(store.engine).reclaims()}
    assert set(recs) == {"done", "vanished"}
    assert recs["done"].action == "released" and recs["done"].held_seconds == 3 * 3600
    assert recs["done"].team == "vision" and "success" in recs["done"].reason
    # sweeping again while the live ones keep running changes nothing
    again = run_sweep(store, liveness, None, OpsConfig(), NOW + 5 * timedelta(minutes=1))
    assert again.records == () and sorted(again.plan.kept) == active
    assert all(a.state is AllocationState.ACTIVE for a in store.active_allocations())


@pytest.mark.parametrize("action", ["warn", "end"])
def test_idle_holds(fleet, store, webhook, action: str) -> None:
    from gpu_pool.probe import GpuReading

    fleet.team("vision", webhook=webhook.url)
    fleet.node("n1", gpus=2)
    fleet.run("idler", "vision", 1, NOW - 3 * H)
    fleet.run("busy", "vision", 1, NOW - 3 * H)
    held = {a.request_name: a.gpu_indices[0] for a in store.active_allocations()}
    for minute in range(0, 61, 5):
        readings = [GpuReading(held["idler"], "A100", "A100", 81920, 1000, 1.0, 40.0, "u0"),
                    GpuReading(held["busy"], "A100", "A100", 81920, 60000, 95.0, 70.0, "u1")]
        store.record_gpu_readings("n1", readings, NOW - timedelta(minutes=60 - minute))
    config = OpsConfig(idle_minutes=60, idle_action=action)
    channels = TeamChannels(email=None)
    live = lambda links: {n: "running" for n in links}  # noqa: E731
    result = run_sweep(store, live, channels, config, NOW)
    assert [h.request_name for h in result.plan.idle] == ["idler"]
    (rec,) = result.records
    assert rec.action == ("idle_warned" if action == "warn" else "idle_ended")
    assert rec.idle_gpu_hours == pytest.approx(1.0)
    assert len(webhook.posts) == 1 and webhook.posts[0]["gpu_pool"]["kind"] == "idle_gpus"
    names = {a.request_name for a in store.active_allocations()}
    assert names == ({"idler", "busy"} if action == "warn" else {"busy"})
    rerun = run_sweep(store, live, channels, config, NOW + timedelta(minutes=5))
    assert rerun.records == () and len(webhook.posts) == 1


def test_sweeps_racing_live_tasks_release_none_of_them(fleet, store) -> None:
    """Sweeps run back to back while tasks start, run and finish in another thread. Any
    release the sweep makes is checked, at that instant, against the task's true state."""
    import threading
    import time

    fleet.team("vision")
    fleet.node("n1", gpus=8)
    truth: dict[str, str] = {}
    lock = threading.Lock()
    violations: list[str] = []
    sweeps = [0]

    def tasks() -> None:
        for i in range(10):
            name = f"t{i}"
            with lock:
                truth[name] = "queued"
            fleet.run(name, "vision", 1, datetime.now(UTC))
            with lock:
                truth[name] = "running"
            time.sleep(0.2)
            with lock:
                truth[name] = "success"
            store.release_request(name, Outcome.SUCCESS, "executor", "task succeeded",
                                  datetime.now(UTC))

    class Guarded:
        """The store, with a check at the moment the sweep releases something."""

        def __getattr__(self, attr: str):
            return getattr(store, attr)

        def release_request(self, name, *args, **kwargs):
            with lock:
                if truth.get(name) in ("queued", "running"):
                    violations.append(f"{name} released while {truth[name]}")
            return store.release_request(name, *args, **kwargs)

    def liveness(links):
        with lock:
            return {n: truth.get(link.task_id, "removed") for n, link in links.items()}

    worker = threading.Thread(target=tasks)
    worker.start()
    config = OpsConfig(reclaim_grace_minutes=0)
    while worker.is_alive():
        run_sweep(Guarded(), liveness, None, config, datetime.now(UTC))
        sweeps[0] += 1
    worker.join()
    assert violations == []
    assert sweeps[0] >= 5
    assert store.active_allocations() == []
    outcomes = {e.request_name: e.outcome for e in store.ledger()}
    assert set(outcomes) == {f"t{i}" for i in range(10)}
    assert set(outcomes.values()) <= {Outcome.SUCCESS, Outcome.RECLAIMED}
