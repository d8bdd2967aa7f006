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
from datetime import timedelta
from typing import Any, TypeVar

from gpu_pool import limits
from gpu_pool.errors import SpecError
from gpu_pool.model import MILLI_PER_GPU, Node, Quota, Request

E = TypeVar("E", bound=enum.Enum)


def enum_value(value: Any, kind: type[E], field: str) -> E:
    try:
        return kind(value)
    except ValueError:
        raise SpecError(field, value, "one of " + ", ".join(str(m.value) for m in kind)) from None


def _non_negative(value: Any, field: str, top: float, where: str | None = None) -> None:
    if not isinstance(value, int | float) or isinstance(value, bool) or not (
            isinstance(value, int) or math.isfinite(value)) or not 0 <= value <= top:
        raise SpecError(field, value, f"a number from 0 to {top:,.10g}", where=where)


def _whole(value: Any, field: str, top: int, where: str | None = None) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= top:
        raise SpecError(field, value, f"a whole number from 0 to {top:,}", where=where)


def check_node(node: Node) -> None:
    where = f"node {node.name!r}"
    _whole(node.cpu_milli, "cpu_milli", limits.MAX_CPU_CORES * 1000, where)
    _whole(node.memory_mib, "memory_mib", limits.MAX_MEMORY_MIB, where)
    _non_negative(node.bandwidth_mb_s, "bandwidth_mb_s", limits.MAX_BANDWIDTH_MB_S, where)
    indices = [g.index for g in node.gpus]
    if len(set(indices)) != len(indices) or any(i < 0 for i in indices) \
            or len(indices) > limits.MAX_GPUS_PER_NODE:
        raise SpecError("gpus", indices, "distinct GPU indices 0, 1, 2, ... (at most "
                        f"{limits.MAX_GPUS_PER_NODE})", where=where)
    for gpu in node.gpus:
        _whole(gpu.memory_mib, "gpu memory", limits.MAX_MEMORY_MIB, where)


def check_request(request: Request) -> None:
    if not isinstance(request.gpus, int) or request.gpus < 0:
        raise SpecError("gpus", request.gpus, "a whole number of GPUs, 0 or more")
    if not isinstance(request.gpu_milli, int) or not 1 <= request.gpu_milli <= MILLI_PER_GPU:
        raise SpecError("gpu_share", request.gpu_milli, "thousandths of one GPU, 1..1000")
    if request.gpu_milli < MILLI_PER_GPU and (request.gpus != 1 or request.nodes != 1):
        raise SpecError("gpu_share", request.gpu_milli,
                        "a share only for a request of 1 GPU on 1 node")
    if not isinstance(request.nodes, int) or not 1 <= request.nodes <= limits.MAX_GANG_NODES:
        raise SpecError("nodes", request.nodes,
                        f"a whole number of nodes from 1 to {limits.MAX_GANG_NODES}")
    if request.gpus > limits.MAX_GPUS_PER_NODE:
        raise SpecError("gpus", request.gpus, f"at most {limits.MAX_GPUS_PER_NODE} per node")
    _whole(request.cpu_milli, "cpu_milli", limits.MAX_CPU_CORES * 1000)
    _whole(request.memory_mib, "memory_mib", limits.MAX_MEMORY_MIB)
    _whole(request.min_gpu_memory_mib, "min_gpu_memory_mib", limits.MAX_MEMORY_MIB)
    for field in ("time_limit", "estimated_runtime"):
        value = getattr(request, field)
        if value is not None and not timedelta(0) < value <= limits.MAX_DURATION:
            raise SpecError(field, str(value), "a positive duration like 6h, at most "
                            f"{limits.MAX_DURATION.days} days")
    if request.dataset is not None:
        _non_negative(request.dataset.size_gib, "dataset_size_gib", limits.MAX_DATASET_GIB)
    grace = request.grace
    if grace is not None and (not isinstance(grace, timedelta)
                              or not timedelta(0) <= grace <= limits.MAX_DURATION):
        raise SpecError("grace", str(grace), "a duration like 2m, 0 or more, at most "
                        f"{limits.MAX_DURATION.days} days")


def check_quota(quota: Quota) -> None:
    _non_negative(quota.gpus, "gpus", limits.MAX_QUOTA_GPUS)
    _non_negative(quota.borrow_limit_gpus, "borrow_limit_gpus", limits.MAX_QUOTA_GPUS)
    if quota.gpu_hour_budget is not None:
        _non_negative(quota.gpu_hour_budget, "gpu_hour_budget", limits.MAX_GPU_HOURS)
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
