"""GpuPoolExecutor: Airflow's executor for GPU tasks, a thin adapter over the placement cycle.

Configure it beside the default executor::

    [core]
    executor = LocalExecutor,GpuPool:gpu_pool.executor.GpuPoolExecutor

A task opts in with ``executor="GpuPool"`` and ``executor_config={"gpu_pool": <spec>}``
(what :func:`gpu_pool.spec.parse_request` accepts, without ``name``).

Each heartbeat (``trigger_tasks``):

1. admit newly queued GPU workloads as store requests (a bad spec fails the task at once);
2. run one placement cycle (:class:`~gpu_pool.executor_support.cycle.PlacementCycle`);
3. start each held workload whose request now has active allocations — a subprocess
   ``python -m airflow.sdk.execution_time.execute_workload`` with ``CUDA_VISIBLE_DEVICES``
   and the ``GPU_POOL_*`` variables (:mod:`gpu_pool.remote.allocation`), a fresh token,
   and ``gpu://node/0,1`` reported as the external executor id.

``sync`` reaps finished processes and releases their allocations (ledger rows), keeps the
allocation of a task that deferred, and watches adopted or deferred tasks through the
metadata database until they end.

Design choices against Airflow's traps (see ``shared/design/airflow-3.3-notes.md``):

* **Stuck in queued.** A GPU task may legitimately wait hours for capacity in QUEUED.
  ``revoke_task`` raises ``NotImplementedError``, which makes the scheduler's stuck-in-queued
  check skip this executor, so waiting GPU tasks are never requeued or failed by it.
* **Shared parallelism.** ``slots_occupied`` counts only started tasks and
  ``slots_available`` admits at most ``[gpu_pool] max_held_tasks`` waiting workloads, so
  the rest of a GPU backlog stays SCHEDULED (ordered by ``priority_weight``) and ordinary
  tasks keep the shared ``[core] parallelism``.
* **Deferred tasks come back.** A deferred GPU task keeps its GPUs and must be queued again
  to resume once its trigger fires. If waiting workloads filled the held bound, that resume
  could never be queued while the waiting ones wait for exactly those GPUs: a deadlock. So
  every deferred task whose trigger has fired (its task instance is SCHEDULED again) adds
  one slot beyond the bound until it is back.
* **Restarts.** Task processes run in their own session and outlive the scheduler;
  ``try_adopt_task_instances`` adopts RUNNING GPU tasks whose allocation is active in the
  store, and waiting (QUEUED) ones are handed back to be reset with their request cancelled.
  Every ``[gpu_pool] reconcile_interval_seconds`` the executor releases allocations whose
  task instance ended unwatched (e.g. while no scheduler ran), so no allocation leaks.
* **Several schedulers.** The store is the truth: placement is applied under the store's
  lock and guard; each executor starts only what it holds, whoever placed it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.executors.base_executor import BaseExecutor

from gpu_pool.errors import ConflictError, GpuPoolError, StoreError
from gpu_pool.executor_support import airflow_reads
from gpu_pool.executor_support.cycle import Binding, PlacementCycle
from gpu_pool.executor_support.naming import request_name
from gpu_pool.model import Outcome, Policy
from gpu_pool.remote.allocation import RemoteAllocation

if TYPE_CHECKING:
    from airflow.executors import workloads
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancekey import TaskInstanceKey
    from sqlalchemy.orm import Session

SPEC_KEY = "gpu_pool"
SECTION = "gpu_pool"
_ALIVE = frozenset({"queued", "running", "restarting", "deferred", "scheduled",
                    "up_for_reschedule"})


@dataclass
class _Started:
    """A task process this executor started."""

    key: TaskInstanceKey
    ti_id: str
    name: str
    process: subprocess.Popen[bytes]
    started: float
    live: bool = True  # False: resumed after its job ended and its GPUs went back


@dataclass
class _Watched:
    """A GPU task alive elsewhere (adopted, or deferred to the triggerer)."""

    key: TaskInstanceKey
    ti_id: str
    name: str
    in_running: bool  # adopted: its key is in ``running`` and needs a final event


# A task whose allocation ended with one of these outcomes ended by its own job: the
# trigger (or the in-task watcher) gave its GPUs back; its process is concluding, not
# dispossessed.
_ENDED_BY_JOB = frozenset({Outcome.SUCCESS, Outcome.FAILED, Outcome.TIMED_OUT})


def _policy_from(store: Any, actor: str) -> Policy:
    """The policy in force: ``[gpu_pool] policy_file`` recorded as a new version when it
    changed (a bad file raises, so the scheduler stops with its one-line reason), then the
    store's latest version."""
    from gpu_pool.policy_file import policy_in_force

    return policy_in_force(store, conf.get(SECTION, "policy_file", fallback=None) or None,
                           actor)


class GpuPoolExecutor(BaseExecutor):
    """Places GPU tasks on the fleet with the gpu-pool engine and runs them locally."""

    is_local = True
    serve_logs = True
    supports_callbacks = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.max_held = conf.getint(SECTION, "max_held_tasks", fallback=64)
        self.idle_replan_s = conf.getfloat(SECTION, "idle_replan_seconds", fallback=5.0)
        self.watch_interval_s = conf.getfloat(SECTION, "watch_interval_seconds", fallback=2.0)
        # Admission writes to the store; bounding it per beat bounds a burst's added latency.
        self.max_admit = conf.getint(SECTION, "max_admit_per_heartbeat", fallback=16)
        self.reconcile_interval_s = conf.getfloat(SECTION, "reconcile_interval_seconds",
                                                  fallback=30.0)
        self._last_reconcile = 0.0
        self._last_held_check = 0.0
        self.cycle: PlacementCycle | None = None
        self._names: dict[TaskInstanceKey, str] = {}
        self._started: dict[TaskInstanceKey, _Started] = {}
        self._watched: dict[TaskInstanceKey, _Watched] = {}
        self._resumes_due = 0  # watched deferred tasks whose trigger fired: owed a slot
        self._last_watch = 0.0
        self.last_cycle_seconds = 0.0

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.cycle = self._build_cycle()
        self.log.info("GpuPoolExecutor started (max_held_tasks=%s)", self.max_held)

    def _build_cycle(self) -> PlacementCycle:
        from gpu_pool.engine import plan
        from gpu_pool.executor_support.release import store_from_airflow

        store = store_from_airflow()
        store.migrate()
        actor = f"executor@{socket.gethostname()}:{os.getpid()}"
        return PlacementCycle(
            store=store,
            policy=_policy_from(store, actor),
            planner=plan,
            actor=actor,
            data_ready=airflow_reads.assets_with_events,
            idle_replan_s=self.idle_replan_s,
        )

    def end(self) -> None:
        """Leave task processes running: a restarted scheduler adopts them."""
        self.sync()
        if self._started:
            self.log.info("Leaving %d GPU task(s) running for adoption", len(self._started))

    def terminate(self) -> None:
        self.end()

    # -- capacity ----------------------------------------------------------------------

    @property
    def slots_occupied(self) -> int:
        return len(self.running)

    @property
    def slots_available(self) -> int:
        waiting_room = max(0, self.max_held - len(self.queued_tasks))
        return max(0, min(self.parallelism - len(self.running), waiting_room + self._resumes_due))

    # -- heartbeat ---------------------------------------------------------------------

    def trigger_tasks(self, open_slots: int) -> None:
        cycle = self._require_cycle()
        held = {}
        try:
            self._admit_new()
            held = {self._names[k]: k for k in self.queued_tasks if k in self._names}
            report = cycle.run(held)
        except Exception:  # never stall or kill the scheduler loop: retry next heartbeat
            self.log.exception("gpu-pool placement cycle failed; retrying next heartbeat")
            return
        self.last_cycle_seconds = report.seconds
        if report.planned:
            # One line a heartbeat would drown the scheduler's log: info only for a change.
            self.log.log(
                logging.INFO if report.changed else logging.DEBUG,
                "gpu-pool cycle: placed %d, preempted %d, pending %d, dropped %d (%s, %.3fs)",
                len(report.placed), len(report.preempted), len(report.pending),
                len(report.dropped), report.detail, report.seconds,
            )
        for binding in [*report.bindings, *report.finished][: max(0, open_slots)]:
            key = held.get(binding.request_name)
            if key is not None and key in self.queued_tasks:
                self._start(key, binding)

    def _admit_new(self) -> None:
        from gpu_pool.spec import parse_request

        cycle = self._require_cycle()
        admitted = 0
        for key, workload in self.order_queued_tasks_by_priority():
            if key in self._names:
                continue
            if admitted >= self.max_admit:
                break
            admitted += 1
            name = request_name(key)
            spec = dict((workload.ti.executor_config or {}).get(SPEC_KEY) or {})
            spec.pop("name", None)
            try:
                request = parse_request(
                    {**spec, "name": name, "submitted_at": datetime.now(UTC)},
                    policy=cycle.policy,
                )
                if request.dataset is not None:
                    request = dataclasses.replace(request, data_ready=cycle.is_ready(request))
                cycle.admit(request, _link(workload))
            except (StoreError, ConflictError):
                raise  # the store, not the request: retried next heartbeat
            except GpuPoolError as error:
                self.log.error("GPU task %s refused: %s", key, error)
                self.queued_tasks.pop(key, None)
                self.fail(key, info=f"gpu-pool: {error}")
                continue
            self._names[key] = name

    def _start(self, key: TaskInstanceKey, binding: Binding) -> None:
        from airflow.executors.workloads import ExecuteTask

        cycle = self._require_cycle()
        conn_ids = {n.name: n.ssh_conn_id for n in cycle.store.list_nodes() if n.ssh_conn_id}
        try:
            allocation = RemoteAllocation.from_model(binding.request_name, binding.allocations,
                                                     conn_ids)
        except GpuPoolError as error:
            self.log.error("GPU task %s cannot start: %s", key, error)
            self.queued_tasks.pop(key, None)
            self.fail(key, info=f"gpu-pool: {error}")
            self._release(key, binding.request_name, "failed")
            return
        workload: workloads.ExecuteTask = self.queued_tasks.pop(key)
        self._watched.pop(key, None)
        token = self.jwt_generator.generate(
            extras={"sub": str(workload.ti.id), "scope": "workload"},
            valid_for=max(conf.getfloat("scheduler", "task_queued_timeout"), 600.0),
        ) if isinstance(workload, ExecuteTask) else ""
        fresh = workload.model_copy(update={"token": token})
        env = {**os.environ, **allocation.to_env()}
        log_dir = Path(conf.get("logging", "base_log_folder")) / "gpu_pool_executor"
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / f"{workload.ti.id}.log", "ab") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "airflow.sdk.execution_time.execute_workload",
                 "--json-string", fresh.model_dump_json()],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, close_fds=True,
            )
        self.running.add(key)
        self._started[key] = _Started(key, str(workload.ti.id), binding.request_name, process,
                                      time.monotonic(), binding.live)
        self.running_state(key, allocation.external_id)
        self.log.info("Started %s on %s (pid %s)", key, allocation.external_id, process.pid)

    # -- completion --------------------------------------------------------------------

    def sync(self) -> None:
        if self.cycle is None:
            return
        try:
            self._reap()
        except Exception:  # the scheduler loop must survive a store or database hiccup
            self.log.exception("gpu-pool sync failed; retrying next heartbeat")

    def _reap(self) -> None:
        finished = [s for s in self._started.values() if s.process.poll() is not None]
        if finished:
            states = airflow_reads.task_states(s.ti_id for s in finished)
            for started in finished:
                self._on_exit(started, states.get(started.ti_id))
        now = time.monotonic()
        if not self._watched:
            self._resumes_due = 0
        elif now - self._last_watch >= self.watch_interval_s:
            self._last_watch = now
            states = airflow_reads.task_states(w.ti_id for w in self._watched.values())
            for watched in list(self._watched.values()):
                self._on_watch(watched, states.get(watched.ti_id))
            self._resumes_due = sum(1 for w in self._watched.values()
                                    if states.get(w.ti_id) == "scheduled")
        if self._started and now - self._last_held_check >= self.watch_interval_s:
            self._last_held_check = now
            self._stop_dispossessed()
        if now - self._last_reconcile >= self.reconcile_interval_s:
            self._last_reconcile = now
            self._reconcile()

    def _stop_dispossessed(self) -> None:
        """Stop running tasks whose allocation ended elsewhere (preempted, reclaimed, released).

        Their GPUs now belong to someone else: SIGTERM reaches the task process group, whose
        operator kills the remote job in turn. Not so for a task whose own job ended (its
        watcher gave the GPUs back at once): it is concluding.
        """
        cycle = self._require_cycle()
        names = {s.name for s in self._started.values() if s.live}
        active = {b.request_name for b in cycle.bindings(names)}
        gone = [s for s in self._started.values()
                if s.live and s.name not in active and s.process.poll() is None]
        if not gone:
            return
        ended = cycle.store.finished_outcomes({s.name for s in gone})
        for started in gone:
            if ended.get(started.name) in _ENDED_BY_JOB:
                continue
            self.log.warning("Allocation of %s ended elsewhere; stopping the task", started.key)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started.process.pid, signal.SIGTERM)

    def _reconcile(self) -> None:
        """Release allocations whose task instance ended while no executor watched it.

        A task that finishes while its scheduler is down is not adoptable (it is no longer
        RUNNING), so nobody would release its GPUs; the metadata database says it ended.
        """
        cycle = self._require_cycle()
        mine = {s.name for s in self._started.values()} | {w.name for w in self._watched.values()}
        ti_of: dict[str, str] = {}
        links: dict[str, dict[str, Any]] = {}
        for allocation in cycle.store.active_allocations():
            name = allocation.request_name
            if name in mine or name in ti_of:
                continue
            external = cycle.store.request_external(name) or {}
            if external.get("executor_key"):
                ti_of[name] = str(external["executor_key"])
                links[name] = external
        states = airflow_reads.task_states(ti_of.values())
        for name, ti_id in ti_of.items():
            state = states.get(ti_id)
            if state not in _ALIVE:
                self.log.info("Releasing %s: its task instance is %s", name, state)
                link = links[name]
                metrics = self._pushed_metrics(str(link.get("dag_id")), str(link.get("task_id")),
                                               str(link.get("run_id")),
                                               int(link.get("map_index", -1)))
                cycle.release(name, Outcome.SUCCESS if state == "success" else Outcome.FAILED,
                              reason=f"task {state} while unwatched", metrics=metrics)

    def _on_exit(self, started: _Started, state: str | None) -> None:
        """The task process ended. Release only if its task instance ended too.

        A live state here means the task deferred (the triggerer watches the remote job), was
        already resumed — possibly queued or started by another scheduler — or its process
        died; in every case the allocation is kept and the task instance watched until it
        ends (a dead one is failed by the scheduler's heartbeat check). As LocalExecutor does,
        the exit is reported as success: reporting failure for a QUEUED task instance would
        make the scheduler fail a resumed task.
        """
        del self._started[started.key]
        self.success(started.key)
        if state in _ALIVE:
            self._watched[started.key] = _Watched(started.key, started.ti_id, started.name, False)
            return
        self._release(started.key, started.name, state)

    def _on_watch(self, watched: _Watched, state: str | None) -> None:
        if state in _ALIVE:
            if state == "queued" and watched.key in self.queued_tasks:
                del self._watched[watched.key]  # resumed after deferral: started again here
            return
        del self._watched[watched.key]
        if watched.in_running:
            if state == "success":
                self.success(watched.key)
            else:
                self.fail(watched.key)
        self._release(watched.key, watched.name, state)

    def _release(self, key: TaskInstanceKey, name: str, state: str | None) -> None:
        outcome = Outcome.SUCCESS if state == "success" else Outcome.FAILED
        self._names.pop(key, None)
        try:
            metrics = self._pushed_metrics(key.dag_id, key.task_id, key.run_id, key.map_index)
            self._require_cycle().release(name, outcome, reason=f"task {state or 'gone'}",
                                          metrics=metrics)
        except GpuPoolError as error:
            self.log.warning("Release of %s failed: %s", name, error)

    def _pushed_metrics(self, dag_id: str, task_id: str, run_id: str,
                        map_index: int) -> dict[str, float]:
        """The ``gpu_pool_metrics`` XCom of a task instance, for its ledger row ({} if none)."""
        try:
            return airflow_reads.pushed_metrics(dag_id, task_id, run_id, map_index)
        except Exception as error:  # the GPUs go back regardless
            self.log.warning("Could not read the metrics of %s.%s: %s", dag_id, task_id, error)
            return {}

    # -- scheduler hooks ---------------------------------------------------------------

    def revoke_task(self, *, ti: TaskInstance) -> None:
        """Refused on purpose: a GPU task waiting in QUEUED for capacity is not stuck.

        Raising ``NotImplementedError`` makes the scheduler's stuck-in-queued check skip
        this executor, so a waiting GPU task is never requeued or failed by it.
        """
        raise NotImplementedError("GPU tasks wait in QUEUED for capacity by design")

    def try_adopt_task_instances(self, tis: Sequence[TaskInstance]) -> Sequence[TaskInstance]:
        cycle = self._require_cycle()
        names = {ti.key: request_name(ti.key) for ti in tis}
        active = {b.request_name for b in cycle.bindings(set(names.values()))}
        not_adopted: list[TaskInstance] = []
        for ti in tis:
            name = names[ti.key]
            if ti.state == "running" and name in active:
                self.running.add(ti.key)
                self._names[ti.key] = name
                self._watched[ti.key] = _Watched(ti.key, str(ti.id), name, True)
                self.log.info("Adopted GPU task %s (%s)", ti.key, ti.external_executor_id)
                continue
            not_adopted.append(ti)
            if name in active:
                cycle.release(name, Outcome.CANCELLED, reason="not adoptable: reset by scheduler")
            else:
                _cancel_pending(cycle, name)
        return not_adopted

    def queue_workload(self, workload: Any, session: Session) -> None:
        super().queue_workload(workload, session)
        self._require_cycle().mark_dirty()

    def _require_cycle(self) -> PlacementCycle:
        if self.cycle is None:
            self.cycle = self._build_cycle()
        return self.cycle


def _link(workload: Any) -> dict[str, Any]:
    ti = workload.ti
    return {
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "run_id": ti.run_id,
        "map_index": ti.map_index,
        "try_number": ti.try_number,
        "executor_key": str(ti.id),
    }


def _cancel_pending(cycle: PlacementCycle, name: str) -> None:
    cancel = getattr(cycle.store, "cancel_request", None)
    if callable(cancel):
        with contextlib.suppress(GpuPoolError):
            cancel(name, actor=cycle.actor, reason="task reset by scheduler")
    cycle.forget(name)
