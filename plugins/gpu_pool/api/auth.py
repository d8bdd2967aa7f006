"""Who may do what through the gpu-pool API, decided by Airflow's auth manager.

Reading needs an authenticated Airflow user (``requires_authenticated()``). Changing the
fleet (setting a quota, draining or downing a node) is a fleet administration act: the
auth manager must allow ``PUT`` on the configuration section ``gpu_pool``
(``is_authorized_configuration``), the permission every auth manager already implements for
changing how Airflow itself runs. Under the SimpleAuthManager that is the ``op`` and
``admin`` roles (``viewer`` and ``user`` are refused); under the FAB auth manager, whoever
may edit the configuration.

The actor recorded in the store's event rows is the user's name as the auth manager gives
it (``BaseUser.get_name()``).
"""

from __future__ import annotations

from typing import Annotated, Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.auth.managers.models.resource_details import ConfigurationDetails
from airflow.api_fastapi.core_api.security import get_user
from fastapi import Depends, HTTPException, status

CONFIG_SECTION = "gpu_pool"


def can_admin(user: Any) -> bool:
    """Whether the auth manager lets ``user`` change the fleet."""
    return bool(get_auth_manager().is_authorized_configuration(
        method="PUT", details=ConfigurationDetails(section=CONFIG_SECTION), user=user))


def actor_name(user: Any) -> str:
    return str(user.get_name() or user.get_id())


async def require_fleet_admin(user: Annotated[Any, Depends(get_user)]) -> Any:
    """FastAPI dependency: the user, if they may change the fleet; else 403 saying why."""
    if not can_admin(user):
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"user {actor_name(user)!r} may not change the GPU fleet: it needs permission to "
            f"edit the Airflow configuration section [{CONFIG_SECTION}] (role op or admin "
            "under the SimpleAuthManager)")
    return user
