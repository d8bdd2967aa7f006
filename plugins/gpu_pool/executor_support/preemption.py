"""Step 5 of a heartbeat: act on preemptions — stop the preempted remote jobs with grace.

Terms
-----
stop
    A job row whose stop the store holds (:mod:`gpu_pool.store.jobs`): written by the
    transaction that applied the preemption, so it survives a scheduler killed right after.
detached kill
    :func:`gpu_pool.remote.job.build_kill_command` with ``detach=True``: the node runs
    SIGTERM → grace → SIGKILL in its own session and writes ``killed`` = ``preempted``; the
    SSH command returns at once.

Rules
-----
* The heartbeat never waits on SSH: each kill runs in a small thread pool
  (``[gpu_pool] preemption_kill_threads``, default 4) and is marked sent in the store when
  the node accepted it. A kill that failed (node unreachable) stays due and is retried at
  the next check (every ``watch_interval_seconds``, and at once after a cycle that
  preempted); one unanswered for :data:`STOP_HUNG_S` is sent again. A kill is sent at
  most once at a time per job by one executor; two
  executors sending the same one are harmless (the node keeps the first reason).
* The task itself is not touched: its watcher sees ``killed`` = ``preempted`` and the
  operator raises ``AirflowRescheduleException`` (no retry spent).
* A deferred task resumed after its jobs were preempted needs no GPU to conclude: it is
  bound (not live) to the allocations it lost, so its resume runs at once and reschedules
  it, instead of waiting for a placement first.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import TYPE_CHECKING, Any

from gpu_pool.executor_support.cycle import Binding
from gpu_pool.model import AllocationState, RequestState
from gpu_pool.remote.job import RemoteJob
from gpu_pool.store.jobs import STOP_PREEMPTED, JobRecord

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey

# A kill not answered in this long (an SSH library wedged in its thread) is sent again from
# a fresh thread: a stop is never left in flight forever. The kill itself is detached and
# bounded (30 s command timeout), so a healthy one answers in seconds.
STOP_HUNG_S = 120.0


def send_stop(store: Any, job: JobRecord) -> str:
    """Send one detached kill for ``job``; mark it sent. Returns the node's answer."""
    from gpu_pool.remote.runner import RemoteJobRunner

    with RemoteJobRunner(job.ssh_conn_id, command_timeout=30.0) as runner:
        answer = runner.kill(RemoteJob(job.job_id, job.base_dir),
                             reason=job.stop_reason or STOP_PREEMPTED,
                             grace_s=job.stop_grace_s or 0.1, detach=True)
    store.mark_stop_sent([job.job_id])
    return answer


class PreemptionMixin:
    """The executor's preemption step (mixed into :class:`gpu_pool.executor.GpuPoolExecutor`)."""

    def _send_stops(self: Any, *, now_due: bool = False) -> None:
        """Start a detached kill for each job whose stop is due (never waits on SSH)."""
        self._collect_stops()
        now = time.monotonic()
        if not now_due and now - self._last_stop_check < self.watch_interval_s:
            return
        self._last_stop_check = now
        store = self._require_cycle().store
        for job in store.stops_due():
            flight = self._stops_in_flight.get(job.job_id)
            if flight is not None:
                if now - flight[1] < STOP_HUNG_S:
                    continue
                self.log.warning("The stop of job %s has hung for %.0fs; sending it again",
                                 job.job_id, now - flight[1])
            if self._kill_pool is None:
                self._kill_pool = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.kill_threads, thread_name_prefix="gpu-pool-kill")
            self.log.warning("Stopping job %s of %s on %s: SIGTERM, %.0fs grace, SIGKILL (%s)",
                             job.job_id, job.request_name, job.node, job.stop_grace_s or 0,
                             job.stop_message or job.stop_reason)
            self._stops_in_flight[job.job_id] = (self._kill_pool.submit(send_stop, store, job),
                                                 now)

    def _collect_stops(self: Any) -> None:
        for job_id, (future, _) in list(self._stops_in_flight.items()):
            if not future.done():
                continue
            del self._stops_in_flight[job_id]
            error = future.exception()
            if error is not None:
                self.log.warning("Could not stop job %s (retried): %s", job_id, error)
            else:
                self.log.info("Stop of job %s sent: %s", job_id, future.result())

    def _wait_stops(self: Any, timeout: float) -> None:
        """Wait (bounded) for the kills in flight: for ``end`` and tests."""
        if self._stops_in_flight:
            concurrent.futures.wait([f for f, _ in self._stops_in_flight.values()],
                                    timeout=timeout)
        self._collect_stops()

    def _preempted_resumes(self: Any, held: dict[str, TaskInstanceKey],
                           bound: set[str]) -> list[Binding]:
        """Not-live bindings for deferred tasks resumed after a preemption (see the rules)."""
        store = self._require_cycle().store
        out = []
        for name, key in held.items():
            if key not in self._resuming or name in bound:
                continue
            if store.request_state(name) is not RequestState.PENDING or not any(
                    j.stop_reason == STOP_PREEMPTED for j in store.jobs_of(name)):
                self._resuming.discard(key)
                continue
            lost = [a for a in store.allocations_of(name)
                    if a.state is AllocationState.PREEMPTED]
            last = max((a.started_at for a in lost), default=None)  # a gang starts at once
            lost = [a for a in lost if a.started_at == last]
            if lost:
                out.append(Binding(name, tuple(sorted(lost, key=lambda a: a.node)), live=False))
        return out

    def _close_kill_pool(self: Any) -> None:
        if self._kill_pool is not None:
            self._kill_pool.shutdown(wait=False, cancel_futures=False)
            self._kill_pool = None
