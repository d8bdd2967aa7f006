"""GpuSSHOperator: run a shell command on the GPUs gpu-pool allocates, over SSH.

At DAG parse time the operator validates its GPU request (``gpus``, ``gpu_models``,
``team``...; see :mod:`gpu_pool.operators.request_spec`) and routes itself to the
``GpuPool`` executor with ``executor_config={"gpu_pool": <spec>}``. A bad spec is an
import error naming the task and the field.

At run time the executor has placed the request and started the task process with the
allocation in its environment (:mod:`gpu_pool.remote.allocation`). The operator then

0. on each node, if the GPUs were won by preempting other work, waits until those jobs
   have stopped (they keep the GPUs through their grace to checkpoint; the store names
   them): at most their grace plus :data:`STOP_MARGIN_S`, then starts anyway, warning;
1. starts the command on each node of the allocation, detached in its own process group,
   with ``CUDA_VISIBLE_DEVICES`` and ``GPU_POOL_*`` exported inside the remote command
   (:mod:`gpu_pool.remote.job`), and records the jobs in XCom (``gpu_pool_jobs``);
2. defers to :class:`~gpu_pool.triggers.remote_job.GpuRemoteJobTrigger`, which polls from
   the triggerer (no worker slot is pinned for a long training), streams the output into
   the task log and kills the jobs at the time limit;
3. at ``warn_at`` × ``time_limit`` (default 80 %) logs a warning, calls each
   ``on_time_limit_warning``
   callback — an Airflow notifier (``SmtpNotifier(...)``, ``SlackWebhookNotifier(...)``) or
   any ``callable(context)``; ``context["gpu_pool_warning"]`` holds the elapsed time and the
   limit — and defers again;
4. succeeds iff every remote exit status is 0; a timeout, a kill or a lost node fails it.
   A job stopped by a preemption (the executor SIGTERMs its process group, waits the grace
   period, then SIGKILLs it; ``killed`` = ``preempted``) does not fail the task: the operator
   logs who reclaimed the GPUs and raises ``AirflowRescheduleException``, so the task
   instance goes UP_FOR_RESCHEDULE and comes back queued with its ``try_number`` unchanged
   (no retry spent), in its old place in the gpu-pool queue.
   What the command wrote to ``$GPU_POOL_METRICS_FILE`` (a JSON object of numbers, on the
   first node) is pushed as the XCom ``gpu_pool_metrics`` and goes into the allocation's
   ledger row. The trigger gives the GPUs back the moment the jobs end, billed to their
   end on the node; the executor's release when the task ends is the backstop.

``on_kill`` (mark failed, clear, worker kill) kills the remote process groups.
``deferrable=False`` runs the same trigger loop inside the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from airflow.sdk import BaseOperator

from gpu_pool.errors import SpecError
from gpu_pool.operators.request_spec import SPEC_KEY, request_spec
from gpu_pool.remote.allocation import RemoteAllocation
from gpu_pool.remote.job import (
    DEFAULT_BASE_DIR,
    DEFAULT_KILL_GRACE_S,
    RemoteJob,
    check_env_name,
    checkpoint_dir,
    job_environment,
    make_job_id,
)
from gpu_pool.remote.runner import RemoteJobRunner
from gpu_pool.spec import parse_duration, parse_number
from gpu_pool.triggers.remote_job import GpuRemoteJobTrigger

EXECUTOR_ALIAS = "GpuPool"
# How long past a preempted job's grace a placement that won its GPUs waits for it to be
# gone: the executor sends the kill at its next heartbeat (retried while the node does not
# answer), and SIGKILL follows the grace.
STOP_MARGIN_S = 60.0
XCOM_JOBS = "gpu_pool_jobs"
XCOM_METRICS = "gpu_pool_metrics"


class GpuRemoteJobFailed(Exception):
    """The remote command failed, timed out, was killed or its node was lost."""


def _seconds(value: Any, field: str) -> float | None:
    return None if value is None else parse_duration(value, field).total_seconds()


class GpuSSHOperator(BaseOperator):
    """Run ``command`` on the node and GPUs gpu-pool allocates (see the module docstring).

    :param command: the shell command to run on the node (templated)
    :param team: the team whose quota pays; the other request fields are those of
        :func:`gpu_pool.spec.parse_request`: ``gpus``, ``gpu_share``, ``nodes``,
        ``gpus_per_node``, ``gpu_models``, ``min_gpu_memory``, ``cpu``, ``memory``,
        ``purpose``, ``priority``, ``dataset`` (an ``Asset`` or URI), ``dataset_zone``,
        ``dataset_size_gib``, ``data_ready``, ``time_limit``, ``estimated_runtime``,
        ``preemptible``
    :param environment: extra variables exported to the command (templated; values literal)
    :param warn_at: share of ``time_limit`` after which the warning callbacks run
    :param on_time_limit_warning: notifiers or callables taking the task context
    :param kill_grace: seconds between SIGTERM and SIGKILL when the job is stopped
    :param preemption_grace: seconds (or a duration such as ``"2m"``, at most 1 h) between
        SIGTERM and SIGKILL when the job is preempted: time to write a checkpoint into
        ``$GPU_POOL_CHECKPOINT_DIR``. Default: the policy's ``preemption_grace``.
    :param poll_interval: seconds between polls of the node
    :param remote_base_dir: where job directories live on the nodes
    """

    template_fields: Sequence[str] = ("command", "environment")
    template_fields_renderers = {"command": "bash", "environment": "json"}
    ui_color = "#d9f2d0"

    def __init__(self, *, command: str, team: str | None = None,
                 environment: dict[str, str] | None = None, warn_at: float = 0.8,
                 on_time_limit_warning: Callable[[Any], Any]
                 | Sequence[Callable[[Any], Any]] | None = None,
                 kill_grace: float | timedelta = DEFAULT_KILL_GRACE_S,
                 poll_interval: float = 5.0, remote_base_dir: str = DEFAULT_BASE_DIR,
                 deferrable: bool = True, gpus: int | None = None,
                 gpu_share: int | None = None, nodes: int | None = None,
                 gpus_per_node: int | None = None, gpu_models: Any = None,
                 min_gpu_memory: Any = None, cpu: Any = None, memory: Any = None,
                 purpose: str | None = None, priority: str | None = None, dataset: Any = None,
                 dataset_zone: str | None = None, dataset_size_gib: float | None = None,
                 data_ready: bool | None = None, time_limit: Any = None,
                 estimated_runtime: Any = None, preemptible: bool | None = None,
                 preemption_grace: float | timedelta | str | None = None,
                 template: str | None = None, **kwargs: Any) -> None:
        executor = kwargs.pop("executor", EXECUTOR_ALIAS)
        executor_config = dict(kwargs.pop("executor_config", None) or {})
        if dataset is not None and hasattr(dataset, "uri"):
            kwargs["inlets"] = [*(kwargs.get("inlets") or []), dataset]
        super().__init__(executor=executor, **kwargs)
        where = f"task {self.task_id!r}"
        if executor != EXECUTOR_ALIAS:
            raise SpecError("executor", executor, f"{EXECUTOR_ALIAS!r} (GPU tasks run on the "
                            "GpuPool executor)", where=where)
        self.spec = request_spec(self.task_id, {
            "team": team, "gpus": gpus, "gpu_share": gpu_share, "nodes": nodes,
            "gpus_per_node": gpus_per_node, "gpu_models": gpu_models,
            "min_gpu_memory": min_gpu_memory, "cpu": cpu, "memory": memory,
            "purpose": purpose, "priority": priority, "dataset": dataset,
            "dataset_zone": dataset_zone, "dataset_size_gib": dataset_size_gib,
            "data_ready": data_ready, "time_limit": time_limit,
            "estimated_runtime": estimated_runtime, "preemptible": preemptible,
            "grace": preemption_grace}, template=template)
        self.preemption_grace_s = self.spec.get("grace")  # seconds, validated above
        self.executor_config = {**executor_config, SPEC_KEY: self.spec}
        if not 0 < warn_at <= 1:
            raise SpecError("warn_at", warn_at, "a share of the time limit in (0, 1]",
                            where=where)
        for name in environment or {}:
            try:
                check_env_name(name)
            except SpecError as error:
                raise error.located(where) from None
        self.command = command
        self.environment = environment
        self.time_limit_s = _seconds(self.spec.get("time_limit"), "time_limit")
        self.warn_at = warn_at
        callbacks = on_time_limit_warning
        self.on_time_limit_warning = (
            [] if callbacks is None else list(callbacks) if isinstance(callbacks, Sequence)
            else [callbacks])
        try:
            self.kill_grace_s = _seconds(kill_grace, "kill_grace") or DEFAULT_KILL_GRACE_S
        except SpecError as error:
            raise error.located(where) from None
        try:
            self.poll_interval = parse_number(poll_interval, "poll_interval", minimum=0.05,
                                              maximum=3600)
        except SpecError as error:
            raise error.located(where) from None
        self.remote_base_dir = remote_base_dir
        try:
            RemoteJob("parse-check", remote_base_dir)  # the directory, checked at parse time
        except SpecError as error:
            raise error.located(where) from None
        self.deferrable = deferrable
        self._jobs: list[dict[str, str]] = []
        self._request: str | None = None

    # -- starting --------------------------------------------------------------------------

    def _allocation(self) -> RemoteAllocation:
        allocation = RemoteAllocation.from_env(os.environ)
        if allocation is None:
            raise GpuRemoteJobFailed(
                f"task {self.task_id!r} has no GPU allocation: no GPU_POOL_* variables in its "
                f"environment. GPU tasks must run on the {EXECUTOR_ALIAS!r} executor "
                "(dag.test() ignores executor=).")
        return allocation

    def start_jobs(self, allocation: RemoteAllocation, try_number: int,
                   checkpoints: str | None = None) -> list[dict[str, str]]:
        """Start the command on every node of the allocation; on a failure, undo the rest."""
        started: list[dict[str, str]] = []
        try:
            for slot, placement in zip(allocation.slots, allocation.placements(), strict=True):
                placement = dataclasses.replace(placement, checkpoint_dir=checkpoints)
                job = RemoteJob(make_job_id(allocation.request or self.task_id, slot.node,
                                            f"try{try_number}"), self.remote_base_dir)
                env = job_environment(placement, job, self.environment)
                self.wait_for_stopping(slot.node, slot.gpu_indices)
                with RemoteJobRunner(slot.ssh_conn_id) as runner:
                    pgid = runner.start(self.command, job, env, time_limit_s=self.time_limit_s,
                                        kill_grace_s=self.kill_grace_s)
                self.log.info("Started job %s on %s (GPUs %s, process group %d)", job.job_id,
                              slot.node, env["CUDA_VISIBLE_DEVICES"], pgid)
                started.append({"node": slot.node, "ssh_conn_id": slot.ssh_conn_id,
                                **job.to_dict()})
        except Exception:
            self.kill_jobs(started, reason="start_failed")
            raise
        self._record_jobs(allocation.request, started)
        return started

    def wait_for_stopping(self, node: str, gpu_indices: Sequence[int]) -> None:
        """Wait until the jobs a preemption is stopping on these GPUs of ``node`` are gone.

        The store gives a placement won by preemption its GPUs the moment the plan is
        applied, while the victims' jobs keep them through their grace to checkpoint (as
        Kueue admits a workload only once its preempted ones are evicted). Each victim is
        polled over SSH until its process group is gone, for at most its grace plus
        :data:`STOP_MARGIN_S`; past that, or with the store unreachable, the command starts
        anyway, with a warning."""
        from gpu_pool.executor_support.release import store_from_airflow

        try:
            store = store_from_airflow(create=False)
            try:
                victims = store.jobs_stopping_on(node, list(gpu_indices))
            finally:
                store.close()
        except Exception as error:
            self.log.warning("Could not ask the gpu-pool store which jobs still stop on %s: "
                             "%s", node, error)
            return
        for victim in victims:
            grace = victim.stop_grace_s or 0.0
            deadline = time.monotonic() + grace + STOP_MARGIN_S
            remote = RemoteJob(victim.job_id, victim.base_dir)
            waited = False
            try:
                with RemoteJobRunner(victim.ssh_conn_id) as runner:
                    while True:
                        status = runner.poll(remote)
                        if status.done and not status.group_alive:
                            break
                        if time.monotonic() >= deadline:
                            self.log.warning(
                                "Job %s of %s still holds GPUs %s on %s %.0fs past its "
                                "grace; starting anyway", victim.job_id,
                                victim.request_name, list(gpu_indices), node, STOP_MARGIN_S)
                            break
                        if not waited:
                            self.log.info(
                                "Waiting for job %s of %s, preempted for these GPUs, to stop "
                                "on %s (grace %.0fs)", victim.job_id, victim.request_name,
                                node, grace)
                            waited = True
                        time.sleep(self.poll_interval)
            except Exception as error:
                self.log.warning("Could not poll job %s on %s: %s; starting anyway",
                                 victim.job_id, node, error)

    def _record_jobs(self, request: str, jobs: list[dict[str, str]]) -> None:
        """Tell the store which jobs run for ``request``, so a preemption can stop them.

        If the store is unreachable the jobs still run; a preemption then cannot stop them
        with grace and the executor falls back to stopping the task process."""
        if not request or not jobs:
            return
        from gpu_pool.executor_support.release import store_from_airflow

        try:
            store = store_from_airflow(create=False)
            try:
                stop = store.record_jobs(request, jobs, self.preemption_grace_s)
            finally:
                store.close()
        except Exception as error:
            self.log.warning("Could not record the jobs of %s in the gpu-pool store: %s",
                             request, error)
            return
        if stop is not None:
            self.log.warning("The GPUs of %s were taken while its jobs started (%s): the "
                             "executor stops them with grace", request, stop)

    def kill_jobs(self, jobs: list[dict[str, str]], *, reason: str = "cancelled") -> None:
        for spec in jobs:
            try:
                with RemoteJobRunner(spec["ssh_conn_id"]) as runner:
                    answer = runner.kill(RemoteJob.from_dict(spec), reason=reason,
                                         grace_s=self.kill_grace_s)
                self.log.warning("Killed job %s on %s: %s", spec["job_id"], spec["node"], answer)
            except Exception as error:
                self.log.error("Could not kill job %s on %s: %s", spec["job_id"], spec["node"],
                               error)

    def _trigger(self, jobs: list[dict[str, str]], started_at: float, *, warned: bool = False,
                 log_offsets: dict[str, int] | None = None) -> GpuRemoteJobTrigger:
        warn_at_s = None if self.time_limit_s is None else self.warn_at * self.time_limit_s
        return GpuRemoteJobTrigger(
            jobs=jobs, started_at=started_at, time_limit_s=self.time_limit_s,
            warn_at_s=warn_at_s, warned=warned,
            kill_grace_s=self.kill_grace_s, poll_interval=self.poll_interval,
            log_offsets=log_offsets, request=self._request)

    def _template_time_limit(self) -> None:
        """The template's time limit, passed by the executor, when the task set none."""
        if self.time_limit_s is None and os.environ.get("GPU_POOL_TIME_LIMIT_S"):
            self.time_limit_s = float(os.environ["GPU_POOL_TIME_LIMIT_S"])

    def execute(self, context: Any) -> None:
        self._template_time_limit()
        # The template's setup runs in the same shell before the command; failing, it fails
        # the task.
        setup = os.environ.get("GPU_POOL_SETUP")
        if setup:
            self.command = f"{{ {setup}\n}} || exit $?\n{self.command}"
        allocation = self._allocation()
        self._request = allocation.request or None
        self.log.info("Allocation %s", allocation.external_id)
        ti = context["ti"]
        checkpoints = checkpoint_dir(self.remote_base_dir, getattr(ti, "dag_id", None)
                                     or self.dag_id, self.task_id,
                                     getattr(ti, "run_id", None) or "manual",
                                     int(getattr(ti, "map_index", -1)))
        if allocation.preemptions:
            self.log.info("This try was preempted %d time(s) before; checkpoints in %s",
                          allocation.preemptions, checkpoints)
        jobs = self.start_jobs(allocation, int(ti.try_number), checkpoints)
        self._jobs = jobs
        started_at = time.time()
        context["ti"].xcom_push(key=XCOM_JOBS, value={"jobs": jobs, "started_at": started_at})
        trigger = self._trigger(jobs, started_at)
        if self.deferrable:
            self.defer(trigger=trigger, method_name="execute_complete")
        while True:  # not deferrable: the trigger's loop, in this process
            event = asyncio.run(_first_event(trigger))
            trigger = self._handle(context, event, started_at)
            if trigger is None:
                return

    def execute_complete(self, context: Any, event: dict[str, Any]) -> None:
        self._template_time_limit()
        started_at = float(event.get("started_at") or time.time())
        trigger = self._handle(context, event, started_at)
        if trigger is not None:
            self.defer(trigger=trigger, method_name="execute_complete")

    def _handle(self, context: Any, event: dict[str, Any],
                started_at: float) -> GpuRemoteJobTrigger | None:
        """The next trigger to wait on, or ``None`` when the task is over (raises on failure)."""
        jobs = event["jobs"]
        self._jobs = jobs
        self._request = event.get("request", self._request)
        status = event["status"]
        if status == "warning":
            self._warn(context, event)
            return self._trigger(jobs, event.get("started_at", started_at), warned=True,
                                 log_offsets=event.get("log_offsets"))
        if status == "error":
            self.kill_jobs(jobs, reason="node_lost")
            raise GpuRemoteJobFailed(f"task {self.task_id!r}: {event.get('message')}")
        results = event.get("results", {})
        summary = ", ".join(f"{r['node']}: exit {r['exit_code']}"
                            + (f" ({r['killed']})" if r.get("killed") else "")
                            for r in results.values())
        if event.get("outcome") == "preempted":
            self._requeue(context, summary)
        if event.get("outcome") != "success":
            raise GpuRemoteJobFailed(
                f"task {self.task_id!r}: remote job {event.get('outcome')}: {summary}")
        self.log.info("Remote job succeeded: %s", summary)
        metrics = event.get("metrics") or {}  # read by the trigger, already in the ledger
        if metrics:
            context["ti"].xcom_push(key=XCOM_METRICS, value=metrics)
            self.log.info("Metrics: %s", metrics)
        return None

    def _requeue(self, context: Any, summary: str) -> None:
        """The jobs were preempted: say by whom, then reschedule without spending a retry."""
        from airflow.sdk.exceptions import AirflowRescheduleException

        why = _preemption_reason(self._request) or "the gpu-pool store did not say why"
        self.log.warning("Task %s was preempted (%s): %s. It goes back to the queue in its "
                         "place, try %s kept (no retry spent); a command that saved a "
                         "checkpoint in $GPU_POOL_CHECKPOINT_DIR resumes from it.",
                         self.task_id, summary, why, context["ti"].try_number)
        raise AirflowRescheduleException(reschedule_date=datetime.now(UTC))

    def _warn(self, context: Any, event: dict[str, Any]) -> None:
        elapsed, limit = event.get("elapsed_s"), event.get("time_limit_s")
        self.log.warning("Task %s has used %.0f s of its %.0f s time limit (%.0f %%)",
                         self.task_id, elapsed or 0, limit or 0,
                         100 * (elapsed or 0) / (limit or 1))
        context["gpu_pool_warning"] = {"elapsed_s": elapsed, "time_limit_s": limit,
                                       "task_id": self.task_id, "jobs": event["jobs"]}
        for callback in self.on_time_limit_warning:
            try:
                callback(context)
            except Exception as error:  # a broken notifier must not fail the training
                self.log.error("Time-limit warning callback %r failed: %s", callback, error)

    def on_kill(self) -> None:
        """The task process is being killed: stop the remote process groups it started.

        While deferred there is no task process; the trigger's ``on_kill`` covers that case.
        """
        self.kill_jobs(self._jobs, reason="cancelled")


def _preemption_reason(request: str | None) -> str | None:
    """Why the request's jobs were stopped ("preempted for X: ..."), from the store."""
    if not request:
        return None
    from gpu_pool.executor_support.release import store_from_airflow

    try:
        store = store_from_airflow(create=False)
        try:
            said = [j.stop_message for j in store.jobs_of(request) if j.stop_message]
        finally:
            store.close()
    except Exception:  # the log line, not the requeue, depends on it
        return None
    return said[-1] if said else None


async def _first_event(trigger: GpuRemoteJobTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise GpuRemoteJobFailed("the trigger ended without an event")
