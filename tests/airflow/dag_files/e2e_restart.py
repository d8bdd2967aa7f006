"""End-to-end DAG: GPU tasks running while the scheduler is killed and restarted.

Each task runs 60 s on the node, watched from its worker process (``deferrable=False``, so
the task instance stays RUNNING); the test kills the scheduler once both run and starts a
new one, which must adopt them (no retry, no killed training, no leaked GPUs).
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag
from e2e_common import probe_command

from gpu_pool.operators import GpuSSHOperator


@dag(schedule="@once", start_date=datetime(2026, 1, 1), catchup=False, tags=["gpu-pool-e2e"])
def e2e_restart() -> None:
    for name in ("long_1", "long_2"):
        GpuSSHOperator(task_id=name, command=probe_command(name, 60), team="nlp", gpus=2,
                       poll_interval=1, retries=0, deferrable=False)


e2e_restart()
