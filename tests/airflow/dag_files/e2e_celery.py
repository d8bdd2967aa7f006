"""End-to-end DAG for two executors in one Airflow: CPU tasks on the default executor
(CeleryExecutor, a real Celery worker) and GPU tasks through GpuPoolExecutor.

Every task writes where it ran to ``$GPU_POOL_E2E_OUT/<task_id>.json``: the worker's mark
(``GPU_POOL_E2E_WORKER``, set only in the Celery worker's environment) and the GPU
allocation (``GPU_POOL_*``, ``CUDA_VISIBLE_DEVICES``), read by tests/airflow/test_celery.py.
"""

from __future__ import annotations

import json
import os
import shlex
from datetime import datetime
from pathlib import Path

from airflow.sdk import dag, task


def _record(name: str, **extra: str) -> dict[str, str]:
    seen = {k: v for k, v in os.environ.items()
            if k.startswith("GPU_POOL_") or k == "CUDA_VISIBLE_DEVICES"}
    seen.update(extra, pid=str(os.getpid()))
    (Path(os.environ["GPU_POOL_E2E_OUT"]) / f"{name}.json").write_text(json.dumps(seen))
    return seen


def _dump_command(name: str, worker: str) -> str:
    """On the node: what the command saw, as JSON (the upstream CPU task's mark included)."""
    script = ("import json, os, sys; seen = {k: v for k, v in os.environ.items() if "
              "k.startswith(('GPU_POOL_', 'CUDA_VISIBLE_DEVICES'))}; "
              "seen['upstream_worker'] = sys.argv[1]; "
              "open(os.path.join(os.environ['GPU_POOL_E2E_OUT'], sys.argv[2] + '.json'), 'w')"
              ".write(json.dumps(seen))")
    return f"python3 -c {shlex.quote(script)} {shlex.quote(worker)} {shlex.quote(name)}"


@dag(schedule="@once", start_date=datetime(2026, 1, 1), catchup=False, tags=["gpu-pool-e2e"])
def e2e_celery() -> None:
    @task
    def prepare() -> str:
        return _record("prepare")["GPU_POOL_E2E_WORKER"]

    # GPU tasks: a command run over SSH on the node gpu-pool chose (@task.gpu).
    @task.gpu(gpus=1, team="nlp", time_limit="10m")
    def train(worker: str) -> str:
        return _dump_command("train", worker)

    @task.gpu(gpus=1, team="nlp", time_limit="10m")
    def evaluate(worker: str) -> str:
        return _dump_command("evaluate", worker)

    @task
    def report(results: list[object]) -> None:
        _record("report", gpu_results=json.dumps(results, default=str))

    worker = prepare()
    report([train(worker), evaluate(worker)])


e2e_celery()
