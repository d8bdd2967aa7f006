"""The environment a GPU task process receives from the executor.

The executor starts each placed task with these variables set; the operator
(:mod:`gpu_pool.operators`) reads them at run time and exports ``CUDA_VISIBLE_DEVICES``
inside the remote command (sshd drops SSH env requests).

``GPU_POOL_NODE``           the node the task was placed on (a gang: the first node)
``GPU_POOL_NODES``          all nodes of the placement, comma separated
``GPU_POOL_GPU_INDICES``    GPU indices on ``GPU_POOL_NODE``, comma separated ("0,1")
``GPU_POOL_GPU_MILLI``      thousandths of each GPU held (1000 = whole GPUs)
``GPU_POOL_SSH_CONN_ID``    the Airflow SSH connection id of ``GPU_POOL_NODE``
``GPU_POOL_ALLOCATION_ID``  the store id of the allocation on ``GPU_POOL_NODE``
``GPU_POOL_REQUEST``        the store request name
``CUDA_VISIBLE_DEVICES``    same as ``GPU_POOL_GPU_INDICES`` (for work run in the task process)
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

NODE = "GPU_POOL_NODE"
NODES = "GPU_POOL_NODES"
GPU_INDICES = "GPU_POOL_GPU_INDICES"
GPU_MILLI = "GPU_POOL_GPU_MILLI"
SSH_CONN_ID = "GPU_POOL_SSH_CONN_ID"
ALLOCATION_ID = "GPU_POOL_ALLOCATION_ID"
REQUEST = "GPU_POOL_REQUEST"
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class TaskAllocation:
    """What one task process holds, as the executor told it."""

    request: str
    node: str
    nodes: tuple[str, ...]
    gpu_indices: tuple[int, ...]
    gpu_milli: int
    ssh_conn_id: str | None
    allocation_id: str | None

    def to_env(self) -> dict[str, str]:
        indices = ",".join(str(i) for i in self.gpu_indices)
        env = {
            REQUEST: self.request,
            NODE: self.node,
            NODES: ",".join(self.nodes),
            GPU_INDICES: indices,
            GPU_MILLI: str(self.gpu_milli),
            CUDA_VISIBLE_DEVICES: indices,
        }
        if self.ssh_conn_id:
            env[SSH_CONN_ID] = self.ssh_conn_id
        if self.allocation_id:
            env[ALLOCATION_ID] = self.allocation_id
        return env

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TaskAllocation | None:
        """The allocation of the current process, None when it was not started by the executor."""
        environ = os.environ if environ is None else environ
        if NODE not in environ:
            return None
        raw = environ.get(GPU_INDICES, "")
        return cls(
            request=environ.get(REQUEST, ""),
            node=environ[NODE],
            nodes=tuple(n for n in environ.get(NODES, environ[NODE]).split(",") if n),
            gpu_indices=tuple(int(i) for i in raw.split(",") if i.strip()),
            gpu_milli=int(environ.get(GPU_MILLI, "1000")),
            ssh_conn_id=environ.get(SSH_CONN_ID) or None,
            allocation_id=environ.get(ALLOCATION_ID) or None,
        )
