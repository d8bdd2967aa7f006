"""The gpu-pool REST API and fleet page, as a FastAPI app Airflow's api-server mounts.

Modules: ``app`` (routes, error mapping; :func:`create_app`), ``auth`` (who may change the
fleet), ``views`` (what each endpoint shows, built from the store), ``queries`` (the read
queries the store lacks), ``schemas`` (the JSON shapes).
"""

from __future__ import annotations

from gpu_pool.api.app import create_app

__all__ = ["create_app"]
