"""Step 3 of a heartbeat: start a held workload whose request now holds GPUs.

The task process is ``python -m airflow.sdk.execution_time.execute_workload`` with a fresh
token, ``CUDA_VISIBLE_DEVICES`` and the ``GPU_POOL_*`` variables
(:class:`~gpu_pool.remote.allocation.RemoteAllocation`, including ``GPU_POOL_PREEMPTED``:
how many times this try was preempted before), in its own session so that it outlives the
scheduler; ``gpu://node/0,1`` is reported as the external executor id.

Rules: a workload whose nodes have no SSH connection id fails at once and its GPUs go back;
nothing here waits on a node.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.configuration import conf

from gpu_pool.errors import GpuPoolError
from gpu_pool.model import AllocationState
from gpu_pool.remote.allocation import RemoteAllocation

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey

    from gpu_pool.executor_support.cycle import Binding


@dataclass
class Started:
    """A task process this executor started."""

    key: TaskInstanceKey
    ti_id: str
    name: str
    process: subprocess.Popen[bytes]
    started: float
    live: bool = True  # False: resumed after its job ended and its GPUs went back


def _template_env(store: Any, name: str) -> dict[str, str]:
    """A templated task's setup command and time limit, for the operator (the template as
    it was when the task was admitted)."""
    external = store.request_external(name) or {}
    if not external.get("template"):
        return {}
    env = {"GPU_POOL_TEMPLATE": str(external["template"])}
    if external.get("setup"):
        env["GPU_POOL_SETUP"] = str(external["setup"])
    request = store.get_request(name)
    if request is not None and request.time_limit is not None:
        env["GPU_POOL_TIME_LIMIT_S"] = str(request.time_limit.total_seconds())
    return env


class StartingMixin:
    """The executor's start step (mixed into :class:`gpu_pool.executor.GpuPoolExecutor`)."""

    def _start(self: Any, key: TaskInstanceKey, binding: Binding) -> None:
        from airflow.executors.workloads import ExecuteTask

        cycle = self._require_cycle()
        conn_ids = {n.name: n.ssh_conn_id for n in cycle.store.list_nodes() if n.ssh_conn_id}
        preemptions = sum(1 for a in cycle.store.allocations_of(binding.request_name)
                          if a.state is AllocationState.PREEMPTED) if binding.live else 0
        try:
            allocation = RemoteAllocation.from_model(binding.request_name, binding.allocations,
                                                     conn_ids, preemptions)
        except GpuPoolError as error:
            self.log.error("GPU task %s cannot start: %s", key, error)
            self.queued_tasks.pop(key, None)
            self.fail(key, info=f"gpu-pool: {error}")
            self._release(key, binding.request_name, "failed")
            return
        workload = self.queued_tasks.pop(key)
        self._watched.pop(key, None)
        self._resuming.discard(key)
        token = self.jwt_generator.generate(
            extras={"sub": str(workload.ti.id), "scope": "workload"},
            valid_for=max(conf.getfloat("scheduler", "task_queued_timeout"), 600.0),
        ) if isinstance(workload, ExecuteTask) else ""
        fresh = workload.model_copy(update={"token": token})
        env = {**os.environ, **allocation.to_env(), **_template_env(cycle.store,
                                                                    binding.request_name)}
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
        self._started[key] = Started(key, str(workload.ti.id), binding.request_name, process,
                                     time.monotonic(), binding.live)
        self.running_state(key, allocation.external_id)
        self.log.info("Started %s on %s (pid %s)%s", key, allocation.external_id, process.pid,
                      f", preempted {preemptions} time(s) before" if preemptions else "")
