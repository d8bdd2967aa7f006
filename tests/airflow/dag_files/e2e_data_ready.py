"""End-to-end DAG: a GPU task whose dataset has no asset event yet waits, holding no GPU.

``produce`` (default executor) waits a while, then emits the asset event of
``file:///e2e/corpus-v1``; ``train`` (GPU) reads that dataset and must not be placed —
nor start — before the event exists.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import Asset, dag, task
from e2e_common import probe_command

from gpu_pool.operators import GpuSSHOperator

CORPUS = Asset(name="e2e-corpus-v1", uri="file:///e2e/corpus-v1")


@dag(schedule="@once", start_date=datetime(2026, 1, 1), catchup=False, tags=["gpu-pool-e2e"])
def e2e_data_ready() -> None:
    @task(outlets=[CORPUS])
    def produce() -> None:
        import time

        time.sleep(15)

    produce()
    GpuSSHOperator(task_id="train", command=probe_command("data_train", 2), team="nlp", gpus=1,
                   dataset=CORPUS, poll_interval=1)


e2e_data_ready()
