"""Example: a training pipeline whose GPU steps gpu-pool places on the shared fleet.

``prepare`` runs on the default executor and publishes the corpus Asset; the GPU steps run
on the ``GpuPool`` executor: ``finetune`` asks for 2 A100/H100 GPUs and waits ("data not
ready", holding no GPU) until the corpus has an asset event; ``evaluate`` takes half of one
GPU; ``hotfix_eval`` is critical and jumps the queue. Each GPU command runs over SSH on the
node gpu-pool chose, with ``CUDA_VISIBLE_DEVICES`` set to the GPUs it was given.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import Asset, dag, task

from gpu_pool.operators import GpuSSHOperator

CORPUS = Asset(name="corpus-zh-v3", uri="s3://corpora/zh-v3")


@dag(schedule=None, start_date=datetime(2026, 1, 1), catchup=False, tags=["gpu-pool", "example"])
def example_gpu_training() -> None:
    @task(outlets=[CORPUS])
    def prepare() -> None:
        """Stand-in for the data pipeline that lands the corpus."""

    @task.gpu(gpus=2, gpu_models=["A100", "H100"], team="nlp", purpose="training",
              priority="high", dataset=CORPUS, time_limit=timedelta(hours=6))
    def finetune(epochs: int) -> str:
        return f"echo training on $CUDA_VISIBLE_DEVICES; sleep 20; echo done {epochs} epochs"

    evaluate = GpuSSHOperator(
        task_id="evaluate", command="echo evaluating on $CUDA_VISIBLE_DEVICES; sleep 10",
        team="nlp", purpose="inference", gpu_share=500, time_limit="30m")
    GpuSSHOperator(
        task_id="hotfix_eval", command="echo hotfix eval; sleep 5", team="nlp",
        purpose="inference", gpus=1, priority="critical", time_limit="15m")

    prepare() >> finetune(epochs=3) >> evaluate


example_gpu_training()
