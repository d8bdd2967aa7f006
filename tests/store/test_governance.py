"""Governance in the store (SQLite and PostgreSQL): members and the charge rule, freeze
windows that lift themselves on the clock, versioned templates with restore and approvals,
and the audit trail of every change (who, when, before, after)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from tests.store.conftest import Clock
from tests.store.factories import make_node, make_quota, seed

from gpu_pool.errors import ConflictError, NotFoundError, SpecError
from gpu_pool.store import Store
from gpu_pool.store.governance import FrozenError


def test_members_and_the_charge_rule(store: Store) -> None:
    seed(store, teams=("nlp", "cv"))
    store.check_charge("nlp", ["anyone"])  # no members on record: open
    with pytest.raises(SpecError, match="nobody"):
        store.check_charge("nlp", [], require_membership=True)
    store.add_member("nlp", "alice", "admin", role="lead")
    store.add_member("nlp", "bob", "admin")
    assert [(m.username, m.role) for m in store.members("nlp")] == [("alice", "lead"),
                                                                   ("bob", "member")]
    store.check_charge("nlp", ["airflow", "bob"])  # the triggering user is a member
    with pytest.raises(SpecError) as refused:
        store.check_charge("nlp", ["airflow", "mallory"])
    message = str(refused.value)
    assert "team: got 'nlp'" in message and "mallory" in message and "alice, bob" in message
    assert "gpu-pool team add-member nlp USER" in message
    assert store.is_lead("nlp", "alice") and not store.is_lead("nlp", "bob")
    store.add_member("nlp", "bob", "admin", role="lead")  # a role change, one event
    store.remove_member("nlp", "alice", "admin")
    with pytest.raises(NotFoundError, match="bob"):
        store.remove_member("nlp", "alice", "admin")
    with pytest.raises(SpecError, match="user: got 'a b'"):
        store.add_member("nlp", "a b", "admin")
    with pytest.raises(SpecError, match="role: got 'owner'; expected member or lead"):
        store.add_member("nlp", "carol", "admin", role="owner")
    with pytest.raises(SpecError, match="a known team"):
        store.add_member("nope", "carol", "admin")
    trail = [(e.kind, e.data["user"], e.data["before"], e.data["after"])
             for e in store.audit(team="nlp", kind="team") if e.kind.startswith("team.member")]
    assert trail == [("team.member_added", "alice", None, {"role": "lead"}),
                     ("team.member_added", "bob", None, {"role": "member"}),
                     ("team.member_role", "bob", {"role": "member"}, {"role": "lead"}),
                     ("team.member_removed", "alice", {"role": "lead"}, None)]


def test_a_freeze_refuses_changes_and_lifts_itself_at_its_end(store: Store, clock: Clock,
                                                              now: datetime) -> None:
    seed(store, teams=("nlp", "cv"), nodes=[make_node("n1")])
    store.import_nodes([make_node("n-nlp", labels={"team": "nlp"})], "admin")
    freeze = store.set_freeze("nlp", now + timedelta(days=2), "release week", "alice")
    assert freeze.state(now) == "active"
    with pytest.raises(FrozenError) as refused:
        store.set_quota(make_quota("nlp", 4, start=now), "admin")
    message = str(refused.value)
    assert "team nlp is frozen" in message and "alice: release week" in message
    assert (now + timedelta(days=2)).strftime("%Y-%m-%d %H:%M UTC") in message
    assert f"gpu-pool freeze lift {freeze.id}" in message
    with pytest.raises(FrozenError, match="changing its nodes"):
        store.import_nodes([make_node("n-nlp", gpus=2, labels={"team": "nlp"})], "admin",
                           replace=True)
    with pytest.raises(FrozenError, match="changing template"):
        store.save_template("llm", {"gpus": 2}, "alice", team="nlp")
    assert store.list_quotas() == []  # nothing half-written
    store.set_quota(make_quota("cv", 4, start=now), "admin")  # another team: not frozen
    store.import_nodes([make_node("n1", gpus=2)], "admin", replace=True)  # no team label

    clock.now = now + timedelta(days=2)  # the end: it lifts itself
    store.set_quota(make_quota("nlp", 4, start=clock.now), "admin")
    (ended,) = store.freezes("nlp")
    assert ended.state(clock.now) == "ended" and ended.lifted_by == "schedule"
    events = [(e.kind, e.actor, e.at) for e in store.audit(kind="freeze")]
    assert events == [("freeze.set", "alice", now),
                      ("freeze.ended", "schedule", now + timedelta(days=2))]


def test_a_freeze_needs_an_explicit_future_end_and_can_be_lifted_early(
        store: Store, clock: Clock, now: datetime) -> None:
    seed(store, teams=("nlp",))
    with pytest.raises(SpecError, match="until: .*a time in the future"):
        store.set_freeze("nlp", now - timedelta(hours=1), "late", "alice")
    with pytest.raises(SpecError, match="reason"):
        store.set_freeze("nlp", now + timedelta(hours=1), " ", "alice")
    later = store.set_freeze("nlp", now + timedelta(days=3), "audit", "alice",
                             starts_at=now + timedelta(days=1))
    store.set_quota(make_quota("nlp", 2, start=now), "admin")  # not started yet
    assert later.state(now) == "scheduled"
    clock.now = now + timedelta(days=1, hours=1)
    with pytest.raises(FrozenError):
        store.set_quota(make_quota("nlp", 3, start=now), "admin")
    lifted = store.lift_freeze(later.id, "bob")
    assert lifted.state(clock.now) == "lifted" and lifted.lifted_by == "bob"
    store.set_quota(make_quota("nlp", 3, start=now), "admin")
    with pytest.raises(ConflictError, match="already lifted"):
        store.lift_freeze(later.id, "bob")


def test_templates_are_versioned_restorable_and_approved_per_team(store: Store) -> None:
    seed(store, teams=("nlp", "cv"))
    v1 = store.save_template("llm-ft", {"gpus": 2, "gpu_models": ["A100"], "time_limit": "6h",
                                        "setup": "source /opt/venv/bin/activate"}, "alice",
                             team="nlp")
    assert (v1.version, v1.team) == (1, "nlp")
    assert store.save_template("llm-ft", dict(v1.fields), "alice") == v1  # unchanged: no v2
    v2 = store.save_template("llm-ft", {"gpus": 4}, "bob", comment="bigger")
    assert (v2.version, dict(v2.fields)) == (2, {"gpus": 4})
    v3 = store.restore_template("llm-ft", 1, "carol")
    assert v3.version == 3 and dict(v3.fields) == dict(v1.fields) and v3.restored_from == 1
    assert [(t.version, t.created_by) for t in store.template_history("llm-ft")] == [
        (1, "alice"), (2, "bob"), (3, "carol")]
    assert dict(store.template("llm-ft", 2).fields) == {"gpus": 4}
    with pytest.raises(SpecError, match="template: got 'llm-ft'.*approved for it"):
        store.template_for("llm-ft", "cv")
    assert store.approve_template("llm-ft", "cv", "alice") is True
    assert store.approve_template("llm-ft", "cv", "alice") is False
    assert store.template_for("llm-ft", "cv").approved_for == ("cv",)
    with pytest.raises(SpecError, match="owns llm-ft"):
        store.approve_template("llm-ft", "nlp", "alice")
    with pytest.raises(SpecError, match="fields: got 'name'"):
        store.save_template("bad", {"name": "x"}, "alice", team="nlp")
    with pytest.raises(SpecError, match="gpus"):
        store.save_template("bad", {"gpus": -1}, "alice", team="nlp")
    with pytest.raises(SpecError, match="team: got 'cv'; expected nlp"):
        store.save_template("llm-ft", {"gpus": 1}, "alice", team="cv")
    with pytest.raises(NotFoundError, match="version 9 of template"):
        store.template("llm-ft", 9)
    trail = [(e.kind, e.actor, e.data.get("before"), e.data.get("after"))
             for e in store.audit(kind="template")]
    assert trail[1] == ("template.updated", "bob", dict(v1.fields), {"gpus": 4})
    assert trail[2][0] == "template.restored" and trail[2][3] == dict(v1.fields)
    assert trail[3] == ("template.approved", "alice", None, {"approved_for": "cv"})
    assert [e.kind for e in store.audit(team="cv")] == ["team.added", "template.approved"]


def test_audit_filters_by_kind_actor_and_time(store: Store, clock: Clock, now: datetime) -> None:
    seed(store, teams=("nlp",))
    store.set_quota(make_quota("nlp", 2, start=now), "alice")
    clock.now = now + timedelta(hours=1)
    store.set_quota(make_quota("nlp", 3, start=now), "bob")
    kinds = [(e.kind, e.actor) for e in store.audit(kind="quota")]
    assert kinds == [("quota.created", "alice"), ("quota.updated", "bob")]
    updated = store.audit(kind="quota.updated")
    assert updated[0].data["before"]["gpus"] == 2 and updated[0].data["after"]["gpus"] == 3
    assert [e.actor for e in store.audit(actor="bob")] == ["bob"]
    assert [e.actor for e in store.audit(kind="quota", since=now + timedelta(minutes=30))] == [
        "bob"]
    assert [e.actor for e in store.audit(kind="quota", until=now + timedelta(minutes=30))] == [
        "alice"]
    assert len(store.audit(limit=1)) == 1
    with pytest.raises(SpecError, match="kind: got 'request'"):
        store.audit(kind="request")


def test_node_and_policy_changes_carry_before_and_after(store: Store) -> None:
    seed(store, teams=("nlp",), nodes=[make_node("n1", 4)])
    store.import_nodes([make_node("n1", 2, labels={"team": "nlp"})], "alice", replace=True)
    store.set_node_state("n1", "draining", "bob", reason="maintenance")
    store.set_policy("preemption_grace: 5m\n", "carol")
    trail = {e.kind: e for e in store.audit()}
    added, updated = trail["node.added"], trail["node.updated"]
    assert added.data["before"] is None and added.data["after"]["gpus"] == 4
    assert (updated.data["before"]["gpus"], updated.data["after"]["gpus"]) == (4, 2)
    assert updated.data["after"]["labels"] == {"team": "nlp"}
    assert store.audit(team="nlp", kind="node")[-1].kind == "node.updated"  # its label
    state = trail["node.state"]
    assert (state.data["before"], state.data["after"], state.actor) == (
        {"state": "up"}, {"state": "draining"}, "bob")
    policy = trail["policy.set"]
    assert policy.actor == "carol" and policy.data["after"] == {"preemption_grace": "5m"}
    assert policy.data["before"] == {"preemption_grace": "2m"}
