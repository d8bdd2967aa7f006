"""Static compatibility of requests and nodes, independent of what is free right now.

Terms
-----
part
    What a request needs on one node: ``gpus`` GPUs of ``gpu_milli`` each, ``cpu_milli``
    and ``memory_mib``. A gang of ``nodes=K`` needs K parts on K distinct nodes.
compatible node
    A node whose GPU model is accepted by the request (``gpu_models``, empty = any) with at
    least ``min_gpu_memory_mib`` per GPU. CPU-only requests (``gpus == 0``) accept any node.
transfer seconds
    Moving a request's dataset to a node in another zone takes
    ``size_gib * 1024 / node.bandwidth_mb_s`` seconds; a request without a dataset zone, or
    with an empty dataset, never moves data.

Invariant: :func:`never_fits` looks at whole nodes (all GPUs, any state) because a node that
is down or a GPU that is unhealthy today may come back; only a request that no node of the
fleet could ever hold is refused.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpu_pool.model import Node, Policy, Request


def model_accepts(request: Request, model: str | None, gpu_memory_mib: int) -> bool:
    """Whether GPUs of ``model`` with ``gpu_memory_mib`` each meet the request's constraints."""
    if request.gpus == 0:
        return True
    if model is None:
        return False
    if request.gpu_models and model not in request.gpu_models:
        return False
    return gpu_memory_mib >= request.min_gpu_memory_mib


def node_gpu_memory(node: Node) -> int:
    """Memory of the node's smallest GPU (a node holds one model; be safe if not)."""
    return min((g.memory_mib for g in node.gpus), default=0)


def transfer_seconds(request: Request, node_zone: str, bandwidth_mb_s: float) -> float:
    """Seconds to move the request's dataset to a node of ``node_zone`` (0 if no move)."""
    ds = request.dataset
    if ds is None or ds.zone is None or ds.zone == node_zone or ds.size_gib <= 0:
        return 0.0
    if bandwidth_mb_s <= 0:
        return float("inf")
    return ds.size_gib * 1024.0 / bandwidth_mb_s


def is_cross_zone(request: Request, node_zone: str) -> bool:
    ds = request.dataset
    return ds is not None and ds.zone is not None and ds.zone != node_zone


def _describe_models(request: Request) -> str:
    names = "/".join(sorted(request.gpu_models)) if request.gpu_models else "any-model"
    if request.min_gpu_memory_mib:
        names += f" (>= {request.min_gpu_memory_mib // 1024} GiB)"
    return names


def describe_part(request: Request) -> str:
    """``'4 A100 GPUs'``, ``'0.25 of one T4 GPU'``, ``'2 nodes x 8 any-model GPUs'``."""
    models = _describe_models(request)
    if request.gpus == 0:
        return "no GPU (CPU only)"
    if request.is_share:
        return f"{request.gpu_milli / 1000:g} of one {models} GPU"
    per = f"{request.gpus} {models} GPU{'s' if request.gpus != 1 else ''}"
    return f"{request.nodes} nodes x {per}" if request.is_gang else per


def never_fits(request: Request, nodes: Sequence[Node], policy: Policy | None = None) -> str | None:
    """Why no node (or gang of distinct nodes) of the fleet could ever hold ``request``.

    Returns ``None`` when some set of nodes could hold it once they are empty and healthy;
    otherwise one sentence naming what is missing. ``policy`` is accepted so callers need
    not care which knobs matter; none does today.
    """
    del policy  # no policy knob changes what the hardware can hold
    if not nodes:
        return "the fleet has no nodes"
    models = [n for n in nodes if model_accepts(request, n.gpu_model, node_gpu_memory(n))]
    if not models:
        known = sorted({n.gpu_model for n in nodes if n.gpu_model})
        return (f"needs {_describe_models(request)} GPUs; the fleet has "
                f"{', '.join(known) or 'no GPUs'}")
    enough_gpus = [n for n in models if n.gpu_count >= request.gpus]
    if not enough_gpus:
        largest = max(n.gpu_count for n in models)
        return (f"needs {request.gpus} {_describe_models(request)} GPUs on one node; "
                f"the largest such node has {largest}")
    enough_cpu = [n for n in enough_gpus if n.cpu_milli >= request.cpu_milli]
    if not enough_cpu:
        largest = max(n.cpu_milli for n in enough_gpus)
        return (f"needs {request.cpu_milli / 1000:g} CPU cores on one node with "
                f"{describe_part(request)}; the largest such node has {largest / 1000:g}")
    fitting = [n for n in enough_cpu if n.memory_mib >= request.memory_mib]
    if not fitting:
        largest = max(n.memory_mib for n in enough_cpu)
        return (f"needs {request.memory_mib} MiB RAM on one node with "
                f"{describe_part(request)}; the largest such node has {largest} MiB")
    if len(fitting) < request.nodes:
        return (f"needs {request.nodes} distinct nodes each holding "
                f"{request.gpus} {_describe_models(request)} GPUs; the fleet has {len(fitting)}")
    return None
