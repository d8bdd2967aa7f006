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
        "config": {
            "gpu_pool": {
                "description": "The gpu-pool executor and its placement engine.",
                "options": {
                    "policy_file": {
                        "description": (
                            "A YAML sharing-policy document (see `gpu-pool policy check`). "
                            "Read when the executor starts: a bad file stops it with one "
                            "line; a changed one becomes the store's next policy version. "
                            "Empty: the store's latest version (`gpu-pool policy set`)."),
                        "version_added": __version__,
                        "type": "string",
                        "example": "/etc/gpu-pool/policy.yaml",
                        "default": "",
                    },
                },
            },
        },
    }
