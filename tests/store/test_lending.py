"""Lending consents, and the sharing marks of an allocation (borrowed, off-peak, grace,
cross-zone move) from the plan to the allocation row, the snapshot and the ledger."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from tests.store.factories import part, seed, submit

from gpu_pool.engine.types import Placement, Plan, Preemption
from gpu_pool.errors import SpecError
from gpu_pool.model import Lending, Outcome, Policy
from gpu_pool.store import Store


def test_set_list_change_and_revoke_lending_with_events(store: Store, now: datetime) -> None:
    seed(store, teams=("cv", "nlp", "speech"))
    assert store.lending() == []
    saved = store.set_lending(Lending("cv", frozenset({"nlp"}), 4.0), "alice")
    assert (saved.team, saved.to, saved.limit_gpus, saved.set_by) == (
        "cv", frozenset({"nlp"}), 4.0, "alice")
    assert saved.set_at == now
    store.set_lending(Lending("nlp", frozenset()), "bob")
    changed = store.set_lending(Lending("cv", None), "carol")
    assert changed.to is None and changed.limit_gpus is None
    assert [(x.team, x.to) for x in store.lending()] == [("cv", None), ("nlp", frozenset())]
    assert store.load_snapshot(Policy(), now).lending == tuple(store.lending())
    revoked = store.revoke_lending("cv", "dave")
    assert revoked is not None and revoked.to is None
    assert store.revoke_lending("cv", "dave") is None  # already the default
    assert [x.team for x in store.lending()] == ["nlp"]
    kinds = [(e.kind, e.actor, e.data.get("before"), e.data.get("after"))
             for e in store.events(subject="cv") if e.kind.startswith("lending.")]
    assert kinds == [
        ("lending.set", "alice", None, {"to": ["nlp"], "limit_gpus": 4.0}),
        ("lending.set", "carol", {"to": ["nlp"], "limit_gpus": 4.0},
         {"to": None, "limit_gpus": None}),
        ("lending.revoked", "dave", {"to": None, "limit_gpus": None}, None),
    ]
    assert store.events(subject="nlp")[-1].reason == "team nlp lends to nobody"


@pytest.mark.parametrize(("lending", "field"), [
    (Lending("ghost"), "team"),
    (Lending("cv", frozenset({"ghost"})), "to"),
    (Lending("cv", frozenset({"cv"})), "to"),
    (Lending("cv", None, -1.0), "limit"),
])
def test_bad_lending_is_refused_and_writes_nothing(store: Store, lending: Lending,
                                                   field: str) -> None:
    seed(store, teams=("cv", "nlp"))
    with pytest.raises(SpecError) as caught:
        store.set_lending(lending, "alice")
    assert caught.value.field == field
    assert store.lending() == []
    with pytest.raises(SpecError):
        store.revoke_lending("ghost", "alice")


def test_sharing_marks_round_trip_to_snapshot_and_ledger(store: Store, now: datetime) -> None:
    seed(store, teams=("cv", "nlp"))
    submit(store, "b", now, gpus=2, preemptible=True, grace=timedelta(seconds=45))
    submit(store, "x", now, gpus=1)
    assert store.get_request("b").grace == timedelta(seconds=45)
    plan = Plan(placements=(
        Placement("b", (part("n1", [0, 1]),), borrowed_from="cv", off_peak=True,
                  note="borrowed 2 GPUs idle in team cv's quota"),
        Placement("x", (part("n2", [0]),), cross_zone=True, transfer_seconds=90.0,
                  expected_wait_saved_s=600.0),
    ), pending=())
    result = store.apply_plan(plan, now, "sched")
    assert result.placed == ["b", "x"]
    snap = store.load_snapshot(Policy(), now + timedelta(minutes=1))
    by_name = {a.request_name: a for a in snap.allocations}
    b, x = by_name["b"], by_name["x"]
    assert (b.borrowed_from, b.off_peak, b.grace, b.transfer_s, b.preemptions) == (
        "cv", True, timedelta(seconds=45), 0.0, 0)
    assert (x.borrowed_from, x.off_peak, x.grace, x.transfer_s, x.expected_wait_saved_s) == (
        None, False, None, 90.0, 600.0)
    created = [e for e in store.events(subject=b.id) if e.kind == "allocation.created"]
    assert created[0].reason == "borrowed 2 GPUs idle in team cv's quota"
    later = now + timedelta(hours=1)
    (entry_b,) = store.release_request("b", Outcome.SUCCESS, "exec", now=later)
    (entry_x,) = store.release_request("x", Outcome.SUCCESS, "exec", now=later)
    assert (entry_b.borrowed_from, entry_b.off_peak) == ("cv", True)
    assert (entry_x.transfer_s, entry_x.expected_wait_saved_s, entry_x.cross_zone) == (
        90.0, 600.0, True)
    read = {e.request_name: e for e in store.ledger()}
    assert read["b"] == entry_b and read["x"] == entry_x


def test_preemptions_are_counted_per_request(store: Store, now: datetime) -> None:
    seed(store, teams=("cv", "nlp"))
    submit(store, "g", now, gpus=1, nodes=2, preemptible=True)
    for i in range(2):  # placed on two nodes, preempted (the gang whole), twice
        at = now + timedelta(hours=i)
        store.apply_plan(Plan(placements=(Placement("g", (part("n1", [0]), part("n2", [0]))),),
                              pending=()), at, "sched")
        (first, _second) = sorted(store.active_allocations(), key=lambda a: a.node)
        result = store.apply_plan(Plan(placements=(), pending=(), preemptions=(
            Preemption(first.id, "g", "boss", "preempted: team cv reclaimed its guarantee",
                       grace_s=120.0, kind="reclaim"),)), at + timedelta(minutes=30), "sched")
        assert result.preempted == [first.id]
    assert [r.preemptions for r in store.load_snapshot(Policy(), now).requests] == [2]
    store.apply_plan(Plan(placements=(Placement("g", (part("n1", [0]), part("n2", [0]))),),
                          pending=()), now + timedelta(hours=3), "sched")
    snap = store.load_snapshot(Policy(), now + timedelta(hours=3))
    assert [a.preemptions for a in snap.allocations] == [2, 2]


def test_quota_usage_leaves_borrowed_work_out(store: Store, now: datetime) -> None:
    from tests.store.factories import make_quota

    seed(store, teams=("cv", "nlp"))
    quota = store.set_quota(make_quota("nlp", 2, start=now - timedelta(days=1)), "admin")
    submit(store, "own", now, gpus=2)
    submit(store, "extra", now, gpus=2, preemptible=True)
    store.apply_plan(Plan(placements=(
        Placement("own", (part("n1", [0, 1]),)),
        Placement("extra", (part("n1", [2, 3]),), borrowed_from="cv")), pending=()),
        now, "sched")
    assert store.quota_usage(now) == {quota.id: 2.0}
