"""End-to-end DAG: critical work that needs the GPUs the batch training holds."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG
from e2e_common import probe_command

from gpu_pool.operators import GpuSSHOperator

with DAG("e2e_preempt_urgent", schedule="@once", start_date=datetime(2026, 1, 1),
         catchup=False, tags=["gpu-pool-e2e"]):
    GpuSSHOperator(task_id="urgent", command=probe_command("urgent", 2), team="nlp", gpus=2,
                   priority="critical", poll_interval=1, retries=0)
