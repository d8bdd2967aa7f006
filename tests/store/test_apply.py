"""Snapshots and plans: guarded placements, drops instead of errors, preemptions, reasons."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.store.factories import make_node, make_quota, part, place, plan_of, seed, submit

from gpu_pool.engine.types import Preemption, ReasonCode
from gpu_pool.model import (
    Allocation,
    AllocationState,
    NodeState,
    Outcome,
    Policy,
    PriorityClass,
    Purpose,
    RequestState,
)
from gpu_pool.store import Store


def test_snapshot_holds_nodes_allocations_pending_and_quotas(store: Store, now: datetime) -> None:
    seed(store)
    quota = store.set_quota(make_quota(start=now), "admin")
    submit(store, "runs", now, gpus=2)
    submit(store, "waits", now + timedelta(seconds=1))
    place(store, "runs", "n1", [0, 1], now)
    policy = Policy(critical_headroom_gpus=1)
    snap = store.load_snapshot(policy, now)
    assert (snap.policy, snap.now) == (policy, now)
    assert [n.name for n in snap.nodes] == ["n1", "n2"]
    assert [r.name for r in snap.requests] == ["waits"]
    assert snap.quotas == (quota,)
    (held,) = snap.allocations
    assert (held.request_name, held.node, held.gpu_indices, held.state) == (
        "runs", "n1", (0, 1), AllocationState.ACTIVE)


def test_placement_writes_allocation_request_state_and_events(store: Store, now: datetime) -> None:
    seed(store)
    req = submit(store, "r1", now, gpus=2, cpu_milli=4000, memory_mib=1024,
                 time_limit=timedelta(hours=3), priority=PriorityClass.HIGH,
                 purpose=Purpose.INFERENCE, preemptible=True)
    result = store.apply_plan(plan_of(("r1", [part("n1", [2, 3], cpu=4000, mem=1024)])), now,
                              "sched-1")
    assert result.placed == result.applied == ["r1"] and result.dropped == {}
    (alloc,) = result.allocations["r1"]
    expected = Allocation(
        request_name="r1", node="n1", gpu_indices=(2, 3), gpu_milli=1000, cpu_milli=4000,
        memory_mib=1024, team="nlp", purpose=Purpose.INFERENCE, priority=PriorityClass.HIGH,
        gpu_model="A100", started_at=now, ends_by=now + timedelta(hours=3), preemptible=True,
        state=AllocationState.ACTIVE, id=alloc.id, request_id=req.id)
    assert alloc == expected
    assert store.active_allocations() == [expected] == store.allocations_of("r1")
    assert store.request_state("r1") is RequestState.RUNNING
    kinds = [(e.subject_kind, e.kind, e.actor) for e in store.events(since=now)][-2:]
    assert kinds == [("allocation", "allocation.created", "sched-1"),
                     ("request", "request.placed", "sched-1")]


def test_stale_placements_are_dropped_with_reasons(store: Store, now: datetime) -> None:
    seed(store, nodes=[make_node("n1", 4, cpu_milli=8000, memory_mib=4096),
                       make_node("n2", 2, "T4"), make_node("n3", 2)])
    for name in ("taken", *"abcdefghij"):
        submit(store, name, now)
    place(store, "taken", "n1", [0], now)
    store.set_node_state("n2", NodeState.DRAINING, "ops", "maintenance")
    store.record_gpu_readings("n3", [{"index": 1, "healthy": False}], now)
    result = store.apply_plan(plan_of(
        ("a", [part("n1", [0])]),  # GPU already held
        ("b", [part("n2", [0])]),  # node draining
        ("c", [part("n1", [1], cpu=9000)]),  # not enough CPU
        ("d", [part("n1", [1], mem=5000)]),  # not enough RAM
        ("e", [part("n3", [1])]),  # unhealthy GPU
        ("taken", [part("n1", [3])]),  # no longer pending
        ("ghost", [part("n1", [3])]),  # unknown request
        ("f", [part("n9", [0])]),  # unknown node
        ("g", [part("n1", [7])]),  # no such GPU
        ("h", [part("n1", [1, 2])]),  # two GPUs for a one-GPU request
        ("i", [part("n1", [1], 500)]),  # a share for a whole-GPU request
        ("j", [part("n1", [1]), part("n3", [0])]),  # two nodes for a one-node request
    ), now, "sched")
    assert result.placed == []
    assert result.dropped == {
        "a": "GPU n1/0 already has 1000 of 1000 milli held",
        "b": "node n2 is draining",
        "c": "node n1 has 8000 millicores free",
        "d": "node n1 has 4096 MiB RAM free",
        "e": "GPU n3/1 is unhealthy",
        "taken": "the request is running, no longer pending",
        "ghost": "no such request in the store",
        "f": "node 'n9' is not in the store",
        "g": "node n1 has no GPU 7",
        "h": "the plan gives 2 GPU(s) on n1; the request needs 1",
        "i": "the plan gives 500 milli per GPU; the request needs 1000",
        "j": "the plan gives 2 node(s); the request needs 1 distinct nodes",
    }
    assert [a.request_name for a in store.active_allocations()] == ["taken"]
    assert {r.name for r in store.pending_requests()} == set("abcdefghij")


def test_one_drop_does_not_undo_the_other_placements(store: Store, now: datetime) -> None:
    seed(store)
    for name in ("first", "clash", "third"):
        submit(store, name, now)
    result = store.apply_plan(plan_of(("first", [part("n1", [0])]), ("clash", [part("n1", [0])]),
                                      ("third", [part("n1", [1])])), now, "sched")
    assert result.placed == ["first", "third"]
    assert list(result.dropped) == ["clash"]


def test_a_gang_is_placed_whole_or_not_at_all(store: Store, now: datetime) -> None:
    seed(store, nodes=[make_node("n1", 2), make_node("n2", 2)])
    submit(store, "blocker", now)
    submit(store, "gang", now, gpus=2, nodes=2)
    place(store, "blocker", "n2", [1], now)
    result = store.apply_plan(plan_of(("gang", [part("n1", [0, 1]), part("n2", [0, 1])])), now,
                              "sched")
    assert list(result.dropped) == ["gang"]
    assert [a.request_name for a in store.active_allocations()] == ["blocker"]
    store.release_request("blocker", Outcome.SUCCESS, "t", "done", now)
    result = store.apply_plan(plan_of(("gang", [part("n1", [0, 1]), part("n2", [0, 1])])), now,
                              "sched")
    assert result.placed == ["gang"]
    assert sorted(a.node for a in store.allocations_of("gang")) == ["n1", "n2"]


def test_shares_pack_one_gpu_up_to_1000_milli(store: Store, now: datetime) -> None:
    seed(store)
    for name in ("s1", "s2", "s3"):
        submit(store, name, now, gpu_milli=400)
    result = store.apply_plan(plan_of(*[(n, [part("n2", [0], 400)]) for n in ("s1", "s2", "s3")]),
                              now, "sched")
    assert result.placed == ["s1", "s2"]
    assert result.dropped == {"s3": "GPU n2/0 already has 800 of 1000 milli held"}


def test_pending_reasons_are_persisted_and_cleared_when_placed(store: Store,
                                                               now: datetime) -> None:
    seed(store)
    submit(store, "r1", now)
    store.apply_plan(plan_of(pending=[("r1", ReasonCode.WAITING_FOR_CAPACITY,
                                       "needs 4 A100 on one node; largest free block is 3")]),
                     now, "sched")
    assert store.request_reason("r1") == ("waiting_for_capacity",
                                          "needs 4 A100 on one node; largest free block is 3")
    place(store, "r1", "n1", [0], now)
    assert store.request_reason("r1") is None


def test_preemption_ends_the_whole_request_and_requeues_it(store: Store, now: datetime) -> None:
    seed(store, nodes=[make_node("n1", 2), make_node("n2", 2)])
    submit(store, "batch", now, gpus=2, nodes=2, priority=PriorityClass.BATCH, preemptible=True)
    submit(store, "urgent", now, gpus=2, priority=PriorityClass.CRITICAL)
    store.apply_plan(plan_of(("batch", [part("n1", [0, 1]), part("n2", [0, 1])])), now, "s")
    victim = store.allocations_of("batch")[0]
    later = now + timedelta(minutes=30)
    result = store.apply_plan(plan_of(
        ("urgent", [part("n1", [0, 1])]),
        preemptions=[Preemption(victim.id, "batch", "urgent", "critical work needs n1")]),
        later, "s", Policy())
    assert result.preempted == [victim.id] and result.placed == ["urgent"]
    assert store.request_state("batch") is RequestState.PENDING
    assert {a.state for a in store.allocations_of("batch")} == {AllocationState.PREEMPTED}
    entries = store.ledger()
    assert [(e.request_name, e.outcome, e.gpus) for e in entries] == [
        ("batch", Outcome.PREEMPTED, 2.0), ("batch", Outcome.PREEMPTED, 2.0)]
    assert entries[0].gpu_hours == 1.0 and entries[0].cost == 2.2  # A100 at 2.20 per GPU-hour
    requeued = store.events(subject="batch")[-1]
    assert requeued.kind == "request.requeued" and "urgent" in requeued.reason
    # the same (now stale) preemption again changes nothing
    again = store.apply_plan(plan_of(preemptions=[Preemption(victim.id, "batch", "urgent", "x")]),
                             later, "s")
    assert again.preempted == [] and len(store.ledger()) == 2


def test_estimates_are_stored_with_reasons_and_ratios_learned(store: Store,
                                                               now: datetime) -> None:
    """Both backends: the plan's start estimates kept with the reasons, cleared when the
    request leaves pending; finished work's run time / limit read back as ratios."""
    from gpu_pool.engine import plan as run_engine
    from gpu_pool.model import Outcome, Policy

    seed(store)
    hour = timedelta(hours=1)
    submit(store, "done", now - 9 * hour, gpus=1, time_limit=4 * hour)
    place(store, "done", "n1", [0], now - 9 * hour)
    store.release_request("done", Outcome.SUCCESS, "t", "ok", now - 8 * hour)  # ran 1/4
    submit(store, "busy", now, gpus=4, time_limit=2 * hour)
    place(store, "busy", "n1", [0, 1, 2, 3], now)
    submit(store, "wait", now, gpus=4, time_limit=hour)
    snapshot = store.load_snapshot(Policy(), now)
    assert snapshot.runtime_ratios == (0.25,)
    p = run_engine(snapshot)
    assert p.estimates == {"wait": now + 0.5 * hour}  # busy: 2 h x 0.25
    store.apply_plan(p, now, "sched")
    assert store.estimated_start("wait") == now + 0.5 * hour
    assert store.request_reason("wait")[0] == "waiting_for_capacity"
    store.release_request("wait", Outcome.CANCELLED, "t", "gone", now + hour)
    assert store.estimated_start("wait") is None
