"""Quotas: set, renew, list; usage derived from active allocations, never a counter."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from tests.store.factories import make_node, make_quota, place, seed, submit

from gpu_pool.errors import SpecError
from gpu_pool.model import Outcome, Purpose
from gpu_pool.store import Store


def test_set_quota_then_renew_keeps_its_id(store: Store, now: datetime) -> None:
    seed(store)
    first = store.set_quota(make_quota(gpus=4, start=now), "admin")
    assert first.id and first.gpus == 4
    renewed = store.set_quota(make_quota(gpus=6, start=now, days=90, borrow_limit_gpus=2,
                                         gpu_hour_budget=500.0), "admin")
    assert renewed.id == first.id
    assert (renewed.gpus, renewed.expires_at, renewed.borrow_limit_gpus,
            renewed.gpu_hour_budget) == (6, now + timedelta(days=90), 2, 500.0)
    other = store.set_quota(make_quota(gpus=2, start=now, gpu_model="A100"), "admin")
    assert other.id != first.id
    assert store.list_quotas() == [renewed, other]
    kinds = [(e.kind, e.data["after"]["gpus"]) for e in store.events() if e.subject_kind == "quota"]
    assert kinds == [("quota.created", 4), ("quota.updated", 6), ("quota.created", 2)]
    assert store.events(subject=first.id)[-1].data["before"]["gpus"] == 4


def test_set_quota_refusals(store: Store, now: datetime) -> None:
    seed(store)
    with pytest.raises(SpecError) as caught:
        store.set_quota(make_quota("ghost", start=now), "admin")
    assert caught.value.field == "team" and "nlp, vision" in caught.value.expected
    with pytest.raises(SpecError) as caught:
        store.set_quota(make_quota(start=now, days=-1), "admin")
    assert caught.value.field == "expires_at"


def test_usage_is_derived_from_active_allocations(store: Store, now: datetime) -> None:
    seed(store, nodes=[make_node("n1", 4, "A100"), make_node("n2", 2, "T4")])
    any_model = store.set_quota(make_quota(gpus=8, start=now), "a")
    a100 = store.set_quota(make_quota(gpus=4, start=now, gpu_model="A100"), "a")
    infer = store.set_quota(make_quota(gpus=2, start=now, purpose=Purpose.INFERENCE), "a")
    vision = store.set_quota(make_quota("vision", gpus=2, start=now), "a")
    submit(store, "big", now, gpus=2)
    submit(store, "small", now, gpu_milli=500)
    submit(store, "serve", now, purpose=Purpose.INFERENCE)
    place(store, "big", "n1", [0, 1], now)
    place(store, "small", "n2", [0], now, milli=500)
    place(store, "serve", "n1", [2], now)
    usage = store.quota_usage(now)
    assert usage == {any_model.id: 2.5, a100.id: 2.0, infer.id: 1.0, vision.id: 0.0}
    store.release_request("big", Outcome.SUCCESS, "t", "done", now)
    assert store.quota_usage(now)[any_model.id] == 0.5
    assert store.quota_usage(now)[a100.id] == 0.0
