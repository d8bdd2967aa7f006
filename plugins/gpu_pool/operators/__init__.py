"""Operators of gpu-pool: :class:`~gpu_pool.operators.gpu_ssh.GpuSSHOperator`.

``from gpu_pool.operators import GpuSSHOperator`` is the import for DAG authors.
"""

from __future__ import annotations

from gpu_pool.operators.gpu_ssh import GpuRemoteJobFailed, GpuSSHOperator

__all__ = ["GpuRemoteJobFailed", "GpuSSHOperator"]
