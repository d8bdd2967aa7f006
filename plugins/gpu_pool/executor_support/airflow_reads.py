"""The metadata-database reads the executor makes, inside the scheduler process.

Only the scheduler side may read Airflow's database (task processes talk to the Execution
API), so these helpers are for the executor alone. Each opens its own short session.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable

from sqlalchemy import or_, select

TERMINAL = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})


def task_states(ti_ids: Iterable[str]) -> dict[str, str | None]:
    """State of each task instance id; an id no longer in the table maps to ``"removed"``."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    ids = list(ti_ids)
    if not ids:
        return {}
    with create_session() as session:
        rows = session.execute(
            select(TaskInstance.id, TaskInstance.state)
            .where(TaskInstance.id.in_([uuid.UUID(i) for i in ids]))
        ).all()
    found = {str(row[0]): (str(row[1]) if row[1] is not None else None) for row in rows}
    return {i: found.get(i, "removed") for i in ids}


def assets_with_events(uris: Iterable[str]) -> set[str]:
    """The dataset references (asset URI or name) that have at least one asset event."""
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    wanted = set(uris)
    if not wanted:
        return set()
    with create_session() as session:
        rows = session.execute(
            select(AssetModel.uri, AssetModel.name)
            .where(or_(AssetModel.uri.in_(wanted), AssetModel.name.in_(wanted)))
            .where(select(AssetEvent.id).where(AssetEvent.asset_id == AssetModel.id).exists())
        ).all()
    ready: set[str] = set()
    for uri, name in rows:
        ready.update({uri, name} & wanted)
    return ready


METRICS_KEY = "gpu_pool_metrics"


def pushed_metrics(dag_id: str, task_id: str, run_id: str, map_index: int) -> dict[str, float]:
    """The ``gpu_pool_metrics`` XCom the task instance pushed: its finite numbers, else {}."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    from gpu_pool.remote.job import is_metric_value

    with create_session() as session:
        row = session.execute(
            select(XComModel.value).where(
                XComModel.dag_id == dag_id, XComModel.task_id == task_id,
                XComModel.run_id == run_id, XComModel.map_index == map_index,
                XComModel.key == METRICS_KEY)
        ).first()
    value = XComModel.deserialize_value(row) if row is not None else None
    if not isinstance(value, dict):
        return {}
    return {str(k): float(v) for k, v in value.items() if is_metric_value(v)}


def run_people(dag_id: str, run_id: str) -> list[str]:
    """The DAG's owners and the user who triggered the run (if a user did)."""
    from airflow.models.dag import DagModel
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        owners = session.execute(select(DagModel.owners).where(DagModel.dag_id == dag_id)
                                 ).scalar()
        user = session.execute(select(DagRun.triggering_user_name).where(
            DagRun.dag_id == dag_id, DagRun.run_id == run_id)).scalar()
    people = [o.strip() for o in (owners or "").split(",") if o.strip()]
    return [*people, user] if user else people
