"""Checks the store makes itself on objects built by code rather than parsed by ``spec``.

:mod:`gpu_pool.spec` validates what users type. Callers that build domain objects in code
(the executor, the simulator, the maintenance DAGs) reach the store directly; these checks
give them the same kind of :class:`~gpu_pool.errors.SpecError` — field, value, what is
valid — instead of a database constraint message. The database's CHECKs stay as the
backstop.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import Any, TypeVar

from gpu_pool.errors import SpecError
from gpu_pool.model import MILLI_PER_GPU, Node, Quota, Request

E = TypeVar("E", bound=enum.Enum)


def enum_value(value: Any, kind: type[E], field: str) -> E:
    try:
        return kind(value)
    except ValueError:
        raise SpecError(field, value, "one of " + ", ".join(str(m.value) for m in kind)) from None


def _non_negative(value: Any, field: str, what: str = "a number, 0 or more") -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(
            value) or value < 0:
        raise SpecError(field, value, what)


def check_node(node: Node) -> None:
    where = f"node {node.name!r}"
    for field in ("cpu_milli", "memory_mib"):
        value = getattr(node, field)
        if not isinstance(value, int) or value < 0:
            raise SpecError(field, value, "a whole number, 0 or more", where=where)
    _non_negative(node.bandwidth_mb_s, "bandwidth_mb_s")
    indices = [g.index for g in node.gpus]
    if len(set(indices)) != len(indices) or any(i < 0 for i in indices):
        raise SpecError("gpus", indices, "distinct GPU indices 0, 1, 2, ...", where=where)
    for gpu in node.gpus:
        if not isinstance(gpu.memory_mib, int) or gpu.memory_mib < 0:
            raise SpecError("gpu memory", gpu.memory_mib, "MiB, 0 or more", where=where)


def check_request(request: Request) -> None:
    if not isinstance(request.gpus, int) or request.gpus < 0:
        raise SpecError("gpus", request.gpus, "a whole number of GPUs, 0 or more")
    if not isinstance(request.gpu_milli, int) or not 1 <= request.gpu_milli <= MILLI_PER_GPU:
        raise SpecError("gpu_share", request.gpu_milli, "thousandths of one GPU, 1..1000")
    if request.gpu_milli < MILLI_PER_GPU and (request.gpus != 1 or request.nodes != 1):
        raise SpecError("gpu_share", request.gpu_milli,
                        "a share only for a request of 1 GPU on 1 node")
    if not isinstance(request.nodes, int) or request.nodes < 1:
        raise SpecError("nodes", request.nodes, "a whole number of nodes, 1 or more")
    for field in ("cpu_milli", "memory_mib", "min_gpu_memory_mib"):
        value = getattr(request, field)
        if not isinstance(value, int) or value < 0:
            raise SpecError(field, value, "a whole number, 0 or more")
    if request.time_limit is not None and request.time_limit.total_seconds() <= 0:
        raise SpecError("time_limit", str(request.time_limit), "a positive duration like 6h")


def check_quota(quota: Quota) -> None:
    _non_negative(quota.gpus, "gpus")
    _non_negative(quota.borrow_limit_gpus, "borrow_limit_gpus")
    if quota.gpu_hour_budget is not None:
        _non_negative(quota.gpu_hour_budget, "gpu_hour_budget")
    if quota.expires_at <= quota.valid_from:
        raise SpecError("expires_at", quota.expires_at.isoformat(),
                        f"a time after valid_from ({quota.valid_from.isoformat()})")


def check_reading(node: str, index: Any, utilization: Any, memory_used: Any,
                  known: Iterable[int]) -> None:
    known = sorted(known)
    if index not in known:
        raise SpecError("index", index, f"a GPU index of node {node!r}: "
                        f"{', '.join(map(str, known)) or 'it has no GPUs'}")
    if utilization is not None and (not isinstance(utilization, int | float)
                                    or not 0 <= utilization <= 100):
        raise SpecError("utilization_pct", utilization, "a percentage 0..100, or none")
    if memory_used is not None and (not isinstance(memory_used, int) or memory_used < 0):
        raise SpecError("memory_used_mib", memory_used, "a whole number of MiB, 0 or more")
