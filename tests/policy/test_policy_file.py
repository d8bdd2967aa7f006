"""The policy document: every key settable, every refusal naming key path, value and fix,
an exact dump/parse round trip, sources, and key=value merges."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_pool.errors import SpecError
from gpu_pool.model import (
    GpuModelInfo,
    Headroom,
    OffPeak,
    OffPeakWindow,
    Policy,
    PriorityClass,
)
from gpu_pool.policy_file import (
    KEYS,
    dump_policy,
    explain,
    format_duration,
    merge_assignments,
    parse_policy,
)


def test_every_policy_field_is_a_document_key():
    assert set(KEYS) == {f.name for f in dataclasses.fields(Policy)}


def test_an_empty_document_is_the_defaults():
    for empty in ("", "{}", "# nothing\n", None, {}):
        assert parse_policy(empty) == Policy()


GOOD = [
    ("critical_headroom_gpus: 4", "critical_headroom_gpus", 4),
    ("headroom: [{gpus: 2, gpu_model: H100, node_group: core}]", "headroom",
     (Headroom(2, "H100", "core"),)),
    ("off_peak: {timezone: Europe/Berlin, windows: [{start: '20:00', end: '08:00', "
     "days: [mon-fri]}]}", "off_peak",
     OffPeak((OffPeakWindow(20, 8, frozenset(range(5))),), "Europe/Berlin")),
    # YAML 1.1 reads an unquoted 22:00 as 1320 (base 60): still 22 h.
    ("off_peak: {windows: [{start: 22:00, end: 6, days: 'sat,sun'}]}", "off_peak",
     OffPeak((OffPeakWindow(22, 6, frozenset({5, 6})),), "UTC")),
    ("off_peak: {windows: [{start: '20:00', end: '08:00', days: [fri-mon]}]}", "off_peak",
     OffPeak((OffPeakWindow(20, 8, frozenset({4, 5, 6, 0})),), "UTC")),
    ("lend_idle_off_peak: false", "lend_idle_off_peak", False),
    ("off_peak_notice: 45m", "off_peak_notice", timedelta(minutes=45)),
    ("borrowing: no", "borrowing", False),
    ("reclaim_guarantees: false", "reclaim_guarantees", False),
    ("critical_preempts_borrowers: false", "critical_preempts_borrowers", False),
    ("preemption_grace: 90s", "preemption_grace", timedelta(seconds=90)),
    ("preemption_grace: 0", "preemption_grace", timedelta(0)),
    ("min_runtime_before_preemption: 1h30m", "min_runtime_before_preemption",
     timedelta(minutes=90)),
    ("max_preemptions_per_task: 0", "max_preemptions_per_task", 0),
    ("max_transfer_seconds: 2h", "max_transfer_seconds", 7200.0),
    ("max_transfer_seconds: 90", "max_transfer_seconds", 90.0),
    ("cross_zone_margin: 1.5", "cross_zone_margin", 1.5),
    ("zone_links: [{from: eu, to: us, mb_per_s: 250}]", "zone_links", {("eu", "us"): 250.0}),
    ("aging_half_life: 30m", "aging_half_life", timedelta(minutes=30)),
    ("fair_share_half_life: 0s", "fair_share_half_life", timedelta(0)),
    ("fair_share_half_life: 14d", "fair_share_half_life", timedelta(days=14)),
    ("alert_days: [30, 7]", "alert_days", (30, 7)),
    ("budget_alert_pcts: [50, 100]", "budget_alert_pcts", (50, 100)),
    ("gpu_models: [{name: B200, memory_gib: 192, price_per_gpu_hour: 6}, "
     "{name: X1, memory_mib: 1000}]", "gpu_models",
     (GpuModelInfo("B200", 192 * 1024, 6.0), GpuModelInfo("X1", 1000, 0.0))),
    ("solver_time_limit_s: 1.5", "solver_time_limit_s", 1.5),
    ("solver_workers: 8", "solver_workers", 8),
    ("solver_seed: 42", "solver_seed", 42),
    ("solver_relative_gap: 0", "solver_relative_gap", 0.0),
    ("reserve_after: 0", "reserve_after", timedelta(0)),
    ("max_reservations: 3", "max_reservations", 3),
]


@pytest.mark.parametrize(("document", "key", "expected"), GOOD)
def test_each_key_is_settable_and_the_rest_stays_default(document, key, expected):
    policy = parse_policy(document)
    assert getattr(policy, key) == expected
    assert dataclasses.replace(policy, **{key: getattr(Policy(), key)}) == Policy()


def test_priority_weights_merge_onto_the_defaults():
    policy = parse_policy("priority_weights: {critical: 50000, batch: 2}")
    assert policy.priority_weights == {PriorityClass.CRITICAL: 50000, PriorityClass.HIGH: 1000,
                                       PriorityClass.NORMAL: 100, PriorityClass.LOW: 10,
                                       PriorityClass.BATCH: 2}


BAD = [
    # (document, key path in the message, bad value shown, what is valid)
    ("colour: blue", "colour", "'blue'", "one of the policy keys"),
    ("- 1", "policy", "'list'", "a mapping of policy keys"),
    ("borrowing: perhaps", "borrowing", "'perhaps'", "true or false"),
    ("critical_headroom_gpus: -1", "critical_headroom_gpus", "-1", "an integer from 0"),
    ("critical_headroom_gpus: 2.5", "critical_headroom_gpus", "2.5", "an integer"),
    ("headroom: {gpus: 2}", "headroom", "{'gpus': 2}", "a list of headroom rules"),
    ("headroom: [{gpus: 2}, {gpus: 0}]", "headroom[1].gpus", "0", "an integer from 1"),
    ("headroom: [{gpu_model: H100}]", "headroom[0].gpus", "None", "whole GPUs kept free"),
    ("headroom: [{gpus: 1, size: big}]", "headroom[0].size", "'big'", "one of the keys gpus"),
    ("headroom: [{gpus: 1, gpu_model: Z80}]", "headroom[0].gpu_model", "'Z80'",
     "a GPU model of gpu_models"),
    ("off_peak: {timezone: Mars/Olympus}", "off_peak.timezone", "'Mars/Olympus'",
     "an IANA time zone"),
    ("off_peak: {timezone: ../../etc/passwd}", "off_peak.timezone", "'../../etc/passwd'",
     "an IANA time zone"),
    ("off_peak: {windows: [{start: '20:00', end: '08:00'}, {start: '25:00', end: '08:00'}]}",
     "off_peak.windows[1].start", "'25:00'", "a whole hour of the day"),
    ("off_peak: {windows: [{start: '20:30', end: '08:00'}]}", "off_peak.windows[0].start",
     "'20:30'", "a whole hour"),
    ("off_peak: {windows: [{start: '20:00'}]}", "off_peak.windows[0].end", "None",
     "a whole hour"),
    ("off_peak: {windows: [{start: '20:00', end: '08:00', days: [mon, funday]}]}",
     "off_peak.windows[0].days[1]", "'funday'", "days like [mon, tue]"),
    ("off_peak: {windows: [{start: '20:00', end: '08:00', days: []}]}",
     "off_peak.windows[0].days", "[]", "days like"),
    ("off_peak: {zone: UTC}", "off_peak.zone", "'UTC'", "one of the keys timezone, windows"),
    ("off_peak_notice: -5m", "off_peak_notice", "'-5m'", "0 (off) or a positive duration"),
    ("preemption_grace: soon", "preemption_grace", "'soon'", "a positive duration"),
    ("min_runtime_before_preemption: 400d", "min_runtime_before_preemption", "'400d'",
     "at most 366 days"),
    ("max_preemptions_per_task: 5000", "max_preemptions_per_task", "5000", "from 0 to 1,000"),
    ("max_transfer_seconds: 0", "max_transfer_seconds", "0", "greater than 0"),
    ("cross_zone_margin: -0.1", "cross_zone_margin", "-0.1", "at least 0"),
    ("cross_zone_margin: .nan", "cross_zone_margin", "nan", "a number"),
    ("zone_links: [{from: eu, to: eu, mb_per_s: 5}]", "zone_links[0].to", "'eu'",
     "a zone other than 'from'"),
    ("zone_links: [{from: eu, to: us, mb_per_s: 0}]", "zone_links[0].mb_per_s", "0",
     "greater than 0"),
    ("zone_links: [{from: eu, to: us, mb_per_s: 5}, {from: eu, to: us, mb_per_s: 6}]",
     "zone_links[1]", "'eu -> us'", "each zone pair listed once"),
    ("alert_days: [7, 7]", "alert_days[1]", "7", "listed once each"),
    ("budget_alert_pcts: [0]", "budget_alert_pcts[0]", "0", "an integer from 1 to 1,000"),
    ("gpu_models: []", "gpu_models", "[]", "at least one GPU model"),
    ("gpu_models: [{name: B200}]", "gpu_models[0]", "'B200'", "exactly one of"),
    ("gpu_models: [{name: B200, memory_gib: 1, memory_mib: 1024}]", "gpu_models[0]",
     "'B200'", "exactly one of"),
    ("gpu_models: [{name: A, memory_gib: 8}, {name: a, memory_gib: 8}]", "gpu_models[1].name",
     "'a'", "each GPU model listed once"),
    ("gpu_models: [{name: A, memory_gib: 8, price_per_gpu_hour: -1}]",
     "gpu_models[0].price_per_gpu_hour", "-1", "at least 0"),
    ("priority_weights: {urgent: 5}", "priority_weights.urgent", "5",
     "one of the keys critical, high"),
    ("priority_weights: {normal: 5000}", "priority_weights.normal", "5000",
     "a weight below high's 1,000"),
    ("priority_weights: {low: 100}", "priority_weights.low", "100",
     "a weight below normal's 100"),
    ("priority_weights: {critical: 0}", "priority_weights.critical", "0", "from 1"),
    ("solver_time_limit_s: 0", "solver_time_limit_s", "0", "greater than 0"),
    ("solver_workers: 0", "solver_workers", "0", "from 1 to 64"),
    ("solver_relative_gap: 1", "solver_relative_gap", "1", "not including, 1"),
    ("reserve_after: -1", "reserve_after", "-1", "0 (off) or"),
    ("max_reservations: 1.5", "max_reservations", "1.5", "an integer"),
    ("borrowing: [", "yaml", "", "valid YAML"),
]


@pytest.mark.parametrize(("document", "key", "shown", "expected"), BAD)
def test_a_bad_value_names_key_path_value_and_what_is_valid(document, key, shown, expected):
    with pytest.raises(SpecError) as caught:
        parse_policy(document, "policy.yaml")
    error = caught.value
    assert error.field == key
    assert str(error).startswith("policy.yaml")
    assert f"{key}: got {shown}" in str(error)
    assert expected in error.expected, error.expected
    assert "\n" not in str(error)


def test_a_refusal_leaves_nothing_half_built():
    # The first key is valid, the second is not: no policy is returned at all.
    with pytest.raises(SpecError):
        parse_policy({"borrowing": False, "solver_workers": 0})


durations = st.one_of(st.just(timedelta(0)),
                      st.integers(1, 366 * 86400).map(lambda s: timedelta(seconds=s)))
positive = st.integers(1, 366 * 86400).map(lambda s: timedelta(seconds=s))
names = st.from_regex(r"[a-z][a-z0-9-]{0,8}", fullmatch=True)
windows = st.builds(OffPeakWindow, st.integers(0, 23), st.integers(0, 23),
                    st.frozensets(st.integers(0, 6), min_size=1))
models = st.lists(st.builds(GpuModelInfo, names.map(str.upper),
                            st.integers(1, 4 * 1024 * 1024),
                            st.floats(0, 100, allow_nan=False)),
                  min_size=1, max_size=4, unique_by=lambda m: m.name.upper())


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    gpu_models = tuple(draw(models))
    weights = sorted(draw(st.lists(st.integers(1, 1_000_000), min_size=5, max_size=5,
                                   unique=True)), reverse=True)
    rules = draw(st.lists(st.builds(Headroom, st.integers(1, 100),
                                    st.sampled_from([None, *(m.name for m in gpu_models)]),
                                    st.one_of(st.none(), names)), max_size=3))
    links = draw(st.dictionaries(st.tuples(names, names).filter(lambda p: p[0] != p[1]),
                                 st.floats(0.5, 1e6, allow_nan=False), max_size=3))
    return Policy(
        priority_weights=dict(zip(PriorityClass, weights, strict=True)),
        critical_headroom_gpus=draw(st.integers(0, 1000)),
        headroom=tuple(rules),
        off_peak=OffPeak(tuple(draw(st.lists(windows, min_size=1, max_size=3))),
                         draw(st.sampled_from(["UTC", "Europe/Berlin", "Asia/Kolkata"]))),
        lend_idle_off_peak=draw(st.booleans()),
        off_peak_notice=draw(durations),
        borrowing=draw(st.booleans()),
        reclaim_guarantees=draw(st.booleans()),
        critical_borrows=draw(st.booleans()),
        critical_preempts_borrowers=draw(st.booleans()),
        preemption_grace=draw(durations),
        min_runtime_before_preemption=draw(durations),
        max_preemptions_per_task=draw(st.integers(0, 1000)),
        max_transfer_seconds=float(draw(positive).total_seconds()),
        cross_zone_margin=draw(st.floats(0, 100, allow_nan=False)),
        zone_links=links,
        aging_half_life=draw(durations),
        fair_share_half_life=draw(durations),
        alert_days=tuple(draw(st.lists(st.integers(1, 366), unique=True, max_size=4))),
        budget_alert_pcts=tuple(draw(st.lists(st.integers(1, 1000), unique=True, max_size=4))),
        gpu_models=gpu_models,
        solver_time_limit_s=draw(st.floats(0.001, 60, allow_nan=False)),
        solver_workers=draw(st.integers(1, 64)),
        solver_seed=draw(st.integers(0, 2**31 - 1)),
        solver_relative_gap=draw(st.floats(0, 0.99, allow_nan=False)),
        reserve_after=draw(durations),
        max_reservations=draw(st.integers(0, 1000)),
    )


@settings(max_examples=150, deadline=None)
@given(policies(), st.booleans())
def test_dump_then_parse_gives_the_same_policy(policy, full):
    assert parse_policy(dump_policy(policy, full=full)) == policy


def test_the_dump_of_the_defaults_is_empty_and_a_full_dump_lists_every_key():
    assert dump_policy(Policy()) == "{}\n"
    full = parse_policy(dump_policy(Policy(), full=True))
    assert full == Policy()
    assert set(__import__("yaml").safe_load(dump_policy(Policy(), full=True))) == set(KEYS)


@pytest.mark.parametrize(("delta", "text"), [
    (timedelta(0), "0s"), (timedelta(days=7), "7d"), (timedelta(hours=2), "2h"),
    (timedelta(minutes=10), "10m"), (timedelta(seconds=90), "90s"),
    (timedelta(seconds=1, microseconds=500), "1.0005s")])
def test_durations_are_written_in_their_shortest_exact_form(delta, text):
    assert format_duration(delta) == text
    assert parse_policy({"preemption_grace": text}).preemption_grace == delta


def test_explain_says_for_every_key_whether_it_came_from_the_document():
    settings_ = explain("borrowing: false\nheadroom: [{gpus: 2}]\n", "v3")
    assert [s.key for s in settings_] == list(KEYS)
    by_key = {s.key: s for s in settings_}
    assert by_key["borrowing"].source == "v3" and by_key["borrowing"].value is False
    assert by_key["headroom"].value == [{"gpus": 2}]
    assert by_key["reserve_after"].source == "default"
    assert by_key["reserve_after"].value == "1h"
    assert sum(not s.is_default for s in settings_) == 2


def test_key_value_assignments_merge_onto_the_document():
    merged = merge_assignments("borrowing: false\noff_peak: {timezone: UTC}\n",
                               ["off_peak.timezone=Europe/Berlin", "headroom=[{gpus: 2}]",
                                "preemption_grace=90s"])
    assert merged == {"borrowing": False, "off_peak": {"timezone": "Europe/Berlin"},
                      "headroom": [{"gpus": 2}], "preemption_grace": "90s"}
    policy = parse_policy(merged)
    assert policy.off_peak.timezone == "Europe/Berlin" and not policy.borrowing
    for bad, field in (("borrowing", "assignment"), ("colour=blue", "colour"),
                       ("=3", "assignment")):
        with pytest.raises(SpecError) as caught:
            merge_assignments({}, [bad])
        assert caught.value.field == field


def test_the_parsed_off_peak_window_reads_in_the_fleet_time_zone():
    policy = parse_policy("off_peak: {timezone: Europe/Berlin, windows: "
                          "[{start: '20:00', end: '08:00', days: [mon-fri]}]}")
    # 19:30 UTC on a Monday in December is 20:30 in Berlin: off-peak.
    assert policy.off_peak.contains(datetime(2026, 12, 7, 19, 30, tzinfo=UTC))
    assert not policy.off_peak.contains(datetime(2026, 12, 7, 18, 30, tzinfo=UTC))
