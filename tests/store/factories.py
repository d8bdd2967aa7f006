"""Test data for the store suite: nodes, teams, quotas, requests and plans in one line each."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from gpu_pool.engine.types import NodeAssignment, PendingReason, Placement, Plan, ReasonCode
from gpu_pool.model import Gpu, Node, Purpose, Quota, Request, Team
from gpu_pool.store import Store

MEMORY = {"A100": 80 * 1024, "T4": 16 * 1024, "H100": 80 * 1024, "L4": 24 * 1024}


def make_node(name: str = "n1", gpus: int = 4, model: str = "A100", *, zone: str = "z1",
              cpu_milli: int = 64_000, memory_mib: int = 512 * 1024, **kw: object) -> Node:
    return Node(name=name, gpus=tuple(Gpu(i, model, MEMORY.get(model, 32 * 1024))
                                      for i in range(gpus)),
                cpu_milli=cpu_milli, memory_mib=memory_mib, zone=zone, **kw)


def make_request(name: str = "r1", team: str = "nlp", **kw: object) -> Request:
    return Request(name=name, team=team, **kw)


def make_quota(team: str = "nlp", gpus: float = 8, *, start: datetime, days: int = 30,
               purpose: Purpose = Purpose.TRAINING, **kw: object) -> Quota:
    return Quota(team=team, purpose=purpose, gpus=gpus, valid_from=start,
                 expires_at=start + timedelta(days=days), **kw)


def seed(store: Store, *, nodes: Iterable[Node] = (), teams: Iterable[str] = ("nlp", "vision"),
         actor: str = "test") -> None:
    for t in teams:
        store.upsert_team(Team(t), actor)
    nodes = list(nodes) or [make_node("n1"), make_node("n2", 2, "T4", zone="z2")]
    store.import_nodes(nodes, actor)


def part(node: str, indices: Iterable[int], milli: int = 1000, cpu: int = 0,
         mem: int = 0) -> NodeAssignment:
    return NodeAssignment(node=node, gpu_indices=tuple(indices), gpu_milli=milli, cpu_milli=cpu,
                          memory_mib=mem)


def plan_of(*placements: tuple[str, list[NodeAssignment]], pending: Iterable[
        tuple[str, ReasonCode, str]] = (), preemptions: Iterable = ()) -> Plan:
    return Plan(placements=tuple(Placement(name, tuple(parts)) for name, parts in placements),
                pending=tuple(PendingReason(n, c, m) for n, c, m in pending),
                preemptions=tuple(preemptions))


def submit(store: Store, name: str, now: datetime, team: str = "nlp", **kw: object) -> Request:
    return store.submit_request(make_request(name, team, **kw), actor="test", now=now)


def place(store: Store, name: str, node: str, indices: Iterable[int], now: datetime,
          milli: int = 1000, **kw: object):  # noqa: ANN201 - ApplyResult
    return store.apply_plan(plan_of((name, [part(node, indices, milli, **kw)])), now=now,
                            actor="test")

