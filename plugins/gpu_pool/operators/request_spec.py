"""The request spec of a GPU task: built and validated when the DAG is parsed.

:func:`request_spec` turns an operator's (or ``@task.gpu``'s) keyword arguments into the
plain, JSON-safe mapping that travels as ``executor_config["gpu_pool"]`` to the executor,
which re-parses it with :func:`gpu_pool.spec.parse_request` (adding the request name).
Parsing it here as well means a bad spec is a DAG import error naming the task and the
field — the same message the CLI prints — instead of a failure hours later.

Conversions: durations (``timedelta``, ``"6h"``) become seconds; an Airflow ``Asset`` becomes its URI (its
``extra`` may carry ``zone`` and ``size_gib``, used unless given explicitly); sets and tuples
become lists.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import timedelta
from typing import Any

from gpu_pool.errors import SpecError
from gpu_pool.spec import parse_duration, parse_request

SPEC_KEY = "gpu_pool"
# The request fields a task may set (the name comes from the task instance).
TASK_SPEC_FIELDS = (
    "team", "purpose", "priority", "gpus", "gpu_share", "nodes", "gpus_per_node",
    "gpu_models", "min_gpu_memory", "cpu", "memory", "dataset", "dataset_zone",
    "dataset_size_gib", "data_ready", "time_limit", "estimated_runtime", "preemptible",
    "grace",
)


def _plain(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, set | frozenset | tuple):
        return sorted(value) if isinstance(value, set | frozenset) else list(value)
    return value


def dataset_fields(dataset: Any) -> dict[str, Any]:
    """``dataset`` (+ zone and size from an Asset's ``extra``) as plain spec fields."""
    if dataset is None:
        return {}
    uri = getattr(dataset, "uri", None)
    if uri is None:
        return {"dataset": str(dataset)}
    extra = getattr(dataset, "extra", None) or {}
    fields: dict[str, Any] = {"dataset": uri}
    if extra.get("zone") is not None:
        fields["dataset_zone"] = extra["zone"]
    if extra.get("size_gib") is not None:
        fields["dataset_size_gib"] = extra["size_gib"]
    return fields


def request_spec(task_id: str, fields: dict[str, Any], *,
                 known_teams: Collection[str] | None = None,
                 template: str | None = None) -> dict[str, Any]:
    """The validated, JSON-safe spec; :class:`SpecError` located at ``task '<task_id>'``.

    ``template`` names a stored template: the executor adds its fields under the task's own
    at admission (the DAG processor does not read the store)."""
    where = f"task {task_id!r}"
    if template is not None:
        from gpu_pool.spec import parse_name

        try:
            parse_name(template, "template")
        except SpecError as error:
            raise error.located(where) from None
    for key in fields:
        if key not in TASK_SPEC_FIELDS:
            raise SpecError(key, fields[key], "one of the GPU request fields "
                            + ", ".join(TASK_SPEC_FIELDS), where=where)
    data = {k: _plain(v) for k, v in fields.items() if v is not None and k != "dataset"}
    for key, value in dataset_fields(fields.get("dataset")).items():
        data.setdefault(key, value)
    try:
        parse_request({"name": task_id, **data}, known_teams=known_teams)
    except SpecError as error:
        raise error.located(where) from None
    for key in ("time_limit", "estimated_runtime", "grace"):
        if key in data:
            data[key] = parse_duration(data[key], key).total_seconds()
    if template is not None:
        data["template"] = template
    return data
