"""Provider metadata: how Airflow discovers gpu-pool's ``@task.gpu`` decorator.

The ``apache_airflow_provider`` entry point of the ``airflow-gpu-pool`` distribution points
here (see ``pyproject.toml``); Airflow's providers manager calls :func:`get_provider_info`
and registers each ``task-decorators`` entry as ``task.<name>``. This module must import
nothing heavy: it is loaded by every Airflow process that looks up providers.
"""

from __future__ import annotations

from typing import Any

from gpu_pool import __version__


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-gpu-pool",
        "name": "gpu-pool",
        "description": "Airflow as the scheduler of a shared GPU fleet reachable over SSH.",
        "versions": [__version__],
        "task-decorators": [
            {"name": "gpu", "class-name": "gpu_pool.decorators.gpu.gpu_task"},
        ],
        "operators": [
            {"integration-name": "gpu-pool", "python-modules": ["gpu_pool.operators.gpu_ssh"]},
        ],
        "triggers": [
            {"integration-name": "gpu-pool",
             "python-modules": ["gpu_pool.triggers.remote_job"]},
        ],
    }
