"""Requests: submission with its refusals, states, readiness, cancellation, the external link."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from tests.store.factories import make_node, make_request, place, seed, submit

from gpu_pool.errors import NotFoundError, SpecError
from gpu_pool.model import Dataset, PriorityClass, Purpose, RequestState
from gpu_pool.store import Store


def test_submit_round_trips_every_field(store: Store, now: datetime) -> None:
    seed(store)
    request = make_request(
        "r1", "vision", purpose=Purpose.INFERENCE, priority=PriorityClass.HIGH, gpus=2,
        gpu_models=frozenset({"A100", "H100"}), min_gpu_memory_mib=40 * 1024, cpu_milli=8000,
        memory_mib=64 * 1024, dataset=Dataset("s3://d/x", "z1", 12.5), data_ready=False,
        time_limit=timedelta(hours=6), estimated_runtime=timedelta(hours=2), preemptible=True)
    saved = store.submit_request(request, actor="cli", now=now)
    assert saved.id and len(saved.id) == 32
    assert saved.submitted_at == now
    assert saved == request.__class__(**{**request.__dict__, "id": saved.id, "submitted_at": now})
    assert store.get_request("r1") == saved
    assert store.request_state("r1") is RequestState.PENDING
    assert store.get_request("nope") is None and store.request_state("nope") is None
    (event,) = store.events(subject="r1")
    assert (event.kind, event.actor, event.at) == ("request.submitted", "cli", now)


def test_submit_keeps_a_given_submitted_at_and_orders_by_it(store: Store, now: datetime) -> None:
    seed(store)
    submit(store, "late", now)
    store.submit_request(make_request("early", submitted_at=now - timedelta(hours=1)), "t", now)
    submit(store, "later", now + timedelta(seconds=1))
    assert [r.name for r in store.pending_requests()] == ["early", "late", "later"]
    assert store.get_request("early").submitted_at == now - timedelta(hours=1)


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"team": "ghost"}, "team", "a known team: nlp, vision"),
    ({"gpus": 9}, "gpus", "largest such node has 4"),
    ({"gpu_models": frozenset({"H100"})}, "gpu_models", "the fleet has A100, T4"),
    ({"nodes": 3, "gpus": 2}, "nodes", "the fleet has 2"),
    ({"cpu_milli": 1_000_000}, "cpu", "CPU cores"),
    ({"memory_mib": 10**9}, "memory", "MiB RAM"),
    ({"min_gpu_memory_mib": 200 * 1024}, "min_gpu_memory", ">= 200 GiB"),
])
def test_submit_refuses_with_the_field_named(store: Store, now: datetime, fields: dict,
                                             field: str, words: str) -> None:
    seed(store)
    with pytest.raises(SpecError) as caught:
        store.submit_request(make_request("r1", **fields), actor="t", now=now)
    assert caught.value.field == field
    assert words in str(caught.value)
    assert store.get_request("r1") is None and store.events(subject="r1") == []


def test_submit_refuses_a_duplicate_name(store: Store, now: datetime) -> None:
    seed(store)
    submit(store, "r1", now)
    with pytest.raises(SpecError) as caught:
        submit(store, "r1", now)
    assert (caught.value.field, caught.value.value) == ("name", "r1")
    assert "pending" in caught.value.expected


def test_submit_on_an_empty_fleet_waits_instead_of_refusing(store: Store, now: datetime) -> None:
    seed(store, nodes=[make_node("tiny", 1)])
    with store.engine.begin() as conn:  # an empty fleet: remove the only node
        from sqlalchemy import text

        conn.execute(text("DELETE FROM gpus"))
        conn.execute(text("DELETE FROM events"))
        conn.execute(text("DELETE FROM nodes"))
    assert submit(store, "r1", now, gpus=8).name == "r1"


def test_external_link_from_mapping_or_keywords(store: Store, now: datetime) -> None:
    seed(store)
    link = {"dag_id": "train", "task_id": "fit", "run_id": "manual__1", "map_index": -1,
            "try_number": 2, "executor_key": "0193-abc"}
    store.submit_request(make_request("a"), actor="exec", now=now, external=link)
    store.submit_request(make_request("b"), actor="exec", **link)  # the executor's call
    unset = {"template": None, "setup": None}  # no template used
    assert store.request_external("a") == {**link, **unset} == store.request_external("b")
    assert store.get_request("b").submitted_at is not None
    assert store.events(subject="a")[0].data["dag_id"] == "train"
    with pytest.raises(SpecError) as caught:
        store.submit_request(make_request("c"), actor="x", now=now, external={"dag": "x"})
    assert caught.value.field == "external" and "dag_id" in caught.value.expected


def test_set_data_ready_changes_once_with_an_event(store: Store, now: datetime) -> None:
    seed(store)
    submit(store, "r1", now, data_ready=False)
    assert store.set_data_ready("r1", True, "asset-listener") is True
    assert store.set_data_ready("r1", True, "asset-listener") is False
    assert store.get_request("r1").data_ready is True
    assert [e.kind for e in store.events(subject="r1")] == ["request.submitted",
                                                            "request.data_ready"]
    with pytest.raises(NotFoundError):
        store.set_data_ready("ghost", True, "x")


def test_cancel_pending_and_running(store: Store, now: datetime) -> None:
    seed(store)
    submit(store, "waits", now)
    submit(store, "runs", now, gpus=2)
    place(store, "runs", "n1", [0, 1], now)
    assert store.cancel_request("waits", "exec", "task reset") == []
    assert store.request_state("waits") is RequestState.CANCELLED
    later = now + timedelta(hours=1)
    (entry,) = store.cancel_request("runs", "exec", "task reset", now=later)
    assert (entry.outcome, entry.gpus, entry.gpu_hours) == ("cancelled", 2.0, 2.0)
    assert store.request_state("runs") is RequestState.CANCELLED
    assert store.active_allocations() == []
    assert store.cancel_request("runs", "exec", "again") == []  # idempotent
    assert store.pending_requests() == []
    with pytest.raises(NotFoundError, match="no request named 'ghost'"):
        store.cancel_request("ghost", "exec")
