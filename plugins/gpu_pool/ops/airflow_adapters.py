"""The Airflow side of the chores: settings, channels, object store and task liveness as
Airflow provides them. Imported by the DAGs and the CLI; Airflow is imported inside each
function so that importing this module costs nothing.

Liveness, two ways
------------------
``sdk_liveness``
    Inside a running task (the reclaim DAG): the Task SDK's ``get_task_states`` through the
    Execution API, per DAG run. A request whose DAG run or task instance is gone reads
    ``removed``. It cannot tell tries apart: a task retried since keeps its state.
``metadata_liveness``
    Where Airflow's metadata database is reachable (the CLI on a scheduler host): the state
    of the exact task instance try (``requests.executor_key`` is the TI id).
Requests not started by Airflow (no dag_id) read ``None``: unknown, never released.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_pool.notify.channels import TeamChannels
from gpu_pool.objectstore import S3ObjectStore, config_from_airflow
from gpu_pool.ops.config import VARIABLE, OpsConfig
from gpu_pool.ops.storeviews import TaskLink


def ops_config() -> OpsConfig:
    """Settings from the Airflow Variable ``gpu_pool_ops`` (a JSON object), else defaults."""
    from airflow.sdk import Variable

    return OpsConfig.from_json(Variable.get(VARIABLE, default=None))


def team_channels(config: OpsConfig) -> TeamChannels:
    from gpu_pool.notify.notifiers import airflow_team_channels

    return airflow_team_channels(config.smtp_conn_id)


def object_store(config: OpsConfig) -> S3ObjectStore:
    return S3ObjectStore(config_from_airflow(config.s3_conn_id))


def _task_key(link: TaskLink) -> str:
    index = link.map_index if link.map_index is not None else -1
    return link.task_id if index < 0 else f"{link.task_id}_{index}"


def sdk_liveness(links: Mapping[str, TaskLink]) -> dict[str, str | None]:
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    states: dict[str, str | None] = {}
    runs: dict[tuple[str, str], list[TaskLink]] = {}
    for name, link in links.items():
        if link.dag_id and link.run_id and link.task_id:
            runs.setdefault((link.dag_id, link.run_id), []).append(link)
        else:
            states[name] = None
    for (dag_id, run_id), group in runs.items():
        found = RuntimeTaskInstance.get_task_states(dag_id=dag_id, run_ids=[run_id])
        by_task = found.get(run_id, {})
        for link in group:
            state = by_task.get(_task_key(link))
            states[link.request_name] = "removed" if state is None else str(state)
    return states


def metadata_liveness(links: Mapping[str, TaskLink]) -> dict[str, str | None]:
    from gpu_pool.executor_support.airflow_reads import task_states

    with_ids = {name: link.ti_id for name, link in links.items() if link.ti_id}
    found = task_states(with_ids.values())
    out: dict[str, str | None] = {name: None for name in links}
    for name, ti_id in with_ids.items():
        out[name] = found.get(ti_id)
    return out


def probe_over_ssh(node: Any, now: Any) -> Any:
    """Probe a store node through its SSH connection (``gpu_pool.probe.probe_node``)."""
    from gpu_pool.probe import NodeProbe, probe_node

    if not node.ssh_conn_id:
        return NodeProbe(node.name, now, False, error="node has no ssh_conn_id")
    return probe_node(node.name, node.ssh_conn_id, at=now)


def open_store() -> Any:
    """The store named by ``GPU_POOL_DB_URL`` or the Airflow connection ``gpu_pool_db``,
    migrated (idempotent) so the ops tables exist."""
    from gpu_pool.store import Store, resolve_db_url

    store = Store.from_url(resolve_db_url(None))
    store.migrate()
    return store
