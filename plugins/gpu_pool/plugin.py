"""The Airflow plugin of gpu-pool: the fleet page and REST API inside Airflow's api-server.

``fastapi_apps`` mounts :func:`gpu_pool.api.create_app` at ``/gpu-pool`` (API under
``/gpu-pool/api``, page at ``/gpu-pool/``); ``external_views`` adds "GPU pool" to the
Browse menu of the Airflow UI (shown in an iframe at ``/plugin/gpu-pool``); the global
operator extra link "GPU placement" leads from any task instance to its placement on the
page, and the page links each holder back to its task instance in the Airflow UI.

Airflow finds it through the ``airflow.plugins`` entry point of the distribution.
"""

from __future__ import annotations

from urllib.parse import urlencode

from airflow.plugins_manager import AirflowPlugin
from airflow.sdk import BaseOperatorLink

from gpu_pool.api import create_app

URL_PREFIX = "/gpu-pool"


class GpuPlacementLink(BaseOperatorLink):
    """"GPU placement": the page's placement panel for this task instance."""

    name = "GPU placement"

    def get_link(self, operator: object, *, ti_key: object) -> str:
        # Global links are offered on every task; only tasks routed to the GPU executor
        # have a placement ("" hides the link).
        executor = getattr(operator, "executor", None)
        if executor is not None and "gpupool" not in str(executor).replace("_", "").lower():
            return ""
        query = {"dag_id": ti_key.dag_id, "task_id": ti_key.task_id, "run_id": ti_key.run_id}
        map_index = getattr(ti_key, "map_index", -1)
        if map_index is not None and map_index >= 0:
            query["map_index"] = map_index
        return f"{URL_PREFIX}/?{urlencode(query)}#placement"


class GpuPoolPlugin(AirflowPlugin):
    name = "gpu_pool"
    fastapi_apps = [{"app": create_app(), "url_prefix": URL_PREFIX, "name": "gpu-pool"}]
    external_views = [{"name": "GPU pool", "href": f"{URL_PREFIX}/", "url_route": "gpu-pool",
                       "destination": "nav", "category": "browse"}]
    global_operator_extra_links = [GpuPlacementLink()]
