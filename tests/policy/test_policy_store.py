"""Policy versions in the store, on SQLite and PostgreSQL: set, refuse, restore, sources,
the audit event with its diff, and the policy a scheduler starts with."""

from __future__ import annotations

from datetime import timedelta

import pytest

from gpu_pool.errors import NotFoundError, SpecError
from gpu_pool.model import Policy
from gpu_pool.policy_file import policy_in_force

V1 = "# nightly lending\nborrowing: false\npreemption_grace: 90s\n"
V2 = "borrowing: false\npreemption_grace: 5m\nreserve_after: 0\n"


def test_a_new_store_is_on_the_defaults(store):
    assert store.policy_version() == 0
    assert store.load_policy() == Policy()
    assert store.policy_history() == []
    assert store.policy_document(0) == ""
    latest, sources = store.policy_sources()
    assert latest is None and set(sources.values()) == {None}


def test_versions_grow_and_the_latest_is_in_force(store, clock):
    assert store.set_policy(V1, "alice", "nightly lending") == 1
    clock.now += timedelta(hours=1)
    assert store.set_policy(V2, "bob") == 2
    assert store.policy_version() == 2
    policy = store.load_policy()
    assert policy.preemption_grace == timedelta(minutes=5)
    assert policy.reserve_after == timedelta(0) and not policy.borrowing
    history = store.policy_history()
    assert [(v.version, v.actor, v.comment) for v in history] == [
        (1, "alice", "nightly lending"), (2, "bob", None)]
    assert history[1].created_at - history[0].created_at == timedelta(hours=1)
    assert store.policy_document(1) == V1  # as given, comments kept


def test_a_set_writes_an_event_with_the_unified_diff(store):
    store.set_policy(V1, "alice")
    store.set_policy(V2, "bob", "longer grace")
    event = store.events(subject="policy")[-1]
    assert (event.kind, event.actor, event.reason) == ("policy.set", "bob", "longer grace")
    assert event.data["version"] == 2
    assert set(event.data["changed"]) == {"preemption_grace", "reserve_after"}
    assert "-preemption_grace: 90s\n+preemption_grace: 5m\n" in event.data["diff"]
    assert event.data["diff"].startswith("--- v1\n+++ v2\n")


@pytest.mark.parametrize(("document", "field"), [
    ("borrowing: maybe\n", "borrowing"),
    ("off_peak: {windows: [{start: '20:00', end: '8:15'}]}\n", "off_peak.windows[0].end"),
    ("borrowing: [\n", "yaml"),
])
def test_a_refused_document_leaves_history_and_policy_unchanged(store, document, field):
    store.set_policy(V1, "alice")
    events_before = len(store.events())
    with pytest.raises(SpecError) as caught:
        store.set_policy(document, "mallory")
    assert caught.value.field == field
    assert store.policy_version() == 1
    assert store.policy_document(1) == V1
    assert len(store.events()) == events_before


def test_an_unchanged_policy_is_refused(store):
    with pytest.raises(SpecError, match="the defaults says the same"):
        store.set_policy("{}\n", "alice")
    store.set_policy(V1, "alice")
    # Same values, other text: still no change to the policy in force.
    with pytest.raises(SpecError, match="v1 says the same"):
        store.set_policy("preemption_grace: 90\nborrowing: no\n", "bob")
    assert store.policy_version() == 1


def test_restore_makes_an_old_document_the_next_version(store):
    store.set_policy(V1, "alice")
    store.set_policy(V2, "bob")
    assert store.restore_policy(1, "carol", "roll back") == 3
    latest = store.policy_history()[-1]
    assert (latest.version, latest.restored_from, latest.document) == (3, 1, V1)
    assert store.load_policy().preemption_grace == timedelta(seconds=90)
    with pytest.raises(NotFoundError):
        store.restore_policy(9, "carol")
    with pytest.raises(SpecError):
        store.restore_policy(3, "carol")  # v3 is in force already


def test_each_value_names_the_version_it_comes_from(store, clock):
    store.set_policy(V1, "alice")
    clock.now += timedelta(days=1)
    store.set_policy(V2, "bob")
    latest, sources = store.policy_sources()
    assert latest.version == 2
    assert sources["borrowing"].version == 1  # the same since v1
    assert sources["borrowing"].label == "v1 by alice at 2026-12-01 09:00 UTC"
    assert sources["preemption_grace"].version == 2
    assert sources["reserve_after"].version == 2
    assert sources["headroom"] is None


def test_policy_in_force_records_a_changed_file_once(store, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(V1)
    assert not policy_in_force(store, str(path), "executor@a").borrowing
    assert store.policy_version() == 1
    assert store.policy_history()[0].actor == "executor@a"
    # Unchanged file: nothing new; a second scheduler starting sees the same.
    policy_in_force(store, str(path), "executor@b")
    assert store.policy_version() == 1
    path.write_text(V2)
    assert policy_in_force(store, str(path), "executor@b").reserve_after == timedelta(0)
    assert store.policy_version() == 2
    # No file: the store's latest.
    assert policy_in_force(store, None, "executor@c") == store.load_policy()


def test_policy_in_force_refuses_a_bad_file_and_writes_nothing(store, tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text("borrowing: false\nheadroom: [{gpus: -2}]\n")
    with pytest.raises(SpecError) as caught:
        policy_in_force(store, str(path), "executor@a")
    assert str(caught.value).startswith(f"{path}: headroom[0].gpus: got -2")
    with pytest.raises(SpecError, match="an existing, readable file"):
        policy_in_force(store, str(tmp_path / "missing.yaml"), "executor@a")
    assert store.policy_version() == 0
