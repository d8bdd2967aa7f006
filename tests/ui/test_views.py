"""What the API shows, computed in-process on both store databases (SQLite, PostgreSQL).

The api-server tests run on SQLite; these run :mod:`gpu_pool.api.views` and
:mod:`gpu_pool.api.queries` on a smaller seed against both dialects, plus the pure parts:
quota alert levels at the thresholds, task-instance links, and the "GPU placement" extra
link from an Airflow task instance to the page.
"""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import quote
from uuid import uuid4

import pytest
from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).parent))

from seed import seed  # noqa: E402

from gpu_pool.api import views  # noqa: E402
from gpu_pool.model import Policy, Purpose, Quota  # noqa: E402
from gpu_pool.store import Store  # noqa: E402

PG_SERVER = os.environ.get("GPU_POOL_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def _quota(days_left: float) -> Quota:
    return Quota(team="t", purpose=Purpose.TRAINING, gpus=1, valid_from=NOW - timedelta(days=9),
                 expires_at=NOW + timedelta(days=days_left))


@pytest.mark.parametrize(("days_left", "level"), [
    (40, "ok"), (15.01, "ok"), (15, "amber"), (7.5, "amber"), (7, "red"), (1.01, "red"),
    (1, "final"), (0.01, "final"), (0, "expired"), (-3, "expired"),
])
def test_quota_alert_levels_at_the_thresholds(days_left, level):
    assert views.alert_level(_quota(days_left), NOW, (15, 7, 1)) == level


def test_a_quota_not_yet_valid_is_future():
    q = Quota(team="t", purpose=Purpose.TRAINING, gpus=1, valid_from=NOW + timedelta(days=1),
              expires_at=NOW + timedelta(days=30))
    assert views.alert_level(q, NOW, (15, 7, 1)) == "future"


@pytest.mark.parametrize(("row", "url"), [
    ({"dag_id": "d", "task_id": "t", "run_id": "r 1", "map_index": -1}, "/dags/d/runs/r%201/tasks/t"),
    ({"dag_id": "d", "task_id": "g.t", "run_id": "r", "map_index": 3},
     "/dags/d/runs/r/tasks/g.t/mapped/3"),
    ({"dag_id": "d", "task_id": "t", "run_id": None, "map_index": None}, None),
])
def test_task_link_points_at_the_airflow_task_instance(row, url):
    assert views.task_link(row).airflow_url == url


def test_a_cli_request_has_no_task_link():
    assert views.task_link({"dag_id": None, "task_id": None}) is None


def test_extra_link_from_a_task_instance_to_its_placement():
    from airflow.models.taskinstancekey import TaskInstanceKey

    from gpu_pool.plugin import GpuPlacementLink, GpuPoolPlugin

    link = GpuPlacementLink()
    key = TaskInstanceKey(dag_id="train_llm", task_id="finetune", run_id="manual__1", try_number=1)
    assert link.get_link(None, ti_key=key) == (
        "/gpu-pool/?dag_id=train_llm&task_id=finetune&run_id=manual__1#placement")
    mapped = TaskInstanceKey("d", "t", "r", 1, 4)
    assert link.get_link(None, ti_key=mapped).endswith("&map_index=4#placement")
    class Cpu:
        executor = "LocalExecutor"

    class Gpu:
        executor = "GpuPool"

    assert link.get_link(Cpu(), ti_key=key) == ""
    assert link.get_link(Gpu(), ti_key=key).startswith("/gpu-pool/?dag_id=train_llm")
    assert GpuPoolPlugin.global_operator_extra_links[0].name == "GPU placement"


@pytest.fixture(params=["sqlite", "postgresql"])
def seeded(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.db'}"
        cleanup = None
    else:
        name = f"gpu_pool_ui_{uuid4().hex[:8]}"
        admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(text(f'CREATE DATABASE "{name}"'))
        except Exception as error:
            pytest.fail(f"PostgreSQL at {PG_SERVER} is needed: {error}")
        url = f"{PG_SERVER}/{name}"

        def cleanup() -> None:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()
    store = Store.from_url(url)
    store.migrate()
    now = datetime.now(UTC)
    info = seed(store, now, extra_nodes=48, bulk=20)
    yield store, now, info
    store.close()
    if cleanup:
        cleanup()


def test_views_agree_with_the_store_on_both_databases(seeded):
    store, now, info = seeded
    fleet = views.fleet(store, now)
    assert fleet.summary.nodes == info["nodes"] == 54
    assert sum(fleet.summary.by_status.values()) == info["gpus"]
    nodes = {n.name: n for g in fleet.groups for n in g.nodes}
    assert nodes["ap-south-t4-003"].state == "down"
    assert nodes["eu-a100-2"].state_reason == "kernel upgrade"
    held = {(a.node, i) for a in store.active_allocations() for i in a.gpu_indices}
    shown = {(n.name, g.index) for n in nodes.values() for g in n.gpus if g.holders}
    assert shown == held

    queue = views.queue(store, now)
    assert {i.name for i in queue.items} == {r.name for r in store.pending_requests()}
    assert all((i.reason_code, i.reason_message) == store.request_reason(i.name)
               for i in queue.items)

    quotas = {(q.team, q.purpose): q for q in views.quotas(store, Policy(), now).quotas}
    assert quotas[("vision", "training")].alert == "red"
    assert quotas[("research", "pretraining")].alert == "expired"

    usage = views.usage(store, Policy(), now, "day")
    ledger_hours = sum(e.gpu_hours for e in store.ledger(since=now - timedelta(days=2)))
    assert sum(t.gpu_hours for t in usage.teams) == pytest.approx(ledger_hours, rel=1e-3)
    assert [m.request for m in usage.cross_zone] == ["platform-xzone-embed"]
    moved_to = store.get_node(store.allocations_of("platform-xzone-embed")[0].node)
    assert usage.cross_zone[0].to_zone == moved_to.zone
    assert usage.cross_zone[0].transfer_s == pytest.approx(300 * 1024 / moved_to.bandwidth_mb_s,
                                                           rel=1e-3)

    policy = views.policy(store)
    assert (policy.version, policy.set_by, policy.comment) == (
        1, "olga", "longer grace for checkpoints")
    changed = [(v.key, v.value, v.source) for v in policy.values if not v.is_default]
    assert changed == [("preemption_grace", "90s", store.policy_history()[0].label)]
    assert [h.version for h in policy.history] == [1]

    placed = views.task_link(
        {"dag_id": "train_llm", "task_id": "finetune", "run_id": "manual__2026-12-01T08:00:00+00:00"})
    assert placed.airflow_url.endswith("/tasks/finetune")
    assert quote("manual__2026-12-01T08:00:00+00:00", safe="") in placed.airflow_url


def test_fair_share_on_the_fleet_and_queue_views(seeded):
    store, now, _ = seeded
    shares = views.fleet(store, now).fair_share
    assert sorted(f.team for f in shares) == sorted(t.name for t in store.list_teams())
    assert [f.rank for f in shares] == list(range(1, len(shares) + 1))
    used = [f.decayed_gpu_hours for f in shares]
    assert used == sorted(used) and used[-1] > 0
    # Decayed use never exceeds the plain GPU-hours held (ledger and active, up to now).
    plain = {}
    for e in store.ledger():
        plain[e.team] = plain.get(e.team, 0.0) + e.gpu_hours
    for a in store.active_allocations():
        hours = max((now - a.started_at).total_seconds(), 0) / 3600
        plain[a.team] = plain.get(a.team, 0.0) + a.gpu_milli_total / 1000 * hours
    assert all(f.decayed_gpu_hours <= plain.get(f.team, 0.0) + 1e-3 for f in shares)
    by_team = {f.team: f.decayed_gpu_hours for f in shares}
    queue = views.queue(store, now)
    assert queue.fair_share == shares
    assert all(i.team_decayed_gpu_hours == by_team[i.team] for i in queue.items)
    off = Policy(fair_share_half_life=timedelta(0))
    assert views.fleet(store, now, off).fair_share == []
