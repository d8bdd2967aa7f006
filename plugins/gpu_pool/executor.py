"""GpuPoolExecutor: Airflow's executor for GPU tasks, a thin adapter over the placement cycle.

Configure it beside the default executor::

    [core]
    executor = LocalExecutor,GpuPool:gpu_pool.executor.GpuPoolExecutor

A task opts in with ``executor="GpuPool"`` and ``executor_config={"gpu_pool": <spec>}``
(what :func:`gpu_pool.spec.parse_request` accepts, without ``name``).

Each heartbeat (``trigger_tasks``), one step per module of :mod:`gpu_pool.executor_support`:

1. **admission** — admit newly queued GPU workloads as store requests (a bad spec fails the
   task at once; a request the store already has — a task rescheduled after a preemption —
   is adopted with its place in line);
2. **cycle** — run one placement cycle (:class:`~gpu_pool.executor_support.cycle.PlacementCycle`);
3. **starting** — start each held workload whose request now has active allocations — a
   subprocess ``python -m airflow.sdk.execution_time.execute_workload`` with
   ``CUDA_VISIBLE_DEVICES`` and the ``GPU_POOL_*`` variables
   (:mod:`gpu_pool.remote.allocation`), a fresh token, and ``gpu://node/0,1`` reported as
   the external executor id;
4. **preemption** — stop the remote jobs of preempted allocations with grace (detached
   SIGTERM → grace → SIGKILL on the node, sent from a small thread pool); the operator then
   reschedules its task without spending a retry.

``sync`` (**watching**) reaps finished processes and releases their allocations (ledger
rows), keeps the allocation of a task that deferred or was rescheduled, watches adopted or
deferred tasks through the metadata database until they end, stops tasks dispossessed
otherwise than by a preemption, and reconciles allocations nobody watches.

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

import concurrent.futures
import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf
from airflow.executors.base_executor import BaseExecutor

from gpu_pool.errors import GpuPoolError
from gpu_pool.executor_support import airflow_reads
from gpu_pool.executor_support.admission import SPEC_KEY, AdmissionMixin
from gpu_pool.executor_support.admission import link as _link
from gpu_pool.executor_support.cycle import PlacementCycle
from gpu_pool.executor_support.naming import request_name
from gpu_pool.executor_support.preemption import PreemptionMixin
from gpu_pool.executor_support.starting import Started as _Started
from gpu_pool.executor_support.starting import StartingMixin
from gpu_pool.executor_support.watching import ALIVE as _ALIVE
from gpu_pool.executor_support.watching import ENDED_BY_JOB as _ENDED_BY_JOB
from gpu_pool.executor_support.watching import Watched as _Watched
from gpu_pool.executor_support.watching import WatchingMixin
from gpu_pool.model import Outcome, Policy
from gpu_pool.telemetry import Metrics

if TYPE_CHECKING:
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskinstancekey import TaskInstanceKey
    from sqlalchemy.orm import Session

__all__ = ["SPEC_KEY", "GpuPoolExecutor", "_ALIVE", "_ENDED_BY_JOB", "_Started", "_Watched",
           "_link"]

SECTION = "gpu_pool"


def _policy_from(store: Any, actor: str) -> Policy:
    """The policy in force: ``[gpu_pool] policy_file`` recorded as a new version when it
    changed (a bad file raises, so the scheduler stops with its one-line reason), then the
    store's latest version."""
    from gpu_pool.policy_file import policy_in_force

    return policy_in_force(store, conf.get(SECTION, "policy_file", fallback=None) or None,
                           actor)


class GpuPoolExecutor(AdmissionMixin, StartingMixin, WatchingMixin, PreemptionMixin,
                      BaseExecutor):
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
        # A team with no members on record is open unless this is on.
        self.require_membership = conf.getboolean(SECTION, "require_team_membership",
                                                  fallback=False)
        self.reconcile_interval_s = conf.getfloat(SECTION, "reconcile_interval_seconds",
                                                  fallback=30.0)
        self.kill_threads = max(1, conf.getint(SECTION, "preemption_kill_threads", fallback=4))
        self.preempt_record_wait_s = conf.getfloat(SECTION, "preemption_record_wait_seconds",
                                                   fallback=60.0)
        self._last_reconcile = 0.0
        self._last_held_check = 0.0
        self._last_stop_check = 0.0
        self.cycle: PlacementCycle | None = None
        self._names: dict[TaskInstanceKey, str] = {}
        self._started: dict[TaskInstanceKey, _Started] = {}
        self._watched: dict[TaskInstanceKey, _Watched] = {}
        self._resuming: set[TaskInstanceKey] = set()  # deferred tasks queued to resume
        self._unrecorded: dict[str, float] = {}  # preempted, no job recorded yet: since
        # job id -> (the kill's future, when it was sent: monotonic seconds)
        self._stops_in_flight: dict[str, tuple[concurrent.futures.Future[str], float]] = {}
        self._kill_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._resumes_due = 0  # watched deferred tasks whose trigger fired: owed a slot
        self._last_watch = 0.0
        self.last_cycle_seconds = 0.0
        self.metrics = Metrics("scheduler")  # through Airflow's stats, as [metrics] configures

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
            telemetry=self.metrics,
        )

    def end(self) -> None:
        """Leave task processes running: a restarted scheduler adopts them. Kills in flight
        get a few seconds; one not sent stays due in the store for the next scheduler."""
        self.sync()
        self._wait_stops(timeout=10.0)
        self._close_kill_pool()
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
        self.metrics.cycle(report)
        if report.planned:
            # One line a heartbeat would drown the scheduler's log: info only for a change.
            self.log.log(
                logging.INFO if report.changed else logging.DEBUG,
                "gpu-pool cycle: placed %d, preempted %d, pending %d, dropped %d (%s, %.3fs)",
                len(report.placed), len(report.preempted), len(report.pending),
                len(report.dropped), report.detail, report.seconds,
            )
        resumes = []
        try:
            self._send_stops(now_due=bool(report.preempted))
            if self._resuming:
                bound = {b.request_name for b in [*report.bindings, *report.finished]}
                resumes = self._preempted_resumes(held, bound)
        except Exception:  # the store or a node: the stops stay due, retried next heartbeat
            self.log.exception("gpu-pool preemption step failed; retrying next heartbeat")
        for binding in [*report.bindings, *report.finished, *resumes][: max(0, open_slots)]:
            key = held.get(binding.request_name)
            if key is not None and key in self.queued_tasks:
                self._start(key, binding)

    # -- completion --------------------------------------------------------------------

    def sync(self) -> None:
        if self.cycle is None:
            return
        try:
            self._reap()
        except Exception:  # the scheduler loop must survive a store or database hiccup
            self.log.exception("gpu-pool sync failed; retrying next heartbeat")

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


def _cancel_pending(cycle: PlacementCycle, name: str) -> None:
    cancel = getattr(cycle.store, "cancel_request", None)
    if callable(cancel):
        with contextlib.suppress(GpuPoolError):
            cancel(name, actor=cycle.actor, reason="task reset by scheduler")
    cycle.forget(name)
