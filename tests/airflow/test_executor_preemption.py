"""The executor's preemption step in-process, over a real SQLite store and the real engine.

A critical request preempts a running batch one; the executor must stop the batch task's
remote jobs (never its local process while they are recorded), never block the heartbeat on
SSH, keep the preempted request's place in line, and let a preempted deferred task resume.
"""

from __future__ import annotations

import subprocess
import time
from typing import Any

import pytest

from gpu_pool.engine.types import Preemption
from gpu_pool.executor import _Started
from gpu_pool.executor_support.cycle import Binding
from gpu_pool.model import Policy, RequestState
from gpu_pool.store import Store
from tests.airflow.test_executor_inprocess import _workload, executor, store  # noqa: F401


def _placed(executor: Any, task_id: str = "t", **spec: Any) -> tuple[Any, str]:  # noqa: F811
    wl = _workload(task_id, {"team": "nlp", "gpus": 2, "priority": "batch", **spec})
    executor.queued_tasks[wl.ti.key] = wl
    executor._admit_new()
    name = executor._names[wl.ti.key]
    (binding,) = executor.cycle.run({name}).bindings
    assert binding.request_name == name
    return wl, name


def _preempt(store: Store, name: str, grace: float = 30.0) -> None:  # noqa: F811
    from gpu_pool.engine.types import Plan, SolveStats, SolveStatus

    (allocation,) = store.active_allocations()
    store.apply_plan(Plan(placements=(), pending=(), preemptions=(
        Preemption(str(allocation.id), name, "urgent", "critical work needs node-a",
                   grace_s=grace),), stats=SolveStats(SolveStatus.TRIVIAL, 0, 0, 0)),
        store.clock(), "test", Policy())


def _job(job_id: str, conn: str = "no_such_conn") -> dict[str, str]:
    return {"job_id": job_id, "node": "node-a", "ssh_conn_id": conn, "base_dir": "/tmp/j"}


def test_a_preempted_task_is_left_to_its_remote_stop_not_sigtermed(
        executor: Any, store: Store) -> None:  # noqa: F811
    wl, name = _placed(executor)
    store.record_jobs(name, [_job("job-1")])
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        executor._started[wl.ti.key] = _Started(wl.ti.key, str(wl.ti.id), name, process, 0.0)
        _preempt(store, name)
        executor._stop_dispossessed()
        time.sleep(0.3)
        assert process.poll() is None  # the remote kill and the reschedule handle it
    finally:
        process.kill()
        process.wait()


def test_a_preempted_task_with_no_recorded_job_is_stopped_after_the_wait(
        executor: Any, store: Store) -> None:  # noqa: F811
    """The fallback when the task could not record its jobs (store unreachable from it)."""
    wl, name = _placed(executor)
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        executor._started[wl.ti.key] = _Started(wl.ti.key, str(wl.ti.id), name, process, 0.0)
        _preempt(store, name)
        executor.preempt_record_wait_s = 0.5
        executor._stop_dispossessed()
        time.sleep(0.2)
        assert process.poll() is None  # it may be recording its jobs right now
        time.sleep(0.5)
        executor._stop_dispossessed()
        process.wait(5)
        assert process.returncode == -15
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_stops_never_block_the_heartbeat_and_a_failed_one_stays_due(
        executor: Any, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    from gpu_pool.executor_support import preemption

    _, name = _placed(executor)
    store.record_jobs(name, [_job("slow"), _job("broken")])
    _preempt(store, name, grace=45.0)
    sent: list[tuple[str, float]] = []

    def fake_send(store: Store, job: Any) -> str:  # noqa: F811
        time.sleep(1.0)  # a node slow to answer
        if job.job_id == "broken":
            raise OSError("connection refused")
        sent.append((job.job_id, job.stop_grace_s))
        store.mark_stop_sent([job.job_id])
        return "sent"

    monkeypatch.setattr(preemption, "send_stop", fake_send)
    began = time.monotonic()
    executor._send_stops(now_due=True)
    assert time.monotonic() - began < 0.5  # the heartbeat went on
    executor._send_stops(now_due=True)  # in flight: not sent twice
    executor._wait_stops(timeout=10)
    assert sent == [("slow", 45.0)]
    assert [j.job_id for j in store.stops_due()] == ["broken"]  # retried next check


def test_a_real_kill_to_an_unknown_connection_fails_in_the_pool(
        executor: Any, store: Store) -> None:  # noqa: F811
    _, name = _placed(executor)
    store.record_jobs(name, [_job("orphan")])
    _preempt(store, name)
    executor._send_stops(now_due=True)
    executor._wait_stops(timeout=30)
    assert [j.job_id for j in store.stops_due()] == ["orphan"]


def test_a_rescheduled_task_keeps_its_request_and_place_in_line(
        executor: Any, store: Store) -> None:  # noqa: F811
    """After a restart the task comes back QUEUED with the same key: the executor adopts
    the PENDING request the preemption left, with its submitted_at."""
    from gpu_pool.executor import GpuPoolExecutor

    wl, name = _placed(executor)
    submitted = store.get_request(name).submitted_at
    _preempt(store, name)
    restarted = GpuPoolExecutor(parallelism=8)
    restarted.start()
    restarted.queued_tasks[wl.ti.key] = wl
    restarted._admit_new()
    assert restarted._names[wl.ti.key] == name
    request = store.get_request(name)
    assert store.request_state(name) is RequestState.PENDING
    assert request.submitted_at == submitted
    (binding,) = restarted.cycle.run({name}).bindings  # placed again: the GPUs are free
    assert binding.request_name == name and binding.live


def test_a_preempted_deferred_task_resumes_at_once_to_reschedule(
        executor: Any, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """Its resume only reads the trigger's event and reschedules: it needs no GPU, so it
    is bound (not live) to what it lost instead of waiting for a new placement."""
    wl, name = _placed(executor)
    store.record_jobs(name, [_job("j")])
    lost = store.active_allocations()
    _preempt(store, name)
    # A critical task now holds the GPUs: a new placement would wait.
    other = _workload("urgent", {"team": "nlp", "gpus": 2, "priority": "critical"})
    executor.queued_tasks[other.ti.key] = other
    executor._admit_new()
    executor.cycle.run(set(executor._names.values()))
    started: list[tuple[Any, Binding]] = []
    monkeypatch.setattr(executor, "_start", lambda key, binding: started.append((key, binding)))
    executor._resuming.add(wl.ti.key)  # seen deferred, now queued again
    executor.trigger_tasks(open_slots=4)
    resumed = [(k, b) for k, b in started if k == wl.ti.key]
    assert len(resumed) == 1
    binding = resumed[0][1]
    assert binding.live is False and [a.id for a in binding.allocations] == [a.id for a in lost]


def test_a_hung_stop_is_sent_again(
        executor: Any, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    import threading

    from gpu_pool.executor_support import preemption

    _, name = _placed(executor)
    store.record_jobs(name, [_job("wedged")])
    _preempt(store, name)
    release = threading.Event()
    calls: list[str] = []

    def fake_send(store: Store, job: Any) -> str:  # noqa: F811
        calls.append(job.job_id)
        if len(calls) == 1:
            release.wait(30)  # the first kill's thread wedges
            return "late"
        store.mark_stop_sent([job.job_id])
        return "sent"

    monkeypatch.setattr(preemption, "send_stop", fake_send)
    monkeypatch.setattr(preemption, "STOP_HUNG_S", 0.3)
    try:
        executor._send_stops(now_due=True)
        executor._send_stops(now_due=True)  # not hung yet: not sent twice
        assert calls == ["wedged"]
        time.sleep(0.4)
        executor._send_stops(now_due=True)
        deadline = time.monotonic() + 10
        while store.stops_due() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert calls == ["wedged", "wedged"] and store.stops_due() == []
    finally:
        release.set()
