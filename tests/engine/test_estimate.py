"""Start estimates (gpu_pool.engine.estimate): when a waiting request is expected to start."""

from __future__ import annotations

import dataclasses
import random
from datetime import timedelta

import numpy as np
from engine_factories import (
    NOW,
    make_allocation,
    make_node,
    make_quota,
    make_request,
    make_snapshot,
    random_snapshot,
)
from hypothesis import given
from hypothesis import strategies as st

from gpu_pool.engine import plan
from gpu_pool.engine.estimate import Runtimes
from gpu_pool.engine.types import ReasonCode
from gpu_pool.model import Policy

H = timedelta(hours=1)


def _busy_node():
    """Node a, 8 GPUs: GPUs 0-3 held for 1 more hour, 4-7 for 3."""
    node = make_node("a", "A100", 8)
    return node, [make_allocation("early", node, (0, 1, 2, 3), ends_in=H),
                  make_allocation("late", node, (4, 5, 6, 7), ends_in=3 * H)]


def test_queue_unfolds_by_the_time_limits():
    node, busy = _busy_node()
    big = make_request("big", 8, time_limit=H)  # ranked first: larger first
    r1 = make_request("r1", 4, time_limit=2 * H)
    r2 = make_request("r2", 4, time_limit=H)
    p = plan(make_snapshot([node], [big, r1, r2], allocations=busy))
    assert p.placements == ()
    # +1 h: 4 GPUs free, big does not fit, r1 does (until +3 h). +3 h: all 8 free, big
    # first (until +4 h), then r2.
    assert p.estimates == {"r1": NOW + H, "big": NOW + 3 * H, "r2": NOW + 4 * H}


def test_work_without_a_limit_never_frees_its_gpus():
    node, busy = _busy_node()
    r1 = make_request("r1", 4)  # no time limit: holds GPUs 0-3 for ever once started
    big = make_request("big", 8, waited=timedelta(minutes=5))
    snap = make_snapshot([node], [r1, big], allocations=busy,
                         policy=Policy(reserve_after=timedelta(0)))
    p = plan(snap)
    assert p.estimates == {"r1": NOW + H}
    assert p.reason_of("big").code is ReasonCode.WAITING_FOR_CAPACITY


def test_no_known_end_no_estimate():
    node, busy = _busy_node()
    blind = [dataclasses.replace(a, ends_by=None) for a in busy]
    p = plan(make_snapshot([node], [make_request("r", 2, time_limit=H)], allocations=blind))
    assert p.estimates == {}


def test_quota_held_request_gets_none():
    node, busy = _busy_node()
    capped = make_request("capped", 4, team="cv", time_limit=H)
    free = make_request("free", 4, team="ml", time_limit=H)
    snap = make_snapshot([node], [capped, free], allocations=busy,
                         quotas=[make_quota("ml", 16), make_quota("cv", 2)])
    p = plan(snap)
    assert p.reason_of("capped").code is ReasonCode.QUOTA_EXHAUSTED
    assert "capped" not in p.estimates and p.estimates["free"] == NOW + H


def test_reservation_holder_starts_at_the_expected_start_and_backfill_before():
    node = make_node("a", "A100", 8)
    busy = [make_allocation("old", node, (0,), ends_in=2 * H)]
    big = make_request("big", 8, waited=timedelta(hours=3))
    long = make_request("long", 8, time_limit=H)  # behind big: after it, never (no limit)
    p = plan(make_snapshot([node], [big, long], allocations=busy))
    (held,) = p.reservations
    assert p.estimates["big"] == held.expected_start == NOW + 2 * H
    assert "long" not in p.estimates  # big has no time limit: holds the node for ever


def test_depth_limits_how_many_get_one():
    node, busy = _busy_node()
    reqs = [make_request(f"r{i}", 1, time_limit=H, waited=timedelta(seconds=10 - i))
            for i in range(6)]
    p = plan(make_snapshot([node], reqs, allocations=busy, policy=Policy(start_estimates=2)))
    assert set(p.estimates) == {"r0", "r1"}
    assert plan(make_snapshot([node], reqs, allocations=busy,
                              policy=Policy(start_estimates=0))).estimates == {}


def test_random_snapshots_estimates_are_in_the_future_and_repeatable():
    for seed in range(40):
        rng = random.Random(seed)
        snap = random_snapshot(rng, nodes=4, requests=10, extras=seed % 2 == 1)
        allocations = tuple(dataclasses.replace(a, ends_by=NOW + rng.choice([1, 2, 5]) * H)
                            for a in snap.allocations)
        requests = tuple(dataclasses.replace(r, time_limit=rng.choice([None, H, 4 * H]))
                         for r in snap.requests)
        snap = dataclasses.replace(snap, allocations=allocations, requests=requests)
        p = plan(snap)
        assert p.estimates == plan(snap).estimates
        waiting = {x.request_name for x in p.pending
                   if x.code in (ReasonCode.WAITING_FOR_CAPACITY, ReasonCode.OUTRANKED,
                                 ReasonCode.NODE_RESERVED)}
        assert set(p.estimates) <= waiting
        assert all(t >= NOW for t in p.estimates.values())


@given(ratios=st.lists(st.floats(-0.5, 1.5, allow_nan=False), max_size=40),
       limit=st.floats(0, 1e6, allow_nan=False), share=st.floats(0, 1.2, allow_nan=False))
def test_expected_run_is_the_median_ratio_of_tasks_that_ran_as_long(
        ratios: list[float], limit: float, share: float) -> None:
    """The suffix medians kept by Runtimes give exactly what the median of the ratios above
    elapsed / limit gives, the limit itself when none ran that long."""
    elapsed = share * limit
    q = np.sort(np.clip(np.asarray(ratios, dtype=np.float64), 0.0, 1.0))
    above = q[np.searchsorted(q, elapsed / limit, side="right"):] if limit > 0 else q
    want = (limit if limit <= 0 or not len(above)
            else max(float(np.median(above)) * limit, elapsed))
    assert Runtimes(ratios).expected(limit, elapsed) == want


def test_expected_run_examples() -> None:
    times = Runtimes([0.25, 0.5, 1.0, 0.75])
    assert times.expected(100.0) == 62.5  # median of all four
    assert times.expected(100.0, 50.0) == 87.5  # of 0.75 and 1.0: ran past half its limit
    assert times.expected(100.0, 100.0) == 100.0  # nobody ran longer: its limit
    assert Runtimes().expected(100.0, 10.0) == 100.0
