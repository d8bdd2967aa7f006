"""GpuPoolExecutor in-process over a real SQLite store and the real engine (no scheduler).

Covers what the end-to-end tests cannot pin down cheaply: the capacity accounting that keeps
a GPU backlog from starving ordinary tasks, the stuck-in-queued opt-out, idempotent
admission, and data readiness through the placement cycle.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_pool.engine import plan
from gpu_pool.executor_support.cycle import PlacementCycle
from gpu_pool.model import Policy, Team
from gpu_pool.spec import parse_node, parse_request
from gpu_pool.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    s.migrate()
    s.upsert_team(Team("nlp"), actor="t")
    s.import_nodes([parse_node({"name": "node-a", "gpu_model": "A100", "gpus": 2, "cpu": 8,
                                "memory": "64GiB", "ssh_conn_id": "gpu_node_a"})], actor="t")
    yield s
    s.close()


@pytest.fixture
def executor(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "test-secret")
    monkeypatch.setenv("AIRFLOW__GPU_POOL__STORE_URL", store.url)
    monkeypatch.setenv("AIRFLOW__GPU_POOL__MAX_HELD_TASKS", "3")
    monkeypatch.setenv("AIRFLOW__CORE__PARALLELISM", "8")
    from gpu_pool.executor import GpuPoolExecutor

    ex = GpuPoolExecutor(parallelism=8)
    ex.start()
    return ex


def _workload(task_id: str, spec: dict[str, Any]) -> Any:
    from airflow.executors.workloads import ExecuteTask
    from airflow.executors.workloads.base import BundleInfo
    from airflow.executors.workloads.task import TaskInstanceDTO

    ti = TaskInstanceDTO(id=uuid.uuid4(), task_id=task_id, dag_id="d", run_id="r", try_number=1,
                         dag_version_id=uuid.uuid4(), pool_slots=1, priority_weight=1,
                         executor_config={"gpu_pool": spec})
    return ExecuteTask(ti=ti, dag_rel_path=Path("d.py"), bundle_info=BundleInfo(name="b"),
                       log_path=None, token="")


def test_held_backlog_is_bounded_and_does_not_occupy_shared_slots(executor: Any) -> None:
    assert executor.slots_available == 3
    for i in range(3):
        wl = _workload(f"t{i}", {"team": "nlp", "gpus": 2})
        executor.queued_tasks[wl.ti.key] = wl
    # Held (waiting) workloads do not count against the shared [core] parallelism ...
    assert executor.slots_occupied == 0
    # ... and the executor takes no more of the backlog: the rest stays SCHEDULED upstream.
    assert executor.slots_available == 0


def test_revoke_is_refused_so_stuck_in_queued_skips_gpu_tasks(executor: Any) -> None:
    with pytest.raises(NotImplementedError):
        executor.revoke_task(ti=object())


def test_bad_spec_fails_the_task_at_admission(executor: Any) -> None:
    wl = _workload("bad", {"team": "nobody", "gpus": 1})
    executor.queued_tasks[wl.ti.key] = wl
    executor._admit_new()
    assert wl.ti.key not in executor.queued_tasks
    state, info = executor.event_buffer[wl.ti.key]
    assert state == "failed" and "team" in info


def test_admission_is_idempotent_across_executors(executor: Any, store: Store) -> None:
    wl = _workload("t", {"team": "nlp", "gpus": 1})
    executor.queued_tasks[wl.ti.key] = wl
    executor._admit_new()
    name = executor._names[wl.ti.key]
    assert store.request_external(name)["executor_key"] == str(wl.ti.id)
    # A second scheduler (or a restarted one) meeting the same try does not resubmit.
    other = PlacementCycle(store=store, policy=Policy(), planner=plan, actor="other")
    other.admit(parse_request({"name": name, "team": "nlp", "gpus": 1}), {})
    assert [r.name for r in store.pending_requests()] == [name]


def test_data_not_ready_holds_no_gpu_until_the_oracle_says_ready(store: Store) -> None:
    events: set[str] = set()
    cycle = PlacementCycle(store=store, policy=Policy(), planner=plan, actor="t",
                           data_ready=lambda uris: set(uris) & events, idle_replan_s=0)
    request = parse_request({"name": "train", "team": "nlp", "gpus": 1,
                             "dataset": "s3://corpora/zh"})
    request = dataclasses.replace(request, data_ready=cycle.is_ready(request))
    cycle.admit(request, {})
    report = cycle.run({"train"})
    assert report.bindings == () and store.active_allocations() == []
    assert [r.code for r in report.pending] == ["data_not_ready"]
    events.add("s3://corpora/zh")
    report = cycle.run({"train"})
    assert [b.request_name for b in report.bindings] == ["train"]
    assert store.get_request("train").data_ready


def test_a_task_whose_allocation_ended_elsewhere_is_stopped(executor: Any, store: Store) -> None:
    import subprocess
    import time

    from gpu_pool.executor import _Started

    wl = _workload("t", {"team": "nlp", "gpus": 1})
    executor.queued_tasks[wl.ti.key] = wl
    executor._admit_new()
    executor.cycle.run(set(executor._names.values()))
    name = executor._names[wl.ti.key]
    keeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        executor._started[wl.ti.key] = _Started(wl.ti.key, str(wl.ti.id), name, keeper, 0.0)
        executor._stop_dispossessed()
        assert keeper.poll() is None  # its allocation is active: left alone
        store.release_request(name, "reclaimed", actor="reclaim-sweep", reason="idle")
        executor._started[wl.ti.key] = _Started(wl.ti.key, str(wl.ti.id), name, victim, 0.0)
        executor._stop_dispossessed()
        deadline = time.monotonic() + 5
        while victim.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert victim.poll() == -15
    finally:
        for proc in (keeper, victim):
            proc.kill()
            proc.wait()


def test_a_task_whose_job_ended_is_left_to_conclude_and_its_resume_starts(
        executor: Any, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The trigger gives the GPUs back the moment the remote job ends. The task process
    that is concluding (in-task watcher) is not stopped as dispossessed, and the resume of a
    deferred task whose GPUs already went back starts without waiting for GPUs."""
    import subprocess

    from gpu_pool.executor import _Started

    wl = _workload("t", {"team": "nlp", "gpus": 1})
    executor.queued_tasks[wl.ti.key] = wl
    executor._admit_new()
    name = executor._names[wl.ti.key]
    executor.cycle.run({name})
    store.release_request(name, "success", actor="remote-job", reason="remote job ended")
    concluding = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        executor._started[wl.ti.key] = _Started(wl.ti.key, str(wl.ti.id), name, concluding,
                                                0.0)
        executor._stop_dispossessed()
        time.sleep(0.3)
        assert concluding.poll() is None  # ended by its own job: left alone
    finally:
        concluding.kill()
        concluding.wait()
    del executor._started[wl.ti.key]
    started: list[Any] = []
    monkeypatch.setattr(executor, "_start", lambda key, binding: started.append((key, binding)))
    executor.trigger_tasks(open_slots=4)  # the resume, queued again after the trigger fired
    ((key, binding),) = started
    assert key == wl.ti.key and binding.live is False
    assert [a.node for a in binding.allocations] == ["node-a"]


def test_a_deferred_task_due_to_resume_gets_a_slot_past_a_full_backlog(
        executor: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Waiting workloads fill the bound while a deferred task holds the GPUs they wait for:
    without a slot for its resume the two would wait for each other forever."""
    from gpu_pool.executor import _Watched
    from gpu_pool.executor_support import airflow_reads

    deferred = _workload("deferred", {"team": "nlp", "gpus": 2})
    executor._watched[deferred.ti.key] = _Watched(deferred.ti.key, str(deferred.ti.id),
                                                  "deferred-request", False)
    for i in range(3):
        wl = _workload(f"w{i}", {"team": "nlp", "gpus": 2})
        executor.queued_tasks[wl.ti.key] = wl
    states = {str(deferred.ti.id): "deferred"}
    monkeypatch.setattr(airflow_reads, "task_states",
                        lambda ids: {i: states.get(i) for i in ids})
    monkeypatch.setattr(executor, "reconcile_interval_s", 1e9)
    executor.watch_interval_s = 0.0
    executor._reap()
    assert executor.slots_available == 0  # still in the triggerer: nothing owed
    states[str(deferred.ti.id)] = "scheduled"  # its trigger fired: it must be queued again
    executor._reap()
    assert executor.slots_available == 1
    executor.queued_tasks[deferred.ti.key] = deferred  # the scheduler queued the resume
    states[str(deferred.ti.id)] = "queued"
    executor._reap()
    assert deferred.ti.key not in executor._watched
    assert executor.slots_available == 0  # back to the bound
    executor._watched[deferred.ti.key] = _Watched(deferred.ti.key, str(deferred.ti.id),
                                                  "deferred-request", False)
    states[str(deferred.ti.id)] = "scheduled"
    executor._reap()
    assert executor.slots_available == 1
    executor._watched.clear()  # started again here (``_start`` drops it from the watch)
    executor._reap()
    assert executor.slots_available == 0  # nothing watched: nothing owed


def test_a_cycle_logs_at_info_only_when_it_changed_something(executor: Any) -> None:
    import logging

    import structlog
    from structlog.testing import capture_logs

    executor.cycle.idle_replan_s = 0.0  # plan every heartbeat, as a busy scheduler does
    for task_id in ("first", "second"):  # two 2-GPU tasks on a 2-GPU node: one must wait
        wl = _workload(task_id, {"team": "nlp", "gpus": 2})
        executor.queued_tasks[wl.ti.key] = wl

    def cycle_lines(logs: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(e["log_level"], e["event"].split(" (")[0]) for e in logs
                if str(e["event"]).startswith("gpu-pool cycle")]

    def debug_logger() -> Any:  # Airflow's own logger filters debug before any capture
        return structlog.wrap_logger(
            None, wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))

    with capture_logs() as logs:
        executor._log = debug_logger()
        executor.trigger_tasks(open_slots=0)  # places one (not started: no open slot)
    assert cycle_lines(logs) == [
        ("info", "gpu-pool cycle: placed 1, preempted 0, pending 1, dropped 0")]
    with capture_logs() as logs:
        executor._log = debug_logger()
        for _ in range(3):  # nothing changes: the same cycle, at debug only
            executor.trigger_tasks(open_slots=0)
    assert cycle_lines(logs) == [
        ("debug", "gpu-pool cycle: placed 0, preempted 0, pending 1, dropped 0")] * 3


def test_a_task_charged_to_a_team_its_people_are_not_in_fails_at_admission(
        executor: Any, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from gpu_pool.executor_support import airflow_reads

    people: dict[tuple[str, str], list[str]] = {("d", "r"): ["airflow", "mallory"]}
    monkeypatch.setattr(airflow_reads, "run_people", lambda dag, run: people[(dag, run)])
    open_team = _workload("open", {"team": "nlp", "gpus": 1})  # no members yet: open
    executor.queued_tasks[open_team.ti.key] = open_team
    executor._admit_new()
    assert open_team.ti.key in executor._names
    store.add_member("nlp", "alice", "admin", role="lead")
    refused = _workload("refused", {"team": "nlp", "gpus": 1})
    executor.queued_tasks[refused.ti.key] = refused
    executor._admit_new()
    state, info = executor.event_buffer[refused.ti.key]
    assert state == "failed" and refused.ti.key not in executor.queued_tasks
    assert "airflow, mallory is not a member of nlp" in info and "add-member nlp" in info
    people[("d", "r")] = ["airflow", "alice"]  # alice triggered the run
    allowed = _workload("allowed", {"team": "nlp", "gpus": 1})
    executor.queued_tasks[allowed.ti.key] = allowed
    executor._admit_new()
    assert allowed.ti.key in executor._names


def test_a_template_fills_the_request_and_its_setup_reaches_the_task(
        executor: Any, store: Store) -> None:
    from gpu_pool.executor_support.starting import _template_env

    store.upsert_team(Team("cv"), actor="t")
    store.save_template("ft", {"gpus": 2, "priority": "high", "time_limit": "2h",
                               "setup": "export HF_HOME=/data/hf"}, "alice", team="nlp")
    wl = _workload("ft", {"team": "nlp", "template": "ft", "priority": "low"})
    executor.queued_tasks[wl.ti.key] = wl
    executor._admit_new()
    name = executor._names[wl.ti.key]
    request = store.get_request(name)
    assert (request.gpus, request.priority.value) == (2, "low")  # the task's own field wins
    assert request.time_limit.total_seconds() == 7200
    assert store.request_external(name)["template"] == "ft@v1"
    store.save_template("ft", {"gpus": 1}, "alice")  # a later version: this task keeps v1
    assert _template_env(store, name) == {"GPU_POOL_TEMPLATE": "ft@v1",
                                          "GPU_POOL_SETUP": "export HF_HOME=/data/hf",
                                          "GPU_POOL_TIME_LIMIT_S": "7200.0"}
    other = _workload("other", {"team": "cv", "template": "ft"})  # not approved for cv
    executor.queued_tasks[other.ti.key] = other
    executor._admit_new()
    state, info = executor.event_buffer[other.ti.key]
    assert state == "failed" and "approved for it" in info


def test_a_critical_only_freeze_starts_only_critical_work_until_it_ends(store: Store) -> None:
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    store.set_freeze("nlp", now + timedelta(hours=1), "launch", "alice", critical_only=True)
    clock = {"now": now + timedelta(minutes=1)}
    cycle = PlacementCycle(store=store, policy=Policy(), planner=plan, actor="t",
                           clock=lambda: clock["now"], idle_replan_s=0)
    cycle.admit(parse_request({"name": "train", "team": "nlp", "gpus": 1}), {})
    cycle.admit(parse_request({"name": "hotfix", "team": "nlp", "gpus": 1,
                               "priority": "critical"}), {})
    report = cycle.run({"train", "hotfix"})
    assert report.placed == ("hotfix",)
    (held,) = report.pending
    assert (held.request_name, held.code) == ("train", "frozen")
    assert "frozen until" in held.message and "alice: launch" in held.message
    assert store.request_reason("train")[0] == "frozen"
    clock["now"] = now + timedelta(hours=1, minutes=1)  # the window is over
    cycle.mark_dirty()
    assert cycle.run({"train"}).placed == ("train",)


def test_a_critical_only_freeze_keeps_the_teams_nodes_for_critical_work(store: Store) -> None:
    from datetime import UTC, datetime, timedelta

    store.upsert_team(Team("cv"), actor="t")
    store.import_nodes([parse_node({"name": "node-nlp", "gpu_model": "A100", "gpus": 2,
                                    "cpu": 8, "memory": "64GiB", "ssh_conn_id": "gpu_node_n",
                                    "labels": {"team": "nlp"}})], actor="t")
    store.set_node_state("node-a", "draining", actor="t")  # only node-nlp is up
    now = datetime.now(UTC)
    store.set_freeze("nlp", now + timedelta(hours=1), "launch", "alice", critical_only=True)
    cycle = PlacementCycle(store=store, policy=Policy(), planner=plan, actor="t",
                           clock=lambda: now + timedelta(minutes=1), idle_replan_s=0)
    cycle.admit(parse_request({"name": "cv-job", "team": "cv", "gpus": 1}), {})
    cycle.admit(parse_request({"name": "cv-urgent", "team": "cv", "gpus": 1,
                               "priority": "critical"}), {})
    report = cycle.run({"cv-job", "cv-urgent"})
    assert report.placed == ("cv-urgent",)  # another team's critical work may use it
    assert [a.node for a in store.allocations_of("cv-urgent")] == ["node-nlp"]
    assert [p.request_name for p in report.pending] == ["cv-job"]
    assert store.active_allocations()[0].request_name == "cv-urgent"
