"""Off-peak lending: lent only when done by the peak (or preemptible), marked, reclaimed."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from engine_factories import (
    make_allocation,
    make_node,
    make_quota,
    make_request,
    make_snapshot,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_pool.engine.offpeak import OffPeakGate, eligible, peak_reclaims
from gpu_pool.engine.plan import plan
from gpu_pool.engine.types import ReasonCode
from gpu_pool.model import (
    AllocationState,
    OffPeak,
    OffPeakWindow,
    Policy,
    PriorityClass,
    Purpose,
)

BERLIN = OffPeak((OffPeakWindow(20, 8),), "Europe/Berlin")
POLICY = Policy(off_peak=BERLIN, solver_time_limit_s=0.05)
# 2026-12-01 is a Tuesday; Berlin is UTC+1 in December: 23:00 local, peak at 07:00 UTC.
NIGHT = datetime(2026, 12, 1, 22, 0, tzinfo=UTC)
DAY = datetime(2026, 12, 2, 7, 0, tzinfo=UTC)  # 08:00 Berlin: the peak


def _req(name, *, hours=None, preemptions=0, **kw):
    r = make_request(name, 4, **kw)
    return replace(r, submitted_at=NIGHT - timedelta(minutes=5), preemptions=preemptions,
                   time_limit=None if hours is None else timedelta(hours=hours))


def _plan(requests, now=NIGHT, allocations=(), policy=POLICY):
    nodes = [make_node("n1"), make_node("n2")]
    return plan(make_snapshot(nodes, requests, quotas=[make_quota("ml", 4)],
                              allocations=allocations, policy=policy, now=now))


@pytest.mark.parametrize("req, lent", [
    (dict(priority=PriorityClass.BATCH, hours=6), True),          # ends 04:00 UTC < 07:00
    (dict(priority=PriorityClass.BATCH, hours=10), False),        # runs past the peak
    (dict(priority=PriorityClass.BATCH), False),                  # no time limit
    (dict(purpose=Purpose.PRETRAINING, hours=9), True),           # exactly at the peak
    (dict(purpose=Purpose.PRETRAINING, hours=9.5), False),
    (dict(preemptible=True), True),                               # the peak reclaims it
    (dict(preemptible=True, preemptions=2), False),               # ... not once at the cap
    (dict(preemptible=True, preemptions=2, hours=6), True),       # unless it ends in time
    (dict(hours=1), False),                                       # normal training: never
    (dict(purpose=Purpose.INFERENCE, hours=1), False),
])
def test_who_is_lent(req, lent):
    gate = OffPeakGate.at(POLICY, NIGHT)
    assert gate.peak == DAY
    assert gate.lends(_req("r", **req)) is lent


def test_nothing_is_lent_by_day_or_with_lending_off():
    r = _req("r", preemptible=True)
    assert not OffPeakGate.at(POLICY, DAY).lends(r)
    assert not OffPeakGate.at(replace(POLICY, lend_idle_off_peak=False), NIGHT).lends(r)


def test_lent_beyond_quota_is_marked_and_within_quota_is_not():
    first = _req("a", priority=PriorityClass.BATCH, hours=2)
    second = _req("b", priority=PriorityClass.BATCH, hours=2)
    p = _plan([first, second])
    a, b = p.placement_of("a"), p.placement_of("b")
    assert a is not None and b is not None
    # Quota 4: the first fits it, the second goes beyond it.
    assert (a.off_peak, b.off_peak) == (False, True)
    assert b.note == "off-peak: beyond quota until the peak at 08:00 Europe/Berlin"


def test_held_back_reason_names_the_limit_and_the_peak():
    inside = _req("in", priority=PriorityClass.BATCH, hours=2)
    long = _req("long", priority=PriorityClass.BATCH, hours=6)
    used = make_allocation("used", make_node("n1"), (0, 1, 2, 3))  # the quota of 4 is used
    p = _plan([inside, long], now=NIGHT + timedelta(hours=4), allocations=[used])  # 03:00
    assert p.placement_of("in") is not None and p.placement_of("long") is None
    reason = p.reason_of("long")
    assert reason.code is ReasonCode.QUOTA_EXHAUSTED
    assert reason.message.startswith(
        "held back: its 6 h time limit runs past the peak at 08:00 Europe/Berlin; off-peak "
        "work must end before the peak (")


def _alloc(name, *, off_peak=True, preemptible=True, grace=None, state=AllocationState.ACTIVE):
    a = make_allocation(name, make_node("n1"), (0,), preemptible=preemptible)
    return replace(a, off_peak=off_peak, grace=grace, state=state,
                   started_at=NIGHT, priority=PriorityClass.BATCH)


def test_peak_reclaims_exactly_the_preemptible_off_peak_allocations():
    allocs = [_alloc("lent"), _alloc("own", off_peak=False), _alloc("kept", preemptible=False),
              _alloc("graced", grace=timedelta(seconds=30)),
              replace(_alloc("tired"), preemptions=2),  # at the cap: left to its time limit
              _alloc("gone", state=AllocationState.RELEASED)]
    assert peak_reclaims(allocs, POLICY, NIGHT) == []
    out = peak_reclaims(allocs, POLICY, DAY + timedelta(minutes=1))
    assert [(x.request_name, x.kind, x.grace_s) for x in out] == [
        ("lent", "peak", 120.0), ("graced", "peak", 30.0)]
    assert out[0].message == "preempted: the off-peak window ended at 08:00, grace 120 s"


def test_plan_reclaims_at_the_peak():
    p = _plan([], now=DAY, allocations=[_alloc("lent"), _alloc("own", off_peak=False)])
    assert [(x.request_name, x.kind) for x in p.preemptions] == [("lent", "peak")]


_KW = st.fixed_dictionaries({
    "priority": st.sampled_from(list(PriorityClass)),
    "purpose": st.sampled_from(list(Purpose)),
    "preemptible": st.booleans(),
    "hours": st.one_of(st.none(), st.integers(1, 14)),
    "preemptions": st.integers(0, 3),
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_KW, min_size=1, max_size=5), st.integers(0, 23))
def test_never_lends_non_preemptible_work_across_the_peak(kws, hour):
    now = datetime(2026, 12, 1, 0, 0, tzinfo=UTC) + timedelta(hours=hour)
    reqs = [_req(f"r{i}", **kw) for i, kw in enumerate(kws)]
    reqs = [replace(r, submitted_at=now) for r in reqs]
    p = _plan(reqs, now=now)
    peak = BERLIN.peak_starts(now)
    by_name = {r.name: r for r in reqs}
    for x in p.placements:
        r = by_name[x.request_name]
        if x.off_peak:
            assert eligible(r) and BERLIN.contains(now)
            if not r.preemptible or r.preemptions >= POLICY.max_preemptions_per_task:
                assert r.time_limit is not None and now + r.time_limit <= peak
    # Within quota otherwise: what is not off-peak fits the quota of 4.
    assert sum(len(a.gpu_indices) for x in p.placements if not x.off_peak
               for a in x.assignments) <= 4


@pytest.mark.parametrize("zone, now, peak", [
    # Berlin spring forward (2026-03-29 02:00 -> 03:00): window 20-08 local, peak 08:00 CEST.
    ("Europe/Berlin", datetime(2026, 3, 28, 22, 0, tzinfo=UTC),
     datetime(2026, 3, 29, 6, 0, tzinfo=UTC)),
    # Berlin fall back (2026-10-25 03:00 -> 02:00): peak 08:00 CET.
    ("Europe/Berlin", datetime(2026, 10, 24, 22, 0, tzinfo=UTC),
     datetime(2026, 10, 25, 7, 0, tzinfo=UTC)),
    # New York, after the November change (UTC-5): 23:00 local, peak 13:00 UTC.
    ("America/New_York", datetime(2026, 11, 2, 4, 0, tzinfo=UTC),
     datetime(2026, 11, 2, 13, 0, tzinfo=UTC)),
    # Before the window opens: no peak.
    ("Europe/Berlin", datetime(2026, 12, 1, 12, 0, tzinfo=UTC), None),
    # Asia/Kolkata (+05:30): 02:30 local, peak 08:00 local = 02:30 UTC.
    ("Asia/Kolkata", datetime(2026, 12, 1, 21, 0, tzinfo=UTC),
     datetime(2026, 12, 2, 2, 30, tzinfo=UTC)),
])
def test_peak_starts_across_zones_and_dst(zone, now, peak):
    assert OffPeak((OffPeakWindow(20, 8),), zone).peak_starts(now) == peak


def test_weekend_window_chains_into_the_night_windows():
    # Nights 20-08 on every day plus whole Saturday and Sunday: Friday night runs to Monday 08.
    windows = (OffPeakWindow(20, 8), OffPeakWindow(0, 0, frozenset({5, 6})))
    op = OffPeak(windows, "UTC")
    friday_night = datetime(2026, 12, 4, 21, 0, tzinfo=UTC)
    assert op.peak_starts(friday_night) == datetime(2026, 12, 7, 8, 0, tzinfo=UTC)


@settings(max_examples=60, deadline=None)
@given(st.datetimes(min_value=datetime(2026, 1, 1), max_value=datetime(2027, 12, 31),
                    timezones=st.just(UTC)),
       st.sampled_from(["UTC", "Europe/Berlin", "America/New_York", "Australia/Sydney"]),
       st.integers(0, 23), st.integers(0, 23))
def test_peak_is_after_now_and_not_off_peak(now, zone, start, end):
    op = OffPeak((OffPeakWindow(start, end),), zone)
    peak = op.peak_starts(now)
    if not op.contains(now):
        assert peak is None
        return
    if peak is None:
        return  # off-peak all week (a whole-day window every day)
    assert peak > now
    assert not op.contains(peak)
    # Off-peak all along the way (sampled every 15 minutes).
    t = now
    while t < peak:
        assert op.contains(t), (now, t, peak)
        t += timedelta(minutes=15)


@pytest.mark.parametrize("zone, day", [
    ("Europe/Berlin", datetime(2026, 3, 28, tzinfo=UTC)),      # spring forward 03-29
    ("Europe/Berlin", datetime(2026, 10, 24, tzinfo=UTC)),     # fall back 10-25
    ("America/New_York", datetime(2026, 3, 7, tzinfo=UTC)),    # 03-08
    ("America/New_York", datetime(2026, 10, 31, tzinfo=UTC)),  # 11-01
    ("Australia/Sydney", datetime(2026, 4, 4, tzinfo=UTC)),    # 04-05
])
@pytest.mark.parametrize("start, end", [(20, 8), (22, 3), (1, 3), (0, 2), (2, 3), (3, 1)])
def test_peak_starts_through_dst_every_quarter_hour(zone, day, start, end):
    """Across a DST change: whenever off-peak, the peak is later, not off-peak, and every
    quarter hour up to it is off-peak."""
    op = OffPeak((OffPeakWindow(start, end),), zone)
    for q in range(3 * 24 * 4):
        now = day + timedelta(minutes=15 * q)
        peak = op.peak_starts(now)
        if not op.contains(now):
            assert peak is None
            continue
        assert peak is not None and peak > now and not op.contains(peak), (now, peak)
        t = now
        while t < peak:
            assert op.contains(t), (now, t, peak)
            t += timedelta(minutes=15)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.sampled_from(list(AllocationState))),
                max_size=8), st.integers(0, 47))
def test_peak_reclaims_exactly_the_preemptible_off_peak_ones(flags, quarter_hours):
    now = NIGHT + timedelta(minutes=30 * quarter_hours)
    allocs = [_alloc(f"a{i}", off_peak=o, preemptible=p, state=s)
              for i, (o, p, s) in enumerate(flags)]
    got = {x.request_name for x in peak_reclaims(allocs, POLICY, now)}
    want = set() if BERLIN.contains(now) else {
        a.request_name for a in allocs
        if a.off_peak and a.preemptible and a.state is AllocationState.ACTIVE
        and a.preemptions < POLICY.max_preemptions_per_task}
    assert got == want
    assert all(x.kind == "peak" and x.grace_s == 120.0
               for x in peak_reclaims(allocs, POLICY, now))


def test_work_within_its_quota_goes_before_work_lent_beyond_it():
    """Kueue's order: requests within their quota before those that go beyond it. ml holds
    its quota of 4 (preemptible, low) and asks one GPU more, lent off-peak; cv holds 3 of
    its 4 and asks one (batch, within its quota). One GPU is free: cv gets it. Ranked by
    class alone, ml's low would take it beyond its quota and cv would then reclaim one of
    ml's GPUs, a preemption for nothing."""
    n1, n2 = make_node("n1", gpus=4), make_node("n2", gpus=4)
    allocations = (*(make_allocation(f"ml{k}", n1, (k,), team="ml", preemptible=True,
                                     priority=PriorityClass.LOW) for k in range(4)),
                   make_allocation("cv-own", n2, (0, 1, 2), team="cv"))
    lent = replace(make_request("m", 1, team="ml", priority=PriorityClass.LOW,
                                preemptible=True), submitted_at=NIGHT - timedelta(minutes=5))
    within = replace(make_request("c", 1, team="cv", priority=PriorityClass.BATCH),
                     submitted_at=NIGHT - timedelta(minutes=5))
    assert OffPeakGate.at(POLICY, NIGHT).lends(lent)
    p = plan(make_snapshot([n1, n2], [lent, within], allocations=allocations,
                           quotas=[make_quota("ml", 4), make_quota("cv", 4)], policy=POLICY,
                           now=NIGHT))
    assert p.preemptions == ()
    c = p.placement_of("c")
    assert c is not None and [(a.node, a.gpu_indices) for a in c.assignments] == [("n2", (3,))]
    assert p.placement_of("m") is None
