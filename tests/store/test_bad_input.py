"""Objects built in code that reach the store directly get the same named-field refusals."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from tests.store.factories import make_node, make_quota, make_request, seed, submit

from gpu_pool.errors import SpecError, StoreError
from gpu_pool.model import Gpu
from gpu_pool.store import Store

Case = Callable[[Store, datetime], object]

CASES: list[tuple[str, Case, str, str]] = [
    ("node state", lambda s, now: s.set_node_state("n1", "sleeping", "ops"),
     "state", "up, draining, down"),
    ("release outcome", lambda s, now: s.release_request("r0", "great", "t", "x", now),
     "outcome", "success, failed"),
    ("events limit", lambda s, now: s.events(limit=0), "limit", "1 or more"),
    ("quota gpus", lambda s, now: s.set_quota(make_quota(gpus=-1, start=now), "a"),
     "gpus", "from 0 to 1,000,000"),
    ("quota borrow", lambda s, now: s.set_quota(
        make_quota(start=now, borrow_limit_gpus=float("nan")), "a"), "borrow_limit_gpus",
     "from 0 to 1,000,000"),
    ("node cpu", lambda s, now: s.import_nodes([make_node("x", cpu_milli=-5)], "t"),
     "cpu_milli", "a whole number from 0 to 100,000,000"),
    ("node gpu indices", lambda s, now: s.import_nodes(
        [replace(make_node("x", 1), gpus=(Gpu(0, "A100", 1), Gpu(0, "A100", 1)))], "t"),
     "gpus", "distinct GPU indices"),
    ("request share", lambda s, now: s.submit_request(make_request("x", gpu_milli=0), "t", now),
     "gpu_share", "1..1000"),
    ("share of a gang", lambda s, now: s.submit_request(
        make_request("x", gpus=2, gpu_milli=500), "t", now), "gpu_share", "1 GPU on 1 node"),
    ("request nodes", lambda s, now: s.submit_request(make_request("x", nodes=0), "t", now),
     "nodes", "from 1 to 1024"),
    ("time limit", lambda s, now: s.submit_request(
        make_request("x", time_limit=timedelta(0)), "t", now), "time_limit", "positive"),
    ("utilization", lambda s, now: s.record_gpu_readings(
        "n1", [{"index": 0, "utilization_pct": 150}], now), "utilization_pct", "0..100"),
    ("node memory past 1 PiB", lambda s, now: s.import_nodes(
        [make_node("x", memory_mib=10**30)], "t"), "memory_mib", "from 0 to 1,073,741,824"),
    ("request memory past 1 PiB", lambda s, now: s.submit_request(
        make_request("x", memory_mib=10**30), "t", now), "memory_mib", "from 0 to"),
    ("time limit past a year", lambda s, now: s.submit_request(
        make_request("x", time_limit=timedelta(days=400)), "t", now), "time_limit",
     "at most 366 days"),
    ("memory used", lambda s, now: s.record_gpu_readings(
        "n1", [{"index": 0, "memory_used_mib": -1}], now), "memory_used_mib", "0 or more"),
]


@pytest.mark.parametrize(("call", "field", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_refusals_name_field_value_and_what_is_valid(store: Store, now: datetime, call: Case,
                                                     field: str, words: str) -> None:
    seed(store)
    submit(store, "r0", now)
    before = len(store.events())
    with pytest.raises(SpecError) as caught:
        call(store, now)
    assert caught.value.field == field
    assert words in caught.value.expected
    assert len(store.events()) == before  # nothing was written


def test_a_sqlite_path_that_cannot_be_created_is_a_store_error(tmp_path) -> None:  # noqa: ANN001
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(StoreError, match="cannot create its folder"):
        Store.from_url(f"sqlite:///{blocker / 'sub' / 'gp.db'}")

