"""Names that tie an Airflow task instance try to the store and back.

request name
    ``<dag_id>.<task_id>[.<map_index>].<try_number>@<run_id>`` — deterministic from the task
    instance key, so a restarted scheduler (or another one) finds the same request again.
    When that would not be a valid store name (too long, odd characters) it becomes
    ``ti-<hash of the key>``, still deterministic.
external executor id
    ``gpu://<node>/<i>,<j>`` (a gang: ``gpu://a/0,1+b/0,1``), shown in the Airflow UI as the
    task instance's external executor id.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Protocol

_VALID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,249}$")
SCHEME = "gpu://"


class TaskKey(Protocol):
    dag_id: str
    task_id: str
    run_id: str
    map_index: int
    try_number: int


def request_name(key: TaskKey) -> str:
    mapped = f".{key.map_index}" if key.map_index >= 0 else ""
    name = f"{key.dag_id}.{key.task_id}{mapped}.{key.try_number}@{key.run_id}"
    if _VALID.match(name):
        return name
    digest = hashlib.sha256(
        f"{key.dag_id}\0{key.task_id}\0{key.run_id}\0{key.map_index}\0{key.try_number}".encode()
    ).hexdigest()[:32]
    return f"ti-{digest}"


def external_id(parts: Sequence[tuple[str, Sequence[int]]]) -> str:
    """``gpu://node-a/0,1`` for one node; nodes of a gang joined by ``+``."""
    return SCHEME + "+".join(f"{node}/{','.join(str(i) for i in idx)}" for node, idx in parts)


def parse_external_id(value: str | None) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """The (node, indices) parts of an external id, None when it is not one of ours."""
    if not value or not value.startswith(SCHEME):
        return None
    parts = []
    for chunk in value[len(SCHEME):].split("+"):
        node, _, raw = chunk.partition("/")
        parts.append((node, tuple(int(i) for i in raw.split(",") if i)))
    return tuple(parts)
