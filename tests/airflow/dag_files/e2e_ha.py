"""End-to-end DAG for two schedulers: ten GPU tasks of 1-2 GPUs on a six-GPU fleet."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag
from e2e_common import probe_command

from gpu_pool.operators import GpuSSHOperator


@dag(schedule="@once", start_date=datetime(2026, 1, 1), catchup=False, max_active_tasks=64,
     tags=["gpu-pool-e2e"])
def e2e_ha() -> None:
    for i in range(10):
        GpuSSHOperator(task_id=f"ha_{i}", command=probe_command(f"ha_{i}", 5), team="nlp",
                       gpus=1 + i % 2, poll_interval=1)


e2e_ha()
