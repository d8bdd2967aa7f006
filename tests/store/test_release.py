"""Release: allocations end, one ledger entry each, idempotent; the ledger and event reads."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from tests.store.factories import make_node, part, place, plan_of, seed, submit

from gpu_pool.errors import NotFoundError
from gpu_pool.model import AllocationState, GpuModelInfo, Outcome, Policy, RequestState
from gpu_pool.store import Store


@pytest.mark.parametrize(("outcome", "state"), [
    (Outcome.SUCCESS, AllocationState.RELEASED),
    (Outcome.FAILED, AllocationState.RELEASED),
    (Outcome.RECLAIMED, AllocationState.RELEASED),
    (Outcome.TIMED_OUT, AllocationState.EXPIRED),
    (Outcome.PREEMPTED, AllocationState.PREEMPTED),
])
def test_release_ends_allocations_per_outcome(store: Store, now: datetime, outcome: Outcome,
                                              state: AllocationState) -> None:
    seed(store)
    submit(store, "r1", now, gpus=2)
    place(store, "r1", "n1", [0, 1], now)
    later = now + timedelta(hours=2)
    (entry,) = store.release_request("r1", outcome, "exec", "task ended", later,
                                     metrics={"loss": 0.25})
    assert (entry.outcome, entry.started_at, entry.ended_at, entry.metrics) == (
        outcome, now, later, {"loss": 0.25})
    assert [a.state for a in store.allocations_of("r1")] == [state]
    assert store.active_allocations() == []
    assert store.request_state("r1") is RequestState.FINISHED
    assert store.ledger() == [entry]
    assert [e.kind for e in store.events(subject="r1")][-1] == "request.finished"


def test_release_prices_gpu_hours_from_the_policy(store: Store, now: datetime) -> None:
    seed(store, nodes=[make_node("n1", 4, "T4")])
    submit(store, "share", now, gpu_milli=250)
    submit(store, "pair", now, gpus=2)
    place(store, "share", "n1", [0], now, milli=250)
    place(store, "pair", "n1", [1, 2], now)
    policy = Policy(gpu_models=(GpuModelInfo("T4", 16 * 1024, 0.5),))
    later = now + timedelta(hours=4)
    (share,) = store.release_request("share", Outcome.SUCCESS, "t", "done", later, policy)
    (pair,) = store.release_request("pair", Outcome.SUCCESS, "t", "done", later, policy)
    assert (share.gpus, share.gpu_hours, share.cost) == (0.25, 1.0, 0.5)
    assert (pair.gpus, pair.gpu_hours, pair.cost) == (2.0, 8.0, 4.0)
    assert pair.price_per_gpu_hour == 0.5


def test_release_is_idempotent(store: Store, now: datetime) -> None:
    seed(store)
    submit(store, "gang", now, gpus=2, nodes=2)
    store.import_nodes([make_node("n3", 2)], "t")
    store.apply_plan(plan_of(("gang", [part("n1", [0, 1]), part("n3", [0, 1])])), now, "s")
    first = store.release_request("gang", Outcome.SUCCESS, "t", "done", now + timedelta(hours=1))
    assert len(first) == 2
    events_before = len(store.events())
    assert store.release_request("gang", Outcome.FAILED, "t", "again", now) == []
    assert len(store.ledger()) == 2 and len(store.events()) == events_before
    with pytest.raises(NotFoundError):
        store.release_request("ghost", Outcome.SUCCESS, "t", "x", now)


def test_released_gpus_can_be_placed_again(store: Store, now: datetime) -> None:
    seed(store)
    submit(store, "a", now)
    submit(store, "b", now)
    place(store, "a", "n1", [0], now)
    assert place(store, "b", "n1", [0], now).dropped
    store.release_request("a", Outcome.SUCCESS, "t", "done", now)
    assert place(store, "b", "n1", [0], now).placed == ["b"]


def test_release_of_a_pending_request_finishes_it_without_ledger(store: Store,
                                                                 now: datetime) -> None:
    seed(store)
    submit(store, "r1", now)
    assert store.release_request("r1", Outcome.FAILED, "t", "gave up", now) == []
    assert store.request_state("r1") is RequestState.FINISHED
    assert store.ledger() == []


def test_ledger_and_events_filters(store: Store, now: datetime, clock) -> None:  # noqa: ANN001
    seed(store)
    for i, name in enumerate(("a", "b", "c")):
        submit(store, name, now)
        place(store, name, "n1", [i], now)
        store.release_request(name, Outcome.SUCCESS, "t", "done", now + timedelta(hours=i + 1))
    assert [e.request_name for e in store.ledger()] == ["a", "b", "c"]
    assert [e.request_name for e in store.ledger(since=now + timedelta(hours=2))] == ["b", "c"]
    assert [e.request_name for e in store.ledger(until=now + timedelta(hours=2))] == ["a"]
    assert [e.kind for e in store.events(subject="c", limit=2)] == ["request.placed",
                                                                    "request.finished"]
    since = store.events(since=now + timedelta(hours=3))
    assert {e.kind for e in since} == {"allocation.released", "request.finished"}
    assert all(e.at.tzinfo is not None for e in store.events())
