"""never_fits: refuse at submission what no node or gang of the fleet could ever hold."""

from __future__ import annotations

import pytest
from engine_factories import make_node, make_request

from gpu_pool.engine import never_fits
from gpu_pool.model import NodeState

FLEET = [make_node("a", "A100", 8, cpu=32_000), make_node("b", "A100", 4),
         make_node("t", "T4", 4, state=NodeState.DOWN)]


@pytest.mark.parametrize(("request_", "expected"), [
    (make_request("ok", 8, models=("A100",)), None),
    (make_request("down-ok", 4, models=("T4",)), None),  # down today, may come back
    (make_request("gang-ok", 4, nodes=2, models=("A100",)), None),
    (make_request("m", 1, models=("H100",)), "needs H100 GPUs; the fleet has A100, T4"),
    (make_request("g", 9), "needs 9 any-model GPUs on one node; the largest such node has 8"),
    (make_request("mem", 1, min_memory=100 * 1024), "the fleet has A100, T4"),
    (make_request("cpu", 8, cpu=48_000),
     "needs 48 CPU cores on one node with 8 any-model GPUs; the largest such node has 32"),
    (make_request("ram", 1, memory=10**7), "needs 10000000 MiB RAM on one node"),
    (make_request("gang", 8, nodes=2, models=("A100",)),
     "needs 2 distinct nodes each holding 8 A100 GPUs; the fleet has 1"),
])
def test_never_fits_table(request_, expected) -> None:
    got = never_fits(request_, FLEET)
    if expected is None:
        assert got is None
    else:
        assert got is not None and expected in got


def test_empty_fleet() -> None:
    assert never_fits(make_request("x"), []) == "the fleet has no nodes"
