"""Where a GPU task's command runs: the allocation as the operator reads it from its env.

The executor starts the Airflow task process of a placed workload with
``RemoteAllocation(...).to_env()`` added to its environment: the flat ``GPU_POOL_*``
variables (``GPU_POOL_REQUEST``, ``GPU_POOL_NODE``, ``GPU_POOL_NODES``,
``GPU_POOL_SSH_CONN_ID``, ``GPU_POOL_GPU_INDICES``, ``GPU_POOL_GPU_MILLI``,
``GPU_POOL_ALLOCATION_ID``, and ``CUDA_VISIBLE_DEVICES``) describe rank 0;
:meth:`RemoteAllocation.from_env` reads exactly those for a one-node placement (handy for
running a task by hand too).

A gang needs, per node, the SSH connection id and GPU indices, which the flat variables
carry only for the first node. For that the executor adds ``GPU_POOL_TASK_ALLOCATION``
(:meth:`RemoteAllocation.to_env` writes it): JSON ``{"request": ..., "slots": [{"node",
"ssh_conn_id", "gpu_indices", "gpu_milli", "allocation_id"}, ...]}``, one slot per node in
rank order. When present it is authoritative. A gang placement without it is refused with
a clear error rather than run on the first node only.

``GPU_POOL_PREEMPTED`` counts how many times the request (this try of the task) was
preempted before; the operator passes it on to the remote command, with
``GPU_POOL_CHECKPOINT_DIR`` (see :func:`gpu_pool.remote.job.checkpoint_dir`).
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
class RemoteAllocation:
    request: str
    slots: tuple[NodeSlot, ...]
    preemptions: int = 0  # times this request was preempted before (``GPU_POOL_PREEMPTED``)

    def __post_init__(self) -> None:
        if not self.slots:
            raise SpecError("slots", self.slots, "at least one node slot")

    @classmethod
    def from_model(cls, request: str, allocations: Sequence[Allocation],
                   ssh_conn_ids: Mapping[str, str], preemptions: int = 0) -> RemoteAllocation:
        """From the store's allocations of one request (a gang: one per node, rank order)."""
        slots = []
        for a in allocations:
            if a.node not in ssh_conn_ids:
                raise SpecError("ssh_conn_id", None, f"an SSH connection id for node {a.node!r}")
            slots.append(NodeSlot(a.node, ssh_conn_ids[a.node], tuple(a.gpu_indices),
                                  a.gpu_milli, a.id))
        return cls(request, tuple(slots), preemptions)

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
                             node_rank=rank, node_count=len(self.slots), nodes=nodes,
                             preemptions=self.preemptions)
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
            "GPU_POOL_NODES": ",".join(s.node for s in self.slots),
            "CUDA_VISIBLE_DEVICES": ",".join(map(str, first.gpu_indices)),
            "GPU_POOL_SSH_CONN_ID": first.ssh_conn_id,
            "GPU_POOL_GPU_INDICES": ",".join(map(str, first.gpu_indices)),
            "GPU_POOL_GPU_MILLI": str(first.gpu_milli),
            "GPU_POOL_ALLOCATION_ID": first.allocation_id or "",
            "GPU_POOL_PREEMPTED": str(self.preemptions),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> RemoteAllocation | None:
        """The allocation the executor passed, or ``None`` when there is none."""
        if environ.get(ENV_JSON):
            try:
                doc = json.loads(environ[ENV_JSON])
                return cls(str(doc["request"]), tuple(
                    NodeSlot(str(s["node"]), str(s["ssh_conn_id"]),
                             _indices(s["gpu_indices"]), int(s.get("gpu_milli", 1000)),
                             s.get("allocation_id")) for s in doc["slots"]),
                    _count(environ.get("GPU_POOL_PREEMPTED")))
            except (ValueError, KeyError, TypeError) as error:
                raise SpecError(ENV_JSON, environ[ENV_JSON][:200],
                                f"the JSON document the executor writes ({error})") from None
        if not environ.get("GPU_POOL_NODE"):
            return None
        if len([n for n in environ.get("GPU_POOL_NODES", "").split(",") if n]) > 1:
            raise SpecError(ENV_JSON, None, "the per-node slots of a gang placement "
                            f"(GPU_POOL_NODES={environ['GPU_POOL_NODES']!r} names several nodes)")
        for name in ("GPU_POOL_SSH_CONN_ID", "GPU_POOL_GPU_INDICES"):
            if not environ.get(name):
                raise SpecError(name, environ.get(name), "set together with GPU_POOL_NODE")
        return cls(environ.get("GPU_POOL_REQUEST", ""), (NodeSlot(
            environ["GPU_POOL_NODE"], environ["GPU_POOL_SSH_CONN_ID"],
            _indices(environ["GPU_POOL_GPU_INDICES"]),
            int(environ.get("GPU_POOL_GPU_MILLI") or 1000),
            environ.get("GPU_POOL_ALLOCATION_ID") or None),),
            _count(environ.get("GPU_POOL_PREEMPTED")))


def _count(value: str | None) -> int:
    if not value:
        return 0
    if not value.isdigit():
        raise SpecError("GPU_POOL_PREEMPTED", value, "a count of 0 or more")
    return int(value)


def _indices(value: Any) -> tuple[int, ...]:
    items = value.split(",") if isinstance(value, str) else value
    try:
        indices = tuple(int(i) for i in items)
    except (TypeError, ValueError):
        raise SpecError("gpu_indices", value, "GPU indices like '0,1'") from None
    if not indices or any(i < 0 for i in indices):
        raise SpecError("gpu_indices", value, "GPU indices like '0,1'")
    return indices
