"""Critical work preempts preemptible allocations only when it cannot fit otherwise."""

from __future__ import annotations

from engine_checks import check_plan
from engine_factories import make_allocation, make_node, make_request, make_snapshot

from gpu_pool.engine import plan
from gpu_pool.model import PriorityClass

NODE = make_node("a", "A100", 4)
OTHER = make_node("b", "A100", 4)


def _batch(name: str, node, gpus: tuple[int, ...], preemptible: bool = True):
    return make_allocation(name, node, gpus, priority=PriorityClass.BATCH,
                           preemptible=preemptible)


def test_critical_preempts_the_smallest_sufficient_set() -> None:
    allocs = [_batch("big", NODE, (0, 1, 2)), _batch("small", NODE, (3,))]
    snap = make_snapshot([NODE], [make_request("x", 1, priority=PriorityClass.CRITICAL)],
                         allocations=allocs)
    result = plan(snap)
    check_plan(result, snap)
    assert [p.request_name for p in result.preemptions] == ["small"]
    assert result.placement_of("x").assignments[0].gpu_indices == (3,)
    assert "critical request x" in result.preemptions[0].message


def test_no_preemption_when_free_capacity_suffices_or_not_critical() -> None:
    allocs = [_batch("b1", NODE, (0, 1, 2, 3))]
    snap = make_snapshot([NODE, OTHER], [make_request("x", 2, priority=PriorityClass.CRITICAL),
                                         make_request("y", 4, priority=PriorityClass.HIGH)],
                         allocations=allocs)
    result = plan(snap)
    check_plan(result, snap)
    assert result.preemptions == ()
    assert result.placement_of("x") is not None  # fits on the free node


def test_non_preemptible_work_is_never_preempted() -> None:
    allocs = [_batch("keep", NODE, (0, 1, 2, 3), preemptible=False)]
    snap = make_snapshot([NODE], [make_request("x", 1, priority=PriorityClass.CRITICAL)],
                         allocations=allocs)
    result = plan(snap)
    assert result.preemptions == () and result.placement_of("x") is None
