"""End-to-end DAG: a GPU task charged to team ``cv``, whose members do not include this
DAG's owner (``airflow``, the default) — refused at admission (tests/airflow/test_celery.py)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag, task


@dag(schedule="@once", start_date=datetime(2026, 1, 1), catchup=False, tags=["gpu-pool-e2e"])
def e2e_not_a_member() -> None:
    @task.gpu(gpus=1, team="cv", time_limit="5m")
    def train() -> str:
        return "echo should never run"

    train()


e2e_not_a_member()
