"""The database itself forbids double allocation: raw SQL that bypasses the Store fails.

Each case writes straight to the tables, as a buggy or foreign writer would, and must be
refused by the triggers, the CHECK on ``gpus.allocated_milli`` or the unique index.
"""

from __future__ import annotations

from datetime import datetime

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from tests.store.factories import place, seed, submit

from gpu_pool.model import Outcome
from gpu_pool.store import Store


def _raw_allocation(conn, allocation_id: str, request_id: str, milli: int) -> None:  # noqa: ANN001
    conn.execute(text(
        "INSERT INTO allocations (id, request_id, request_name, node, gpu_milli, cpu_milli, "
        "memory_mib, team, purpose, priority, gpu_model, preemptible, state, started_at) "
        "VALUES (:id, :rid, 'raw', 'n1', :m, 0, 0, 'nlp', 'training', 'normal', 'A100', "
        ":f, 'active', '2026-12-01 12:00:00.000000')"),
        {"id": allocation_id, "rid": request_id, "m": milli, "f": False})


def _raw_gpu(conn, allocation_id: str, idx: int, milli: int, active: bool = True) -> None:  # noqa: ANN001
    conn.execute(text("INSERT INTO allocation_gpus (allocation_id, node, gpu_index, milli, active)"
                      " VALUES (:a, 'n1', :i, :m, :act)"),
                 {"a": allocation_id, "i": idx, "m": milli, "act": active})


def _held(store: Store, idx: int) -> int:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT allocated_milli FROM gpus WHERE node = 'n1' AND idx = :i"),
                            {"i": idx}).scalar()


@pytest.fixture
def held_gpu0(store: Store, now: datetime) -> str:
    """n1/0 held whole by request 'owner'; returns the id of a second pending request."""
    seed(store)
    submit(store, "owner", now)
    place(store, "owner", "n1", [0], now)
    return submit(store, "intruder", now).id


@pytest.mark.parametrize(("milli", "idx"), [(1000, 0), (1, 0), (600, 0)])
def test_raw_insert_on_a_held_gpu_fails(store: Store, held_gpu0: str, milli: int,
                                        idx: int) -> None:
    with pytest.raises(DBAPIError), store.engine.begin() as conn:
        _raw_allocation(conn, "x1", held_gpu0, milli)
        _raw_gpu(conn, "x1", idx, milli)
    assert _held(store, 0) == 1000


def test_shares_beyond_1000_milli_fail(store: Store, held_gpu0: str) -> None:
    with store.engine.begin() as conn:
        _raw_allocation(conn, "s1", held_gpu0, 600)
        _raw_gpu(conn, "s1", 1, 600)
    assert _held(store, 1) == 600
    with pytest.raises(DBAPIError), store.engine.begin() as conn:
        _raw_allocation(conn, "s2", held_gpu0, 600)
        _raw_gpu(conn, "s2", 1, 600)
    with store.engine.begin() as conn:  # 400 more fits exactly
        _raw_allocation(conn, "s3", held_gpu0, 400)
        _raw_gpu(conn, "s3", 1, 400)
    assert _held(store, 1) == 1000


def test_reactivating_a_released_row_over_a_new_holder_fails(store: Store, held_gpu0: str,
                                                             now: datetime) -> None:
    store.release_request("owner", Outcome.SUCCESS, "t", "done", now)
    assert _held(store, 0) == 0
    place(store, "intruder", "n1", [0], now)
    with pytest.raises(DBAPIError), store.engine.begin() as conn:
        conn.execute(text("UPDATE allocation_gpus SET active = :t WHERE allocation_id IN "
                          "(SELECT id FROM allocations WHERE request_name = 'owner')"),
                     {"t": True})
    assert _held(store, 0) == 1000


def test_a_gpu_that_does_not_exist_cannot_be_allocated(store: Store, held_gpu0: str) -> None:
    with pytest.raises(DBAPIError), store.engine.begin() as conn:
        _raw_allocation(conn, "g1", held_gpu0, 1000)
        _raw_gpu(conn, "g1", 42, 1000)


def test_the_counter_stays_within_one_gpu_and_held_gpus_stay(store: Store, held_gpu0: str) -> None:
    with pytest.raises(DBAPIError), store.engine.begin() as conn:
        conn.execute(text("UPDATE gpus SET allocated_milli = 1001 WHERE node = 'n1' AND idx = 2"))
    with pytest.raises(DBAPIError), store.engine.begin() as conn:
        conn.execute(text("DELETE FROM gpus WHERE node = 'n1' AND idx = 0"))


def test_inactive_history_rows_and_deletes_keep_the_sum(store: Store, held_gpu0: str) -> None:
    with store.engine.begin() as conn:
        _raw_allocation(conn, "h1", held_gpu0, 1000)
        _raw_gpu(conn, "h1", 3, 1000, active=False)  # history: holds nothing
    assert _held(store, 3) == 0
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE allocation_gpus SET active = :t WHERE allocation_id = 'h1'"),
                     {"t": True})
    assert _held(store, 3) == 1000
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM allocation_gpus WHERE allocation_id = 'h1'"))
    assert _held(store, 3) == 0


def test_the_ledger_is_append_only(store: Store, held_gpu0: str, now: datetime) -> None:
    store.release_request("owner", Outcome.SUCCESS, "t", "done", now)
    with pytest.raises(DBAPIError), store.engine.begin() as conn:
        conn.execute(text("UPDATE ledger SET cost = 0"))
    with pytest.raises(DBAPIError), store.engine.begin() as conn:
        conn.execute(text("DELETE FROM ledger"))
    assert len(store.ledger()) == 1
