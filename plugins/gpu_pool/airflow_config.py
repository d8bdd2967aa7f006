"""The Airflow settings gpu-pool needs, as data: write them to ``airflow.cfg`` or the environment.

``settings(...)`` returns ``{section: {key: value}}``; :func:`as_environment` turns that into
``AIRFLOW__SECTION__KEY`` variables (what the tests and the demo use) and
:func:`write_airflow_cfg` merges it into an existing ``airflow.cfg`` without touching other
keys. Values are strings, exactly as Airflow reads them.

The one setting that matters most::

    [core]
    executor = LocalExecutor,GpuPool:gpu_pool.executor.GpuPoolExecutor

LocalExecutor stays first (the default; callbacks run there); GPU tasks say
``executor="GpuPool"``.
"""

from __future__ import annotations

import configparser
from collections.abc import Mapping
from pathlib import Path

EXECUTOR_ALIAS = "GpuPool"
EXECUTOR_PATH = "gpu_pool.executor.GpuPoolExecutor"
EXECUTORS = f"LocalExecutor,{EXECUTOR_ALIAS}:{EXECUTOR_PATH}"

Settings = dict[str, dict[str, str]]


def settings(
    *,
    store_url: str | None = None,
    dags_folder: str | Path | None = None,
    max_held_tasks: int = 64,
    idle_replan_seconds: float = 5.0,
    default_executor: str = "LocalExecutor",
    policy_file: str | Path | None = None,
    extra: Mapping[str, Mapping[str, object]] | None = None,
) -> Settings:
    """gpu-pool's Airflow settings; ``extra`` adds or overrides any ``{section: {key: value}}``."""
    out: Settings = {
        "core": {
            "executor": f"{default_executor},{EXECUTOR_ALIAS}:{EXECUTOR_PATH}",
            "load_examples": "False",
        },
        "gpu_pool": {
            "max_held_tasks": str(max_held_tasks),
            "idle_replan_seconds": str(idle_replan_seconds),
        },
    }
    if store_url:
        out["gpu_pool"]["store_url"] = store_url
    if policy_file is not None:
        # The sharing policy (gpu_pool.policy_file): read at executor start and recorded in
        # the store as a new version when it changed.
        out["gpu_pool"]["policy_file"] = str(policy_file)
    if dags_folder is not None:
        out["core"]["dags_folder"] = str(dags_folder)
    for section, values in (extra or {}).items():
        out.setdefault(section, {}).update({k: _text(v) for k, v in values.items()})
    return out


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    return str(value)


def as_environment(values: Settings) -> dict[str, str]:
    """``AIRFLOW__<SECTION>__<KEY>`` variables for ``values``."""
    return {
        f"AIRFLOW__{section.upper()}__{key.upper()}": value
        for section, keys in values.items()
        for key, value in keys.items()
    }


def write_airflow_cfg(path: str | Path, values: Settings) -> Path:
    """Merge ``values`` into the config file at ``path`` (created when missing)."""
    path = Path(path)
    parser = configparser.ConfigParser(interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    if path.exists():
        parser.read(path)
    for section, keys in values.items():
        if not parser.has_section(section):
            parser.add_section(section)
        for key, value in keys.items():
            parser.set(section, key, value)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        parser.write(handle)
    return path
