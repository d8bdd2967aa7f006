"""The period's cross-zone moves as the API shows them, on both store databases: a move the
engine made through the real store, and whether it paid once the home zone's hold ended."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import pytest
from sqlalchemy import create_engine, text

from gpu_pool.api import views
from gpu_pool.engine import plan
from gpu_pool.model import (
    Dataset,
    Gpu,
    Node,
    Outcome,
    Policy,
    Purpose,
    Quota,
    Request,
    Team,
)
from gpu_pool.store import Store

PG_SERVER = os.environ.get("GPU_POOL_TEST_PG", "postgresql://postgres@127.0.0.1:5432")
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = Policy()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request, tmp_path):
    if request.param == "sqlite":
        url, cleanup = f"sqlite:///{tmp_path / 'store.db'}", None
    else:
        name = f"gpu_pool_xz_{uuid4().hex[:8]}"
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
    s = Store.from_url(url)
    s.migrate()
    yield s
    s.close()
    if cleanup:
        cleanup()


def _node(name: str, zone: str) -> Node:
    return Node(name, tuple(Gpu(i, "A100", 80 * 1024) for i in range(4)), 64_000, 512 * 1024,
                zone=zone, bandwidth_mb_s=1000.0)


def _cycle(store: Store, at: datetime, policy: Policy):  # noqa: ANN202 - the Plan
    result = plan(store.load_snapshot(policy, at))
    store.apply_plan(result, now=at, actor="t", policy=policy)
    return result


def _moved(store: Store, blocker_ends: timedelta | None, policy: Policy = POLICY) -> None:
    """blocker holds eu's only node from NOW-3h (time limit 5 h); mover (500 GiB in eu)
    arrives at NOW-2h, expects to wait 4 h and moves to us (512 s transfer). blocker ends
    ``blocker_ends`` after the move (None: still running)."""
    store.upsert_team(Team("ml"), actor="t")
    store.import_nodes([_node("e1", "eu"), _node("u1", "us")], actor="t")
    store.set_quota(Quota("ml", Purpose.TRAINING, 8, NOW - timedelta(days=1),
                          NOW + timedelta(days=30)), actor="t")
    start = NOW - timedelta(hours=3)
    store.submit_request(Request("blocker", "ml", gpus=4, time_limit=timedelta(hours=5),
                                 dataset=Dataset("s3://eu/b", "eu", 1.0), submitted_at=start),
                         actor="t", now=start)
    _cycle(store, start, policy)
    moved_at = NOW - timedelta(hours=2)
    store.submit_request(Request("mover", "ml", gpus=4, time_limit=timedelta(hours=5),
                                 dataset=Dataset("s3://eu/m", "eu", 500.0),
                                 submitted_at=moved_at), actor="t", now=moved_at)
    placed = _cycle(store, moved_at, policy).placement_of("mover")
    assert placed is not None and placed.expected_wait_saved_s == 4 * 3600
    assert [a.node for a in store.allocations_of("mover")] == ["u1"]
    if blocker_ends is not None:
        store.release_request("blocker", Outcome.SUCCESS, actor="t",
                              now=moved_at + blocker_ends)


@pytest.mark.parametrize(("blocker_ends", "paid", "saved"), [
    (timedelta(minutes=5), "no", 300.0),  # eu had room 5 min later: the 512 s move lost
    (timedelta(hours=1), "yes", 3600.0),
    (None, "yes", 7200.0),  # eu still full: at least 2 h saved so far
])
def test_usage_shows_each_move_and_whether_it_paid(store, blocker_ends, paid, saved) -> None:
    _moved(store, blocker_ends)
    usage = views.usage(store, POLICY, NOW, "day")
    [move] = usage.cross_zone
    assert (move.request, move.from_zone, move.to_zone, move.size_gib) == (
        "mover", "eu", "us", 500.0)
    assert move.transfer_s == pytest.approx(512.0)
    assert move.paid == paid and move.actual_wait_saved_s == pytest.approx(saved)
    assert (move.home_room_at is None) is (blocker_ends is None)
    # what the store recorded of the engine's expectation (None: not recorded)
    recorded = store.allocations_of("mover")[0].expected_wait_saved_s
    assert move.expected_wait_saved_s == (recorded or None)
    assert usage.cross_zone_summary == (
        f"1 cross-zone move, 0.1 h of transfer: {int(paid == 'yes')} paid, "
        f"{int(paid == 'no')} did not")


def test_a_zone_link_sets_the_transfer(store) -> None:
    """A slow link (100 MB/s): 5120 s, still paid by the 4 h wait (margin 0.5, cap raised)."""
    policy = Policy(zone_links={("eu", "us"): 100.0}, max_transfer_seconds=6000)
    _moved(store, None, policy)
    [move] = views.usage(store, policy, NOW, "day").cross_zone
    assert move.transfer_s == pytest.approx(5120.0) and move.paid == "yes"
