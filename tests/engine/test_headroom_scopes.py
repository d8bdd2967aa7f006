"""Headroom per GPU model and node group: non-critical work never dips into it, on every
path (greedy with FGD, the best-fit chooser of large cycles, the exact model, the class
model), critical work may; the reason names what is kept free."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from engine_checks import check_plan
from engine_factories import (
    make_allocation,
    make_node,
    make_request,
    make_snapshot,
    random_snapshot,
)

from gpu_pool.engine import exact
from gpu_pool.engine.plan import greedy_plan, plan
from gpu_pool.engine.types import ReasonCode
from gpu_pool.model import Headroom, Policy, PriorityClass, Tier

CORE_A100 = Headroom(4, "A100", "core")


def _fleet():
    core = replace(make_node("core-a"), labels={"group": "core"})
    edge = replace(make_node("edge-a"), tier=Tier.EDGE)  # group read from the tier: edge
    h100 = replace(make_node("core-h", "H100"), labels={"group": "core"})
    return [core, edge, h100]


def _paths(monkeypatch, path):
    if path == "class":
        monkeypatch.setattr(exact, "affordable", lambda *a: None)
    return greedy_plan if path == "greedy" else plan


PATHS = ["greedy", "exact", "class"]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("asks, placed, reason", [
    # 8 whole A100 on core, 4 kept: a 4-GPU job fits, a 6-GPU job does not...
    ([("a", 4)], ["a"], None),
    ([("a", 6)], [], "held back: headroom for critical work — 4 A100 GPUs on group core "
                     "are kept free"),
    # ... unless it goes to the edge node (which the headroom does not cover).
    ([("a", 6, "edge")], ["a"], None),
    # Critical work may take the headroom.
    ([("a", 8, "crit")], ["a"], None),
    # Two 3-GPU jobs: the second would leave 2 of the 4.
    ([("a", 3), ("b", 3)], ["a"], "held back: headroom for critical work — 4 A100 GPUs on "
                                  "group core are kept free"),
    # Other models are not covered: H100 free for anyone.
    ([("a", 8, "h100")], ["a"], None),
])
def test_headroom_on_core_a100(monkeypatch, path, asks, placed, reason):
    planner = _paths(monkeypatch, path)
    nodes = _fleet()
    busy = make_allocation("busy", nodes[1], tuple(range(8)))  # edge A100 full
    allocations = []
    reqs = []
    for name, gpus, *kind in asks:
        kind = kind[0] if kind else ""
        models = ("H100",) if kind == "h100" else ("A100",)
        priority = PriorityClass.CRITICAL if kind == "crit" else PriorityClass.NORMAL
        reqs.append(make_request(name, gpus, models=models, priority=priority))
    if not any(len(a) > 2 and a[2] == "edge" for a in asks):
        allocations.append(busy)
    policy = Policy(headroom=(CORE_A100,), solver_time_limit_s=0.05)
    snap = make_snapshot(nodes, reqs, allocations=allocations, policy=policy)
    result = planner(snap)
    check_plan(result, snap)
    assert sorted(p.request_name for p in result.placements) == placed
    if reason is not None:
        waiting = [x for x in result.pending]
        assert waiting and waiting[-1].code is ReasonCode.HEADROOM_RESERVED
        assert waiting[-1].message == reason


@pytest.mark.parametrize("path", PATHS)
def test_gang_counts_all_its_parts_in_one_scope(monkeypatch, path):
    planner = _paths(monkeypatch, path)
    a = replace(make_node("a", gpus=4), labels={"group": "core"})
    b = replace(make_node("b", gpus=4), labels={"group": "core"})
    # 8 whole A100 on core, 4 kept: each 4-GPU part alone fits the budget, both do not.
    snap = make_snapshot([a, b], [make_request("g", 4, nodes=2)],
                         policy=Policy(headroom=(CORE_A100,), solver_time_limit_s=0.05))
    result = planner(snap)
    check_plan(result, snap)
    assert not result.placements
    assert result.reason_of("g").code is ReasonCode.HEADROOM_RESERVED


def test_share_breaking_a_whole_gpu_counts():
    # 4 GPUs, 4 kept: a share may only go on a GPU already in use.
    node = replace(make_node("a", gpus=4), labels={"group": "core"})
    used = make_allocation("old", node, (3,), milli=500)
    reqs = [make_request("s1", 1, milli=250), make_request("s2", 1, milli=500)]
    policy = Policy(headroom=(Headroom(3, "A100", "core"),), solver_time_limit_s=0.05)
    snap = make_snapshot([node], reqs, allocations=[used], policy=policy)
    result = plan(snap)
    check_plan(result, snap)
    # The quarter first (age order) would take GPU 3 and leave the half nowhere; larger
    # first places more, so it wins: the half fills GPU 3, the quarter would break a
    # whole GPU (3 kept of 3).
    assert [p.request_name for p in result.placements] == ["s2"]
    assert result.placement_of("s2").assignments[0].gpu_indices == (3,)
    assert result.reason_of("s1").code is ReasonCode.HEADROOM_RESERVED


def test_large_cycle_best_fit_chooser_keeps_the_headroom():
    """Over 200 decisions: the best-fit chooser (no FGD) decides."""
    nodes = [replace(make_node(f"c{i}"), labels={"group": "core"}) for i in range(3)]
    nodes += [make_node(f"t{i}", "T4", 4) for i in range(2)]
    reqs = [make_request(f"r{i}", 1 + i % 3) for i in range(260)]
    reqs += [make_request(f"s{i}", 1, milli=500) for i in range(20)]
    reqs += [make_request(f"g{i}", 2, nodes=2) for i in range(5)]
    policy = Policy(headroom=(Headroom(5, "A100", "core"), Headroom(2, "T4")),
                    solver_time_limit_s=0.05)
    snap = make_snapshot(nodes, reqs, policy=policy)
    for planner in (greedy_plan, plan):
        result = planner(snap)
        check_plan(result, snap)
        gpus = sum(len(a.gpu_indices) for p in result.placements for a in p.assignments
                   if a.node.startswith("c") and a.gpu_milli == 1000)
        assert gpus <= 24 - 5


@pytest.mark.parametrize("seed", range(12))
def test_random_headroom_never_dipped(seed):
    rng = random.Random(seed)
    snap = random_snapshot(rng, nodes=8, requests=30, max_gpus=8, extras=True)
    policy = replace(snap.policy, headroom=(Headroom(rng.randint(1, 6), "A100"),
                                            Headroom(rng.randint(1, 4), None, "core")),
                     solver_time_limit_s=0.05)
    snap = replace(snap, policy=policy)
    for planner in (greedy_plan, plan):
        check_plan(planner(snap), snap)


def test_no_headroom_keeps_the_fleet_wide_reason():
    node = make_node("a", gpus=4)
    snap = make_snapshot([node], [make_request("x", 3)],
                         policy=Policy(critical_headroom_gpus=2))
    reason = plan(snap).reason_of("x")
    assert reason.code is ReasonCode.HEADROOM_RESERVED
    assert reason.message == ("2 whole GPUs are held for critical work and only 4 are free")
