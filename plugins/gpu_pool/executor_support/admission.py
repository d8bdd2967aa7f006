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
from gpu_pool.executor_support import airflow_reads
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
                spec, used = self._with_template(cycle, spec)
                request = parse_request(
                    {**spec, "name": name, "submitted_at": datetime.now(UTC)},
                    policy=cycle.policy,
                )
                self._check_membership(cycle, request.team, workload)
                if request.dataset is not None:
                    request = dataclasses.replace(request, data_ready=cycle.is_ready(request))
                cycle.admit(request, {**link(workload), **used})
            except (StoreError, ConflictError):
                raise  # the store, not the request: retried next heartbeat
            except GpuPoolError as error:
                self.log.error("GPU task %s refused: %s", key, error)
                self.queued_tasks.pop(key, None)
                self.fail(key, info=f"gpu-pool: {error}")
                continue
            self._names[key] = name


    def _with_template(self: Any, cycle: Any, spec: dict[str, Any]
                       ) -> tuple[dict[str, Any], dict[str, Any]]:
        """The spec with its template's fields under it (the task's own win), and what to
        record: ``template`` (``name@vN``) and its ``setup`` command."""
        name = spec.pop("template", None)
        if name is None:
            return spec, {}
        template = cycle.store.template_for(str(name), str(spec.get("team")))
        fields = {k: v for k, v in template.fields.items() if k != "setup"}
        return {**fields, **spec}, {"template": f"{template.name}@v{template.version}",
                                    "setup": template.fields.get("setup")}

    def _check_membership(self: Any, cycle: Any, team: str, workload: Any) -> None:
        """A task is charged to ``team`` only if the DAG's owner or the run's triggering
        user is a member (teams without members are open unless membership is required)."""
        required = bool(getattr(self, "require_membership", False))
        if not required and not cycle.store.members(team):
            return
        people = airflow_reads.run_people(workload.ti.dag_id, workload.ti.run_id)
        cycle.store.check_charge(team, people, require_membership=required)


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
