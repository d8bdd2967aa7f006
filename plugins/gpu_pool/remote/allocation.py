"""How the executor tells a GPU task process where it runs: ``GPU_POOL_*`` variables.

The contract between ``GpuPoolExecutor`` and :class:`~gpu_pool.operators.GpuSSHOperator`:
when the executor starts the Airflow task process of a placed workload, it adds
``TaskAllocation(...).to_env()`` to that process's environment. The operator reads it back
with :meth:`TaskAllocation.from_env` and starts the command on the node(s).

Variables (the JSON one is authoritative; the flat ones describe rank 0 for people and for
single-node tools):

=============================  ==========================================================
``GPU_POOL_TASK_ALLOCATION``   JSON ``{"request": ..., "slots": [{"node", "ssh_conn_id",
                               "gpu_indices", "gpu_milli", "allocation_id"}, ...]}``, one
                               slot per node of a gang, in rank order
``GPU_POOL_REQUEST``           the request name
``GPU_POOL_NODE``              node of rank 0
``GPU_POOL_SSH_CONN_ID``       its Airflow SSH connection id
``GPU_POOL_GPU_INDICES``       its GPU indices, ``"0,1"``
``GPU_POOL_GPU_MILLI``         thousandths of each GPU (``1000`` whole, less for a share)
``GPU_POOL_ALLOCATION_ID``     its allocation id in the store
=============================  ==========================================================

Without the JSON variable, :meth:`TaskAllocation.from_env` builds a one-node allocation
from the flat ones (handy for running a task by hand).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_pool.errors import SpecError
from gpu_pool.model import Allocation
from gpu_pool.remote.job import JobPlacement

ENV_JSON = "GPU_POOL_TASK_ALLOCATION"


@dataclass(frozen=True)
class NodeSlot:
    """The part of an allocation on one node."""

    node: str
    ssh_conn_id: str
    gpu_indices: tuple[int, ...]
    gpu_milli: int = 1000
    allocation_id: str | None = None


@dataclass(frozen=True)
class TaskAllocation:
    request: str
    slots: tuple[NodeSlot, ...]

    def __post_init__(self) -> None:
        if not self.slots:
            raise SpecError("slots", self.slots, "at least one node slot")

    @classmethod
    def from_model(cls, request: str, allocations: Sequence[Allocation],
                   ssh_conn_ids: Mapping[str, str]) -> TaskAllocation:
        """From the store's allocations of one request (a gang: one per node, rank order)."""
        slots = []
        for a in allocations:
            if a.node not in ssh_conn_ids:
                raise SpecError("ssh_conn_id", None, f"an SSH connection id for node {a.node!r}")
            slots.append(NodeSlot(a.node, ssh_conn_ids[a.node], tuple(a.gpu_indices),
                                  a.gpu_milli, a.id))
        return cls(request, tuple(slots))

    @property
    def external_id(self) -> str:
        """``gpu://node-a/0,1`` (gangs: ``gpu://node-a/0,1+node-b/0,1``)."""
        return "gpu://" + "+".join(
            f"{s.node}/{','.join(map(str, s.gpu_indices))}"
            + (f"@{s.gpu_milli}m" if s.gpu_milli < 1000 else "") for s in self.slots)

    def placements(self) -> list[JobPlacement]:
        nodes = tuple(s.node for s in self.slots)
        return [JobPlacement(node=s.node, gpu_indices=s.gpu_indices, request=self.request,
                             gpu_milli=s.gpu_milli, allocation_id=s.allocation_id,
                             node_rank=rank, node_count=len(self.slots), nodes=nodes)
                for rank, s in enumerate(self.slots)]

    def to_env(self) -> dict[str, str]:
        first = self.slots[0]
        doc = {"request": self.request, "slots": [
            {"node": s.node, "ssh_conn_id": s.ssh_conn_id, "gpu_indices": list(s.gpu_indices),
             "gpu_milli": s.gpu_milli, "allocation_id": s.allocation_id} for s in self.slots]}
        return {
            ENV_JSON: json.dumps(doc, separators=(",", ":")),
            "GPU_POOL_REQUEST": self.request,
            "GPU_POOL_NODE": first.node,
            "GPU_POOL_SSH_CONN_ID": first.ssh_conn_id,
            "GPU_POOL_GPU_INDICES": ",".join(map(str, first.gpu_indices)),
            "GPU_POOL_GPU_MILLI": str(first.gpu_milli),
            "GPU_POOL_ALLOCATION_ID": first.allocation_id or "",
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TaskAllocation | None:
        """The allocation the executor passed, or ``None`` when there is none."""
        if environ.get(ENV_JSON):
            try:
                doc = json.loads(environ[ENV_JSON])
                return cls(str(doc["request"]), tuple(
                    NodeSlot(str(s["node"]), str(s["ssh_conn_id"]),
                             _indices(s["gpu_indices"]), int(s.get("gpu_milli", 1000)),
                             s.get("allocation_id")) for s in doc["slots"]))
            except (ValueError, KeyError, TypeError) as error:
                raise SpecError(ENV_JSON, environ[ENV_JSON][:200],
                                f"the JSON document the executor writes ({error})") from None
        if not environ.get("GPU_POOL_NODE"):
            return None
        for name in ("GPU_POOL_SSH_CONN_ID", "GPU_POOL_GPU_INDICES"):
            if not environ.get(name):
                raise SpecError(name, environ.get(name), "set together with GPU_POOL_NODE")
        return cls(environ.get("GPU_POOL_REQUEST", ""), (NodeSlot(
            environ["GPU_POOL_NODE"], environ["GPU_POOL_SSH_CONN_ID"],
            _indices(environ["GPU_POOL_GPU_INDICES"]),
            int(environ.get("GPU_POOL_GPU_MILLI") or 1000),
            environ.get("GPU_POOL_ALLOCATION_ID") or None),))


def _indices(value: Any) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else value
    try:
        indices = tuple(int(i) for i in items)
    except (TypeError, ValueError):
        raise SpecError("gpu_indices", value, "GPU indices like '0,1'") from None
    if not indices or any(i < 0 for i in indices):
        raise SpecError("gpu_indices", value, "GPU indices like '0,1'")
    return indices
