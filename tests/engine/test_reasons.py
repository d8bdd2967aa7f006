"""Every reason code, with its sentence, on a snapshot built to produce it."""

from __future__ import annotations

from datetime import timedelta

import pytest
from engine_factories import (
    NOW,
    make_allocation,
    make_node,
    make_quota,
    make_request,
    make_snapshot,
)

from gpu_pool.engine import plan
from gpu_pool.engine.types import ReasonCode
from gpu_pool.model import NodeState, Policy, PriorityClass

A100_3 = make_node("a", "A100", 4)
BUSY = make_allocation("old", A100_3, (3,))

CASES = [
    ("never fits", [A100_3], [make_request("x", 16)], (), Policy(), (),
     ReasonCode.NEVER_FITS, "never fits: needs 16 any-model GPUs on one node; the largest "
                            "such node has 4"),
    ("data not ready", [A100_3], [make_request("x", 1, ready=False, size_gib=1)], (), Policy(), (),
     ReasonCode.DATA_NOT_READY, "waits for its data: s3://data/x is not ready"),
    ("quota expired", [A100_3], [make_request("x", 1)],
     (make_quota(expires_at=NOW - timedelta(hours=1)),), Policy(), (),
     ReasonCode.QUOTA_EXPIRED, "team ml (training) has quota on these GPUs, but none valid now"),
    ("quota not started", [A100_3], [make_request("x", 1)],
     (make_quota(valid_from=NOW + timedelta(days=1)),), Policy(), (),
     ReasonCode.QUOTA_EXPIRED, "none valid now"),
    ("quota exhausted", [A100_3], [make_request("x", 2)], (make_quota(gpus=2),), Policy(),
     (BUSY,), ReasonCode.QUOTA_EXHAUSTED,
     "team ml training quota on any model exhausted: 1 of 2 GPUs in use; needs 2 GPUs"),
    ("no quota", [A100_3], [make_request("x", 1, team="cv")], (make_quota(),), Policy(), (),
     ReasonCode.QUOTA_EXHAUSTED, "team cv (training) has no quota for 1 any-model GPU"),
    ("data zone", [make_node("b", "A100", 4, zone="far", bandwidth=100.0)],
     [make_request("x", 1, data_zone="z1", size_gib=1000)], (), Policy(), (),
     ReasonCode.DATA_ZONE, "waits for its data's zone z1: moving 1000 GiB to far would take "
                           "2.8 h, over the 1 h limit on a transfer"),
    ("headroom", [A100_3], [make_request("x", 4)], (), Policy(critical_headroom_gpus=2), (),
     ReasonCode.HEADROOM_RESERVED, "2 whole GPUs are held for critical work and only 4 are free"),
    ("capacity", [A100_3], [make_request("x", 4, models=("A100",))], (), Policy(), (BUSY,),
     ReasonCode.WAITING_FOR_CAPACITY, "needs 4 A100 GPUs on one node; largest free block is 3"),
    ("capacity share", [A100_3],
     [make_request("x", 1, milli=800)], (), Policy(),
     tuple(make_allocation(f"o{i}", A100_3, (i,), milli=500) for i in range(4)),
     ReasonCode.WAITING_FOR_CAPACITY,
     "needs 0.8 of one any-model GPU on one node; largest free share is 0.5 of a GPU"),
    ("capacity cpu", [make_node("c", "A100", 4, cpu=8000)],
     [make_request("x", 1, cpu=6000)], (), Policy(),
     (make_allocation("o", make_node("c", "A100", 4), (0,), cpu=4000),),
     ReasonCode.WAITING_FOR_CAPACITY, "needs 1 any-model GPU with 6 CPU cores"),
    # Neither the GPUs nor the cores are free anywhere: both are said, and the block is the
    # largest on any node (it read "largest free block is 0" here, over the nodes with the
    # cores free: none).
    ("capacity gpus and cpu", [make_node("c", "A100", 4, cpu=8000)],
     [make_request("x", 4, cpu=6000)], (), Policy(),
     (make_allocation("o", make_node("c", "A100", 4), (0,), cpu=4000),),
     ReasonCode.WAITING_FOR_CAPACITY,
     "needs 4 any-model GPUs with 6 CPU cores on one node; largest free block is 3, and no "
     "compatible node has the cores free either (at most 4 cores)"),
    ("capacity share and cpu", [make_node("c", "A100", 4, cpu=8000)],
     [make_request("x", 1, milli=800, cpu=6000, memory=300_000)], (), Policy(),
     tuple(make_allocation(f"o{i}", make_node("c", "A100", 4), (i,), milli=500, cpu=1000,
                           memory=60_000) for i in range(4)),
     ReasonCode.WAITING_FOR_CAPACITY,
     "needs 0.8 of one any-model GPU with 6 CPU cores and 300000 MiB RAM on one node; largest "
     "free share is 0.5 of a GPU, and no compatible node has the cores and RAM free "
     "either (at most 4 cores and 284288 MiB)"),
    # Only one node of five can ever hold 8 GPUs: the sentence names it.
    ("few hosts", [make_node("big", "A100", 8), *(make_node(f"s{i}", "A100", 2)
                                                  for i in range(4))],
     [make_request("x", 8)], (), Policy(), (make_allocation("o", make_node("big", "A100", 8),
                                                             (0,)),),
     ReasonCode.WAITING_FOR_CAPACITY,
     "needs 8 any-model GPUs on one node; largest free block is 7; only 1 node of the fleet "
     "can ever hold it (big)"),
    ("down node", [make_node("d", "A100", 4, state=NodeState.DRAINING)],
     [make_request("x", 1)], (), Policy(), (), ReasonCode.WAITING_FOR_CAPACITY,
     "every compatible node is down or draining"),
    ("gang", [A100_3, make_node("e", "A100", 4)], [make_request("x", 4, nodes=2)], (),
     Policy(), (BUSY,), ReasonCode.WAITING_FOR_CAPACITY,
     "needs 2 nodes each with 4 free GPUs (2 nodes x 4 any-model GPUs); 1 has them free"),
    # Judged on the capacity the plan leaves, not on what was free before it: the next
    # cycle starts from there and must say the same.
    ("capacity after the plan", [A100_3],
     [make_request("x", 4, priority=PriorityClass.LOW),
      make_request("y", 2, priority=PriorityClass.HIGH)], (), Policy(), (),
     ReasonCode.WAITING_FOR_CAPACITY, "needs 4 any-model GPUs on one node; largest free block "
                                      "is 2"),
    ("outranked", [A100_3],
     [make_request(n, 4, waited=timedelta(minutes=m)) for n, m in (("a", 30), ("b", 20),
                                                                   ("x", 10))], (), Policy(), (),
     ReasonCode.OUTRANKED, "needs 4 any-model GPUs on one node; largest free block is 0; "
                           "1 request of the same shape and team, ranked ahead of it, waits "
                           "for the same GPUs"),
]


@pytest.mark.parametrize(("nodes", "requests", "quotas", "policy", "allocations", "code",
                          "sentence"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_reason(nodes, requests, quotas, policy, allocations, code, sentence) -> None:
    result = plan(make_snapshot(nodes, requests, quotas=quotas, policy=policy,
                                allocations=allocations))
    reason = result.reason_of("x")
    assert reason is not None, result
    assert reason.code is code
    assert sentence in reason.message


def test_hosts_are_named_only_when_few_of_the_fleet() -> None:
    """Two 8-GPU nodes of three, or four of eight: no host list (most of the fleet, or
    more than FEW_HOSTS); two of eight: both named."""
    def reason(big: int, small: int) -> str:
        nodes = [*(make_node(f"big{i}", "A100", 8) for i in range(big)),
                 *(make_node(f"s{i}", "A100", 2) for i in range(small))]
        held = [make_allocation(f"o{i}", n, (0,)) for i, n in enumerate(nodes[:big])]
        result = plan(make_snapshot(nodes, [make_request("x", 8)], allocations=held))
        found = result.reason_of("x")
        assert found is not None and found.code is ReasonCode.WAITING_FOR_CAPACITY
        return found.message

    assert "can ever hold it" not in reason(2, 1)
    assert "can ever hold it" not in reason(4, 4)
    assert reason(2, 6).endswith("; only 2 nodes of the fleet can ever hold it (big0, big1)")


def test_critical_request_may_use_the_headroom() -> None:
    snap = make_snapshot([A100_3], [make_request("x", 4, priority=PriorityClass.CRITICAL)],
                         policy=Policy(critical_headroom_gpus=2))
    assert plan(snap).placement_of("x") is not None


def _applied(snapshot, result):
    """The snapshot of the next cycle: the plan's placements are now allocations."""
    by_name = {n.name: n for n in snapshot.nodes}
    held = [make_allocation(p.request_name, by_name[a.node], a.gpu_indices, milli=a.gpu_milli)
            for p in result.placements for a in p.assignments]
    placed = {p.request_name for p in result.placements}
    return make_snapshot(snapshot.nodes, [r for r in snapshot.requests if r.name not in placed],
                         allocations=[*snapshot.allocations, *held], policy=snapshot.policy)


def test_a_waiting_reason_stays_the_same_while_nothing_changes() -> None:
    """The demo's sweep: six 2-GPU trials on 4 + 2 + 2 GPUs. The cycle that places three
    and the cycles after it, over the state it left, give every waiting trial one text."""
    nodes = [make_node("a100", "A100", 4), make_node("h100", "H100", 2),
             make_node("t4", "T4", 2)]
    trials = [make_request(f"trial_{i}", 2, waited=timedelta(seconds=60 - i))
              for i in range(6)]
    first = make_snapshot(nodes, [*trials, make_request("hotfix", 1,
                                                        priority=PriorityClass.CRITICAL)])
    placing = plan(first)
    assert len(placing.placements) == 4
    waiting = {r.request_name: (r.code, r.message) for r in placing.pending}
    after = _applied(first, placing)
    for _ in range(2):  # the next heartbeats: nothing placed, nothing changed
        again = plan(after)
        assert again.placements == ()
        assert {r.request_name: (r.code, r.message) for r in again.pending} == waiting
    base = "needs 2 any-model GPUs on one node; largest free block is 1"
    # Which three trials wait is the solver's choice among equals; in rank order (the
    # oldest first) the first waits for capacity, the others behind it say so.
    assert [waiting[name] for name in sorted(waiting)] == [
        (ReasonCode.WAITING_FOR_CAPACITY, base),
        (ReasonCode.OUTRANKED, f"{base}; 1 request of the same shape and team, ranked ahead "
                               "of it, waits for the same GPUs"),
        (ReasonCode.OUTRANKED, f"{base}; 2 requests of the same shape and team, ranked ahead "
                               "of it, wait for the same GPUs")]
