"""End-to-end DAG: one GPU task placed by gpu-pool and one ordinary task (LocalExecutor).

The GPU task writes the allocation it was given (the ``GPU_POOL_*`` environment) to
``$GPU_POOL_E2E_OUT/<task_id>.json`` so the test can compare it with the store.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from pathlib import Path

from airflow.sdk import dag, task


@dag(schedule="@once", start_date=datetime(2026, 1, 1), catchup=False, tags=["gpu-pool-e2e"])
def e2e_one_gpu() -> None:
    @task(executor="GpuPool", executor_config={"gpu_pool": {"team": "nlp", "gpus": 1}})
    def gpu_probe() -> str:
        env = {k: v for k, v in os.environ.items()
               if k.startswith("GPU_POOL_") or k == "CUDA_VISIBLE_DEVICES"}
        env["seen_at"] = str(time.time())
        out = Path(os.environ["GPU_POOL_E2E_OUT"]) / "gpu_probe.json"
        out.write_text(json.dumps(env))
        return env.get("GPU_POOL_NODE", "")

    @task
    def ordinary() -> str:
        return "ran on the default executor"

    gpu_probe()
    ordinary()


e2e_one_gpu()
