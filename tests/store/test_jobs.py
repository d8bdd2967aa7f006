"""Remote jobs and preemption stops: the outbox that makes preemption with grace crash-safe."""

from __future__ import annotations

from datetime import datetime, timedelta

from tests.store.factories import make_node, part, plan_of, seed, submit

from gpu_pool.engine.types import Preemption
from gpu_pool.model import Policy, PriorityClass, RequestState
from gpu_pool.store import Store


def _job(job_id: str, node: str = "n1") -> dict[str, str]:
    return {"job_id": job_id, "node": node, "ssh_conn_id": f"ssh_{node}", "base_dir": "/tmp/j"}


def _victim_running(store: Store, now: datetime) -> str:
    seed(store, nodes=[make_node("n1", 2), make_node("n2", 2)])
    submit(store, "batch", now, gpus=2, nodes=2, priority=PriorityClass.BATCH, preemptible=True)
    submit(store, "urgent", now, gpus=2, priority=PriorityClass.CRITICAL)
    store.apply_plan(plan_of(("batch", [part("n1", [0, 1]), part("n2", [0, 1])])), now, "s")
    return str(store.allocations_of("batch")[0].id)


def test_a_preemption_requests_the_stop_of_the_jobs_in_its_transaction(
        store: Store, now: datetime) -> None:
    victim = _victim_running(store, now)
    assert store.record_jobs("batch", [_job("j-a", "n1"), _job("j-b", "n2")]) is None
    assert store.stops_due() == []
    store.apply_plan(plan_of(("urgent", [part("n1", [0, 1])]), preemptions=[
        Preemption(victim, "batch", "urgent", "critical work needs n1", grace_s=45.0)]),
        now + timedelta(minutes=5), "s", Policy())
    due = store.stops_due()
    assert [(j.job_id, j.stop_reason, j.stop_grace_s) for j in due] == [
        ("j-a", "preempted", 45.0), ("j-b", "preempted", 45.0)]
    assert "preempted for urgent: critical work needs n1" in (due[0].stop_message or "")
    assert due[0].to_spec() == _job("j-a", "n1")
    # Its pending reason says who preempted it until a plan says otherwise.
    assert store.request_reason("batch") == (
        "preempted", "preempted for urgent: critical work needs n1")
    assert store.mark_stop_sent(["j-a"]) == 1
    assert store.mark_stop_sent(["j-a"]) == 0  # sent once
    assert [j.job_id for j in store.stops_due()] == ["j-b"]


def test_the_tasks_own_grace_wins_and_the_policy_default_fills_in(
        store: Store, now: datetime) -> None:
    victim = _victim_running(store, now)
    store.record_jobs("batch", [_job("own")], grace_s=300.0)
    store.apply_plan(plan_of(preemptions=[Preemption(victim, "batch", "urgent", "m")]),
                     now, "s", Policy(preemption_grace=timedelta(seconds=90)))
    assert [(j.job_id, j.stop_grace_s) for j in store.stops_due()] == [("own", 300.0)]


def test_jobs_recorded_after_their_request_was_preempted_are_stopped_too(
        store: Store, now: datetime) -> None:
    """The operator starts its jobs while the plan preempts it: the later record sees the
    allocations gone and requests the stop itself, so nothing runs on GPUs it lost."""
    victim = _victim_running(store, now)
    store.apply_plan(plan_of(preemptions=[Preemption(victim, "batch", "urgent", "m",
                                                     grace_s=30.0)]), now, "s", Policy())
    assert store.request_state("batch") is RequestState.PENDING
    assert store.record_jobs("batch", [_job("late")], grace_s=20.0) == "preempted"
    (due,) = store.stops_due()
    assert (due.job_id, due.stop_reason, due.stop_grace_s) == ("late", "preempted", 20.0)
    assert "preempted for urgent" in (due.stop_message or "")


def test_a_stale_preemption_requests_no_second_stop(store: Store, now: datetime) -> None:
    victim = _victim_running(store, now)
    store.record_jobs("batch", [_job("j")])
    preemption = Preemption(victim, "batch", "urgent", "first", grace_s=10.0)
    store.apply_plan(plan_of(preemptions=[preemption]), now, "s", Policy())
    store.mark_stop_sent(["j"])
    again = store.apply_plan(plan_of(preemptions=[preemption]), now, "s", Policy())
    assert again.preempted == [] and store.stops_due() == []
    assert [j.stop_message for j in store.jobs_of("batch")] == [
        "preempted for urgent: first"]


def test_the_jobs_a_winner_waits_for_are_those_preempted_off_its_gpus_lately(
        store: Store, now: datetime, clock) -> None:  # noqa: ANN001
    victim = _victim_running(store, now)
    store.record_jobs("batch", [_job("j-a", "n1"), _job("j-b", "n2")])
    assert store.jobs_stopping_on("n1", [0, 1]) == []  # running, not stopping
    store.apply_plan(plan_of(("urgent", [part("n1", [0, 1])]), preemptions=[
        Preemption(victim, "batch", "urgent", "m", grace_s=45.0)]), now, "s", Policy())
    clock.now = now + timedelta(minutes=1)
    assert [j.job_id for j in store.jobs_stopping_on("n1", [1])] == ["j-a"]
    assert [j.job_id for j in store.jobs_stopping_on("n2", [0, 1])] == ["j-b"]
    assert store.jobs_stopping_on("n1", [2, 3]) == []  # other GPUs of the node
    assert store.jobs_stopping_on("n3", [0]) == []
    # Past the longest grace and a margin, a stop is history: nothing to wait for.
    clock.now = now + timedelta(hours=2)
    assert store.jobs_stopping_on("n1", [0, 1]) == []
