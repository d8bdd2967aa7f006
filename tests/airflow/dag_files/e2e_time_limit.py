"""End-to-end DAG: a GPU task that outlives its time limit is killed, process group and all.

The remote command records its process group id, then runs a child ``sleep`` for two
minutes; the 6-second time limit must kill the whole group on the node.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag
from e2e_common import probe_command

from gpu_pool.operators import GpuSSHOperator


@dag(schedule="@once", start_date=datetime(2026, 1, 1), catchup=False, tags=["gpu-pool-e2e"])
def e2e_time_limit() -> None:
    GpuSSHOperator(task_id="overrun", command=probe_command("overrun", 120),
                   team="nlp", gpus=1, time_limit="6s", poll_interval=1, kill_grace=2,
                   retries=0)


e2e_time_limit()
