"""Example: a hyper-parameter sweep that asks for more GPUs than the fleet has free.

Six 2-GPU trials of team ``vision`` (normal priority) and one preemptible pretraining chunk
arrive together; gpu-pool places what fits, says why the rest waits ("needs 2 GPUs on one
node; largest free block is ..."), and starts each waiting trial the moment a finished one
gives its GPUs back. Every trial's command runs over SSH on its node with
``CUDA_VISIBLE_DEVICES`` set to the GPUs it was given.
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import dag

from gpu_pool.operators import GpuSSHOperator

LEARNING_RATES = ("1e-4", "3e-4", "1e-3", "3e-3", "1e-2", "3e-2")


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False, max_active_tasks=16,
     tags=["gpu-pool", "example"])
def example_gpu_sweep() -> None:
    for i, lr in enumerate(LEARNING_RATES):
        GpuSSHOperator(
            task_id=f"trial_{i}", team="vision", purpose="training", gpus=2,
            command=f"echo trial lr={lr} on $CUDA_VISIBLE_DEVICES; sleep 12; echo done",
            time_limit="20m")
    GpuSSHOperator(
        task_id="pretrain_chunk", team="vision", purpose="pretraining", gpus=1,
        priority="batch", command="echo pretraining chunk on $CUDA_VISIBLE_DEVICES; sleep 8",
        time_limit="1h")


example_gpu_sweep()
