"""Step 4 (``sync``): reap finished task processes, watch deferred and adopted tasks, stop
dispossessed ones, and reconcile allocations nobody watches.

Terms
-----
watched task
    A GPU task alive elsewhere: deferred to the triggerer, rescheduled after a preemption,
    or adopted from a previous scheduler (:class:`Watched`). Its allocation is kept until
    its task instance ends.
dispossessed task
    A started task whose allocation ended while its process runs.

Rules
-----
* A task whose own job ended (the trigger gave its GPUs back: SUCCESS, FAILED, TIMED_OUT)
  is concluding: it is left alone.
* A task that was *preempted* (its request is PENDING again) is left alone too: the
  executor stops its remote jobs with grace (:mod:`~gpu_pool.executor_support.preemption`)
  and the operator reschedules the task without spending a retry. Only when it has no job
  recorded in the store after ``preempt_record_wait_s`` (the store was unreachable from the
  task) is its process SIGTERMed, as before preemption had grace.
* Any other end (reclaimed, released, cancelled elsewhere) SIGTERMs the task's process
  group; its operator kills the remote job.
* Reconcile: an allocation whose task instance ended while no executor watched it is
  released (``[gpu_pool] reconcile_interval_seconds``), so no GPU is held by nobody.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_pool.errors import GpuPoolError
from gpu_pool.executor_support import airflow_reads
from gpu_pool.model import Outcome, RequestState
from gpu_pool.store.jobs import STOP_PREEMPTED

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey

    from gpu_pool.executor_support.starting import Started

ALIVE = frozenset({"queued", "running", "restarting", "deferred", "scheduled",
                   "up_for_reschedule"})
# A task whose allocation ended with one of these outcomes ended by its own job: the
# trigger (or the in-task watcher) gave its GPUs back; its process is concluding, not
# dispossessed.
ENDED_BY_JOB = frozenset({Outcome.SUCCESS, Outcome.FAILED, Outcome.TIMED_OUT})


@dataclass
class Watched:
    """A GPU task alive elsewhere (adopted, deferred to the triggerer, or rescheduled)."""

    key: TaskInstanceKey
    ti_id: str
    name: str
    in_running: bool  # adopted: its key is in ``running`` and needs a final event
    deferred: bool = False  # last seen deferred: its next queueing is a resume


class WatchingMixin:
    """The executor's sync step (mixed into :class:`gpu_pool.executor.GpuPoolExecutor`)."""

    def _reap(self: Any) -> None:
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

    def _stop_dispossessed(self: Any) -> None:
        """Stop running tasks whose allocation ended elsewhere (reclaimed, released).

        Their GPUs now belong to someone else: SIGTERM reaches the task process group, whose
        operator kills the remote job in turn. Not so for a task whose own job ended (its
        watcher gave the GPUs back at once): it is concluding; nor for a preempted one (see
        the module docstring).
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
            if ended.get(started.name) in ENDED_BY_JOB:
                continue
            if self._stopped_remotely(started):
                continue
            self.log.warning("Allocation of %s ended elsewhere; stopping the task", started.key)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started.process.pid, signal.SIGTERM)

    def _stopped_remotely(self: Any, started: Started) -> bool:
        """Whether a preemption stops this task through its remote jobs (no SIGTERM here)."""
        store = self._require_cycle().store
        if store.request_state(started.name) is not RequestState.PENDING:
            self._unrecorded.pop(started.name, None)
            return False
        if any(j.stop_reason == STOP_PREEMPTED for j in store.jobs_of(started.name)):
            self._unrecorded.pop(started.name, None)
            return True
        first = self._unrecorded.setdefault(started.name, time.monotonic())
        if time.monotonic() - first < self.preempt_record_wait_s:
            return True  # its operator may be starting and recording its jobs right now
        self.log.warning("Preempted task %s recorded no remote job in %.0fs; stopping its "
                         "process (it spends a retry)", started.key, self.preempt_record_wait_s)
        self._unrecorded.pop(started.name, None)
        return False

    def _reconcile(self: Any) -> None:
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
            if state not in ALIVE:
                self.log.info("Releasing %s: its task instance is %s", name, state)
                link = links[name]
                metrics = self._pushed_metrics(str(link.get("dag_id")), str(link.get("task_id")),
                                               str(link.get("run_id")),
                                               int(link.get("map_index", -1)))
                cycle.release(name, Outcome.SUCCESS if state == "success" else Outcome.FAILED,
                              reason=f"task {state} while unwatched", metrics=metrics)

    def _on_exit(self: Any, started: Started, state: str | None) -> None:
        """The task process ended. Release only if its task instance ended too.

        A live state here means the task deferred (the triggerer watches the remote job), was
        rescheduled after a preemption, was already resumed — possibly queued or started by
        another scheduler — or its process died; in every case the allocation is kept and the
        task instance watched until it ends (a dead one is failed by the scheduler's
        heartbeat check). As LocalExecutor does, the exit is reported as success: reporting
        failure for a QUEUED task instance would make the scheduler fail a resumed task.
        """
        del self._started[started.key]
        self.success(started.key)
        if state in ALIVE:
            self._watched[started.key] = Watched(started.key, started.ti_id, started.name,
                                                 False, deferred=state == "deferred")
            return
        self._release(started.key, started.name, state)

    def _on_watch(self: Any, watched: Watched, state: str | None) -> None:
        if state in ALIVE:
            if state == "deferred":
                watched.deferred = True
            elif state == "up_for_reschedule":
                watched.deferred = False
            if state == "queued" and watched.key in self.queued_tasks:
                del self._watched[watched.key]  # resumed after deferral: started again here
                if watched.deferred:
                    self._resuming.add(watched.key)
            return
        del self._watched[watched.key]
        if watched.in_running:
            if state == "success":
                self.success(watched.key)
            else:
                self.fail(watched.key)
        self._release(watched.key, watched.name, state)

    def _release(self: Any, key: TaskInstanceKey, name: str, state: str | None) -> None:
        outcome = Outcome.SUCCESS if state == "success" else Outcome.FAILED
        self._names.pop(key, None)
        try:
            metrics = self._pushed_metrics(key.dag_id, key.task_id, key.run_id, key.map_index)
            self._require_cycle().release(name, outcome, reason=f"task {state or 'gone'}",
                                          metrics=metrics)
        except GpuPoolError as error:
            self.log.warning("Release of %s failed: %s", name, error)

    def _pushed_metrics(self: Any, dag_id: str, task_id: str, run_id: str,
                        map_index: int) -> dict[str, float]:
        """The ``gpu_pool_metrics`` XCom of a task instance, for its ledger row ({} if none)."""
        try:
            return airflow_reads.pushed_metrics(dag_id, task_id, run_id, map_index)
        except Exception as error:  # the GPUs go back regardless
            self.log.warning("Could not read the metrics of %s.%s: %s", dag_id, task_id, error)
            return {}
