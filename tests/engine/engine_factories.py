"""Factories for engine tests: nodes, requests, quotas, allocations and snapshots."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpu_pool.engine.types import Snapshot
from gpu_pool.model import (
    Allocation,
    Dataset,
    Gpu,
    Node,
    NodeState,
    Policy,
    PriorityClass,
    Purpose,
    Quota,
    Request,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MEM = {"A100": 80 * 1024, "H100": 80 * 1024, "L4": 24 * 1024, "T4": 16 * 1024,
       "V100": 32 * 1024}


def make_node(name: str, model: str = "A100", gpus: int = 8, *, cpu: int = 64_000,
              memory: int = 512 * 1024, zone: str = "z1", state: NodeState = NodeState.UP,
              unhealthy: tuple[int, ...] = (), bandwidth: float = 1000.0) -> Node:
    return Node(name, tuple(Gpu(i, model, MEM[model], healthy=i not in unhealthy)
                            for i in range(gpus)), cpu, memory, zone=zone, state=state,
                bandwidth_mb_s=bandwidth)


def make_request(name: str, gpus: int = 1, *, milli: int = 1000, nodes: int = 1,
                 team: str = "ml", purpose: Purpose = Purpose.TRAINING,
                 priority: PriorityClass = PriorityClass.NORMAL,
                 models: tuple[str, ...] = (), min_memory: int = 0, cpu: int = 0,
                 memory: int = 0, data_zone: str | None = None, size_gib: float = 0.0,
                 ready: bool = True, preemptible: bool = False,
                 waited: timedelta = timedelta(0)) -> Request:
    ds = Dataset(f"s3://data/{name}", data_zone, size_gib) if data_zone or size_gib else None
    return Request(name, team, purpose, priority, gpus=gpus, gpu_milli=milli, nodes=nodes,
                   gpu_models=frozenset(models), min_gpu_memory_mib=min_memory,
                   cpu_milli=cpu, memory_mib=memory, dataset=ds, data_ready=ready,
                   preemptible=preemptible, submitted_at=NOW - waited)


def make_quota(team: str = "ml", gpus: float = 8, *, purpose: Purpose = Purpose.TRAINING,
               model: str | None = None, borrow: float = 0.0,
               valid_from: datetime = NOW - timedelta(days=1),
               expires_at: datetime = NOW + timedelta(days=30)) -> Quota:
    return Quota(team, purpose, gpus, valid_from, expires_at, gpu_model=model,
                 borrow_limit_gpus=borrow)


def make_allocation(request: str, node: Node, indices: tuple[int, ...], *, milli: int = 1000,
                    team: str = "ml", purpose: Purpose = Purpose.TRAINING,
                    priority: PriorityClass = PriorityClass.NORMAL, cpu: int = 0,
                    memory: int = 0, preemptible: bool = False) -> Allocation:
    return Allocation(request, node.name, indices, milli, cpu, memory, team, purpose, priority,
                      node.gpu_model, NOW - timedelta(hours=1), preemptible=preemptible,
                      id=f"alloc-{request}-{node.name}")


def make_snapshot(nodes, requests, *, allocations=(), quotas=(), policy: Policy | None = None,
                  now: datetime = NOW, mix=()) -> Snapshot:
    return Snapshot(tuple(nodes), tuple(allocations), tuple(requests), tuple(quotas),
                    policy or Policy(), now, tuple(mix))
