"""Teams, nodes, node states and GPU readings — each change with its event."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

import pytest
from tests.store.factories import make_node, place, seed, submit

from gpu_pool.errors import NotFoundError, SpecError
from gpu_pool.model import Gpu, NodeState, Team, Tier
from gpu_pool.store import Store


def test_teams_upsert_and_list(store: Store) -> None:
    store.upsert_team(Team("nlp"), "alice")
    store.upsert_team(Team("vision", notify_email="v@example.com"), "alice")
    store.upsert_team(Team("nlp", notify_webhook="https://hooks.example.com/x"), "bob")
    assert store.list_teams() == [Team("nlp", None, "https://hooks.example.com/x"),
                                  Team("vision", "v@example.com", None)]
    kinds = [(e.subject, e.kind, e.actor) for e in store.events()]
    assert kinds == [("nlp", "team.added", "alice"), ("vision", "team.added", "alice"),
                     ("nlp", "team.updated", "bob")]


def test_nodes_round_trip_with_every_field(store: Store) -> None:
    node = make_node("gpu-a", 2, "H100", zone="rack-7", tier=Tier.EDGE, ssh_conn_id="ssh_a",
                     bandwidth_mb_s=250.5, labels={"site": "paris"})
    store.import_nodes([node, make_node("gpu-b", 1, "T4")], "test")
    assert store.get_node("gpu-a") == node
    assert [n.name for n in store.list_nodes()] == ["gpu-a", "gpu-b"]
    assert store.get_node("nope") is None
    assert [e.kind for e in store.events(subject="gpu-a")] == ["node.added"]


def test_import_refuses_a_stored_name_unless_replace(store: Store) -> None:
    store.import_nodes([make_node("n1")], "test")
    with pytest.raises(SpecError) as caught:
        store.import_nodes([make_node("n9"), make_node("n1")], "test")
    assert caught.value.field == "name" and caught.value.value == "n1"
    assert "--replace" in str(caught.value)
    assert store.get_node("n9") is None  # all or nothing
    with pytest.raises(SpecError, match="once per import"):
        store.import_nodes([make_node("x"), make_node("x")], "test")


def test_replace_updates_fields_and_gpus(store: Store) -> None:
    store.import_nodes([make_node("n1", 4)], "test")
    store.import_nodes([make_node("n1", 2, zone="z9", cpu_milli=8000)], "test", replace=True)
    node = store.get_node("n1")
    assert (node.zone, node.cpu_milli, node.gpu_count) == ("z9", 8000, 2)
    store.import_nodes([make_node("n1", 3)], "test", replace=True)
    assert store.get_node("n1").gpu_count == 3
    assert [e.kind for e in store.events(subject="n1")] == ["node.added", "node.updated",
                                                            "node.updated"]


def test_replace_refuses_to_remove_a_held_gpu(store: Store, now: datetime) -> None:
    seed(store, nodes=[make_node("n1", 4)])
    submit(store, "r1", now, gpus=1)
    assert place(store, "r1", "n1", [3], now).placed == ["r1"]
    with pytest.raises(SpecError) as caught:
        store.import_nodes([make_node("n1", 2)], "test", replace=True)
    assert caught.value.field == "gpus" and "GPU 3" in caught.value.expected
    assert store.get_node("n1").gpu_count == 4
    store.import_nodes([make_node("n1", 4, model="A100", zone="zz")], "test", replace=True)
    assert store.get_node("n1").zone == "zz"


def test_replace_with_another_state_goes_through_the_state_owner(store: Store) -> None:
    store.import_nodes([make_node("n1")], "test")
    store.import_nodes([make_node("n1", state=NodeState.DOWN)], "test", replace=True)
    assert store.get_node("n1").state is NodeState.DOWN
    assert store.events(subject="n1")[-1].data == {
        "from": "up", "to": "down", "before": {"state": "up"}, "after": {"state": "down"}}


def test_set_node_state_writes_an_event_and_refuses_unknown(store: Store) -> None:
    store.import_nodes([make_node("n1"), make_node("n2")], "test")
    assert store.set_node_state("n1", NodeState.DRAINING, "ops", "disk swap") is True
    assert store.set_node_state("n1", NodeState.DRAINING, "ops", "again") is False
    assert store.get_node("n1").state is NodeState.DRAINING
    event = store.events(subject="n1")[-1]
    assert (event.kind, event.actor, event.reason, event.data) == (
        "node.state", "ops", "disk swap", {"from": "up", "to": "draining",
                                           "before": {"state": "up"},
                                           "after": {"state": "draining"}})
    with pytest.raises(NotFoundError, match="no node named 'ghost'; known nodes: n1, n2"):
        store.set_node_state("ghost", NodeState.DOWN, "ops", "x")


def test_a_node_back_up_keeps_no_drain_reason(store: Store) -> None:
    from gpu_pool.api.queries import node_state_reasons

    store.import_nodes([make_node("n1")], "test")
    store.set_node_state("n1", NodeState.DRAINING, "ops", "disk swap")
    assert node_state_reasons(store.engine)["n1"] == "disk swap"
    store.set_node_state("n1", NodeState.UP, "ops", "disk swapped")
    assert node_state_reasons(store.engine)["n1"] is None
    assert store.events(subject="n1")[-1].reason == "disk swapped"  # the why stays in the log


def test_gpu_readings_update_gpus_and_append_samples(store: Store, now: datetime) -> None:
    store.import_nodes([make_node("n1", 2)], "test")
    store.record_gpu_readings("n1", [{"index": 0, "utilization_pct": 87.5,
                                      "memory_used_mib": 1000, "healthy": True},
                                     {"index": 1, "utilization_pct": 0.0, "healthy": False}], now)

    class Reading:  # objects with attributes are accepted like mappings
        index, utilization_pct, memory_used_mib, healthy = 1, 12.0, 5, True

    store.record_gpu_readings("n1", [Reading()], now + timedelta(minutes=1))
    gpus = store.get_node("n1").gpus
    assert gpus == (Gpu(0, "A100", 80 * 1024, True, 87.5), Gpu(1, "A100", 80 * 1024, True, 12.0))
    with store.engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT COUNT(*) FROM gpu_samples")).scalar() == 3
    health = [(e.subject, e.data) for e in store.events() if e.kind == "gpu.health"]
    assert health == [("n1/1", {"healthy": False}), ("n1/1", {"healthy": True})]
    with pytest.raises(SpecError) as caught:
        store.record_gpu_readings("n1", [{"index": 7}], now)
    assert caught.value.field == "index" and "0, 1" in caught.value.expected
    with pytest.raises(NotFoundError):
        store.record_gpu_readings("ghost", [{"index": 0}], now)


def test_node_labels_are_copied_not_shared(store: Store) -> None:
    labels = {"a": "1"}
    node = make_node("n1", labels=labels)
    store.import_nodes([node], "test")
    labels["a"] = "2"
    assert store.get_node("n1").labels == {"a": "1"}
    assert replace(node, labels={"a": "1"}) == store.get_node("n1")
