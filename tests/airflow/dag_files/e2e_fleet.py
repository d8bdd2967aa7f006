"""End-to-end DAG: twelve GPU tasks of mixed sizes, more than the fleet holds at once.

The fleet of the test is node-a (4 x A100) and node-b (2 x T4): 6 GPUs. The tasks ask for
4 + 3 x 2 + 5 x 1 whole GPUs, two half GPUs, and one critical GPU task that is queued last
(after ``gate``, an ordinary task on the default executor) while the others wait.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import dag, task
from e2e_common import probe_command

from gpu_pool.operators import GpuSSHOperator

SIZES = {
    "big_a100": {"gpus": 4, "gpu_models": ["A100"], "priority": "normal"},
    "pair_1": {"gpus": 2, "priority": "normal"},
    "pair_2": {"gpus": 2, "priority": "low"},
    "pair_3": {"gpus": 2, "priority": "low"},
    "one_1": {"gpus": 1, "priority": "normal"},
    "one_2": {"gpus": 1, "priority": "low"},
    "one_3": {"gpus": 1, "priority": "low"},
    "one_4": {"gpus": 1, "priority": "low"},
    "one_5": {"gpus": 1, "priority": "low"},
    "half_1": {"gpu_share": 500, "priority": "normal"},
    "half_2": {"gpu_share": 500, "priority": "low"},
}
SECONDS = 25  # the backlog must outlast task_queued_timeout (60 s): 10 s gave a longest wait of
# 55 s on a fast day, 20 s gave 63 s once GPUs went back the moment each job ended


@dag(schedule="@once", start_date=datetime(2026, 1, 1), catchup=False, max_active_tasks=64,
     tags=["gpu-pool-e2e"])
def e2e_fleet() -> None:
    for name, size in SIZES.items():
        GpuSSHOperator(task_id=name, command=probe_command(name, SECONDS), team="nlp",
                       poll_interval=1, **size)

    @task(priority_weight=1, retries=3, retry_delay=timedelta(seconds=1))
    def gate() -> None:
        import time

        time.sleep(12)

    critical = GpuSSHOperator(task_id="critical", command=probe_command("critical", SECONDS),
                              team="nlp", gpus=1, priority="critical", priority_weight=1000,
                              poll_interval=1)
    gate() >> critical


e2e_fleet()
