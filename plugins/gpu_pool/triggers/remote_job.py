"""GpuRemoteJobTrigger: watch a GPU task's remote job(s) from the triggerer.

The deferrable half of :class:`~gpu_pool.operators.GpuSSHOperator`: the operator starts
the job on each node of its allocation and defers; this trigger polls the nodes over
``SSHHookAsync`` (one connection per node, reused, rebuilt with backoff when it drops, the
nodes of a gang polled at once), streams new output lines into the task log, and fires once:

* ``{"status": "warning", ...}`` when ``warn_at_s`` seconds have passed since the start and
  no warning was sent yet (the operator notifies, then defers again with ``warned=True``);
  a poll that finds the time limit already reached kills instead: stopping on time comes
  before the warning;
* ``{"status": "done", "outcome": ..., "results": ...}`` when every job has exited
  (``outcome`` ``preempted`` when the executor stopped the jobs for a more urgent request:
  the operator then requeues the task without spending a retry);
* ``{"status": "error", "message": ...}`` when the nodes cannot be reached.

Each poll waits on the node up to ``poll_interval`` seconds for the job to end (see
:func:`~gpu_pool.remote.job.build_poll_command`), so the end is seen within a tenth of a
second. Then, before firing, the trigger reads the metrics file and gives the GPUs back in
the store, billed to the moment the job ended on the node
(:func:`~gpu_pool.executor_support.release.release_ended_job`); the event carries that
time (``ended_at``), the metrics and whether the release happened (``released``).

Time limit: past ``time_limit_s`` the trigger kills every job's process group (SIGTERM,
grace, SIGKILL; reason ``time_limit``) and reports ``timed_out`` — on top of each node's own
watchdog (:func:`gpu_pool.remote.job.build_start_command`). In a gang, the first member to
fail gets the others killed (reason ``gang_failed``). :meth:`on_kill` (a user marked the
task failed or cleared it) kills the jobs; a triggerer restart does not.

Everything in ``serialize()`` is plain JSON, and ``GpuRemoteJobTrigger(**kwargs)`` of it
rebuilds an equal trigger.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncssh
from airflow.triggers.base import BaseTrigger, TriggerEvent

from gpu_pool.model import Outcome
from gpu_pool.remote.job import (
    DEFAULT_KILL_GRACE_S,
    METRICS_FILE,
    JobStatus,
    RemoteJob,
    RemoteJobError,
    build_kill_command,
    build_log_read_command,
    build_metrics_read_command,
    build_poll_command,
    parse_metrics,
    split_poll_output,
)
from gpu_pool.remote.runner import outcome_of

CLASSPATH = "gpu_pool.triggers.remote_job.GpuRemoteJobTrigger"
# Worst first: the outcome of a job made of several node jobs.
# A gang preempted whole is PREEMPTED; a member that failed on its own still fails the task.
_SEVERITY = (Outcome.TIMED_OUT, Outcome.FAILED, Outcome.CANCELLED, Outcome.PREEMPTED,
             Outcome.SUCCESS)
# A broken or refused connection, a wedged command, or an answer cut short: poll again.
_TRANSIENT = (OSError, asyncssh.Error, TimeoutError, RemoteJobError)


def combined_outcome(outcomes: list[Outcome]) -> Outcome:
    """A gang member killed because another failed does not hide that failure."""
    return min(outcomes, key=_SEVERITY.index)


class GpuRemoteJobTrigger(BaseTrigger):
    """Poll remote GPU jobs until they end (see the module docstring).

    :param jobs: one ``{"node", "ssh_conn_id", "job_id", "base_dir"}`` per node, rank order
    :param started_at: when the jobs started, UTC epoch seconds
    :param time_limit_s: kill the jobs this long after ``started_at`` (``None``: no limit)
    :param warn_at_s: fire a warning event this long after ``started_at``
    :param log_offsets: bytes of each job's log already streamed, by job id
    :param request: the gpu-pool request the jobs run for: its GPUs are given back in the
        store the moment the jobs end (``None``: the executor releases them later)
    """

    def __init__(self, *, jobs: list[dict[str, str]], started_at: float,
                 time_limit_s: float | None = None, warn_at_s: float | None = None,
                 warned: bool = False, kill_grace_s: float = DEFAULT_KILL_GRACE_S,
                 poll_interval: float = 5.0, log_offsets: dict[str, int] | None = None,
                 log_chunk_size: int = 65536, command_timeout: float = 30.0,
                 max_reconnect_attempts: int = 5, request: str | None = None) -> None:
        super().__init__()
        self.request = request
        self.jobs = [dict(j) for j in jobs]
        self.started_at = float(started_at)
        self.time_limit_s = time_limit_s
        self.warn_at_s = warn_at_s
        self.warned = warned
        self.kill_grace_s = kill_grace_s
        self.poll_interval = poll_interval
        self.log_offsets = dict(log_offsets or {j["job_id"]: 0 for j in self.jobs})
        self.log_chunk_size = log_chunk_size
        self.command_timeout = command_timeout
        self.max_reconnect_attempts = max_reconnect_attempts
        self._conns: dict[str, Any] = {}

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "jobs": [dict(j) for j in self.jobs],
            "started_at": self.started_at,
            "time_limit_s": self.time_limit_s,
            "warn_at_s": self.warn_at_s,
            "warned": self.warned,
            "kill_grace_s": self.kill_grace_s,
            "poll_interval": self.poll_interval,
            "log_offsets": dict(self.log_offsets),
            "log_chunk_size": self.log_chunk_size,
            "command_timeout": self.command_timeout,
            "max_reconnect_attempts": self.max_reconnect_attempts,
            "request": self.request,
        }

    # -- SSH ---------------------------------------------------------------------------------

    async def _conn(self, ssh_conn_id: str) -> Any:
        conn = self._conns.get(ssh_conn_id)
        if conn is None:
            from airflow.providers.ssh.hooks.ssh import SSHHookAsync

            conn = await SSHHookAsync(ssh_conn_id=ssh_conn_id).get_conn()
            self._conns[ssh_conn_id] = conn
        return conn

    async def _run_bytes(self, ssh_conn_id: str, command: str,
                         timeout: float | None = None) -> bytes:
        conn = await self._conn(ssh_conn_id)
        try:
            result = await conn.run(command, check=False, encoding=None,
                                    timeout=timeout or self.command_timeout)
        except Exception:
            self._conns.pop(ssh_conn_id, None)
            conn.close()
            raise
        out = result.stdout or b""
        return out if isinstance(out, bytes) else out.encode()

    async def _run(self, ssh_conn_id: str, command: str, timeout: float | None = None) -> str:
        return (await self._run_bytes(ssh_conn_id, command, timeout)).decode("utf-8", "replace")

    async def _close_all(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    @staticmethod
    def _job(spec: dict[str, str]) -> RemoteJob:
        return RemoteJob.from_dict(spec)

    async def _poll(self, spec: dict[str, str], wait_s: float = 0.0) -> JobStatus:
        """One round trip: the job's status (once it ended or ``wait_s`` passed) and its new
        output, which goes to the log."""
        job_id = spec["job_id"]
        status, chunk = split_poll_output(await self._run_bytes(spec["ssh_conn_id"],
            build_poll_command(self._job(spec), self.log_offsets.get(job_id, 0),
                               self.log_chunk_size, wait_s),
            timeout=self.command_timeout + wait_s))
        while chunk:
            self.log_offsets[job_id] = self.log_offsets.get(job_id, 0) + len(chunk)
            for line in chunk.decode("utf-8", "replace").rstrip("\n").split("\n"):
                self.log.info("[%s] %s", spec["node"], line)
            if len(chunk) < self.log_chunk_size:
                break
            chunk = await self._run_bytes(spec["ssh_conn_id"], build_log_read_command(
                self._job(spec), self.log_offsets[job_id], self.log_chunk_size))
        return status

    async def kill_jobs(self, reason: str, *, detach: bool = False,
                        only: list[dict[str, str]] | None = None) -> None:
        """Kill the jobs' process groups (all of them, or ``only`` these)."""
        for spec in only or self.jobs:
            command = build_kill_command(self._job(spec), grace_s=self.kill_grace_s,
                                         reason=reason, detach=detach)
            answer = await self._run(spec["ssh_conn_id"], command,
                                     timeout=self.kill_grace_s + 30)
            self.log.warning("Killed job %s on %s (%s): %s", spec["job_id"], spec["node"],
                             reason, answer.strip())

    async def _metrics(self) -> dict[str, float]:
        """What the command wrote to ``$GPU_POOL_METRICS_FILE`` on the first node ({} if
        nothing, or nothing readable: a bad file is said in the log, never fails the task)."""
        spec = self.jobs[0]
        job = self._job(spec)
        try:
            text = await self._run(spec["ssh_conn_id"], build_metrics_read_command(job))
        except _TRANSIENT as error:
            self.log.warning("Could not read the metrics of job %s on %s: %s", spec["job_id"],
                             spec["node"], error)
            return {}
        metrics, problems = parse_metrics(text, f"{spec['node']}:{job.path(METRICS_FILE)}")
        for problem in problems:
            self.log.warning("Metrics left out: %s", problem)
        return metrics

    async def _release(self, outcome: Outcome, ended_at: float | None,
                       metrics: dict[str, float]) -> bool:
        """Give the request's GPUs back now, billed to ``ended_at``; False if not done here
        (no request named, already released, or the store unreachable: the executor's
        release when the task ends is the backstop).

        Never for a preempted job: the preemption already ended its allocations, and the
        request, pending again, may hold new ones by now — those are its next run's."""
        if self.request is None or outcome is Outcome.PREEMPTED:
            return False
        from gpu_pool.executor_support.release import release_ended_job, store_from_airflow

        def release() -> bool:
            store = store_from_airflow(create=False)  # a misconfigured triggerer makes none
            try:
                done = release_ended_job(store, self.request, outcome, ended_at,
                                         metrics) is not None
            finally:
                store.close()
            if done:
                from gpu_pool.telemetry import Metrics

                Metrics("scheduler").release(outcome)  # the triggerer's: Airflow core's stats
            return done

        try:
            released = await asyncio.to_thread(release)
        except Exception as error:  # the store, not the job: the executor releases later
            self.log.warning("Could not release the GPUs of %s at the job's end: %s",
                             self.request, error)
            return False
        if released:
            self.log.info("Released the GPUs of %s: the job ended (%s)", self.request,
                          outcome.value)
        return released

    # -- the loop ----------------------------------------------------------------------------

    def _event(self, status: str, **payload: Any) -> TriggerEvent:
        return TriggerEvent({"status": status, "jobs": self.jobs, "started_at": self.started_at,
                             "log_offsets": dict(self.log_offsets), "request": self.request,
                             **payload})

    async def _done(self, statuses: list[JobStatus]) -> TriggerEvent:
        outcome = combined_outcome([outcome_of(s) for s in statuses])
        ends = [s.ended_at for s in statuses if s.ended_at is not None]
        ended_at = max(ends) if ends and len(ends) == len(statuses) else None
        metrics = await self._metrics() if outcome is Outcome.SUCCESS else {}
        released = await self._release(outcome, ended_at, metrics)
        return self._event("done", outcome=outcome.value, ended_at=ended_at, metrics=metrics,
                           released=released, results={
                               spec["job_id"]: {"node": spec["node"], "state": s.state.value,
                                                "exit_code": s.exit_code,
                                                "killed": s.killed_reason}
                               for spec, s in zip(self.jobs, statuses, strict=True)})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        failures = 0
        limit_hit = False
        wait_s = 0.0  # the first poll answers at once; later ones wait on the node
        try:
            while True:
                try:
                    statuses = list(await asyncio.gather(
                        *(self._poll(spec, wait_s) for spec in self.jobs)))
                except _TRANSIENT as error:
                    failures += 1
                    await self._close_all()
                    if failures > self.max_reconnect_attempts:
                        yield self._event("error", message=f"lost the nodes after {failures} "
                                          f"attempts: {type(error).__name__}: {error}")
                        return
                    delay = min(2 ** (failures - 1), 30) * (1 + random.random())
                    self.log.warning("SSH poll failed (%d/%d), retrying in %.1fs: %s",
                                     failures, self.max_reconnect_attempts, delay, error)
                    await asyncio.sleep(delay)
                    continue
                failures = 0
                wait_s = self.poll_interval
                if all(s.done for s in statuses):
                    yield await self._done(statuses)
                    return
                # A member preempted is not a failure: the executor stops every member.
                if any(s.done and outcome_of(s) not in (Outcome.SUCCESS, Outcome.PREEMPTED)
                       for s in statuses):
                    running = [spec for spec, s in zip(self.jobs, statuses, strict=True)
                               if not s.done]
                    await self.kill_jobs("gang_failed", only=running)
                    await asyncio.sleep(min(self.poll_interval, 1.0))  # the monitors record exits
                    continue
                elapsed = time.time() - self.started_at
                if self.time_limit_s is not None and elapsed >= self.time_limit_s \
                        and not limit_hit:
                    limit_hit = True
                    await self.kill_jobs("time_limit")
                    await asyncio.sleep(min(self.poll_interval, 1.0))
                    continue
                if self.warn_at_s is not None and not self.warned and elapsed >= self.warn_at_s:
                    yield self._event("warning", elapsed_s=elapsed,
                                      time_limit_s=self.time_limit_s)
                    return
                # No sleep: the next poll waits on the node, at most until the next check
                # of the time limit or the warning is due.
                wait_s = self._next_wait(elapsed)
        finally:
            await self._close_all()

    def _next_wait(self, elapsed: float) -> float:
        """How long the next poll may wait on the node: ``poll_interval``, or less when the
        warning or the time limit falls due sooner."""
        due = [t - elapsed for t in (self.time_limit_s,
                                     None if self.warned else self.warn_at_s)
               if t is not None and t > elapsed]
        return max(0.1, min([self.poll_interval, *due]))

    async def on_kill(self) -> None:
        """A user killed the task: stop the jobs on the nodes (detached: bounded time)."""
        try:
            await self.kill_jobs("cancelled", detach=True)
        finally:
            await self._close_all()
