"""Step 1 of a heartbeat: admit newly queued GPU workloads as store requests.

Terms
-----
held workload
    A GPU task instance the scheduler queued to this executor (``queued_tasks``) and that
    waits for GPUs; its store request is named by :func:`~gpu_pool.executor_support.naming.
    request_name` from the task instance key.

Rules
-----
* At most ``max_admit`` new workloads per heartbeat (each is a store write).
* A bad spec fails the task at once with the spec's own one-line message.
* A name the store already has is adopted, never resubmitted: a task preempted and
  rescheduled comes back with the same key (its ``try_number`` unchanged), hence the same
  name, and finds its request PENDING where the preemption left it, with its
  ``submitted_at`` — so it keeps its place in line (:meth:`PlacementCycle.admit`).
* A store failure is raised (the heartbeat retries); it is not the task's fault.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

from gpu_pool.errors import ConflictError, GpuPoolError, StoreError
from gpu_pool.executor_support.naming import request_name

SPEC_KEY = "gpu_pool"


class AdmissionMixin:
    """The executor's admission step (mixed into :class:`gpu_pool.executor.GpuPoolExecutor`)."""

    def _admit_new(self: Any) -> None:
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
                cycle.admit(request, link(workload))
            except (StoreError, ConflictError):
                raise  # the store, not the request: retried next heartbeat
            except GpuPoolError as error:
                self.log.error("GPU task %s refused: %s", key, error)
                self.queued_tasks.pop(key, None)
                self.fail(key, info=f"gpu-pool: {error}")
                continue
            self._names[key] = name


def link(workload: Any) -> dict[str, Any]:
    """The Airflow task instance fields a request is submitted with."""
    ti = workload.ti
    return {
        "dag_id": ti.dag_id,
        "task_id": ti.task_id,
        "run_id": ti.run_id,
        "map_index": ti.map_index,
        "try_number": ti.try_number,
        "executor_key": str(ti.id),
    }
