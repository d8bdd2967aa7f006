"""One side of the race test, run in its own OS process with its own connections.

Each round both processes wait at a barrier, then apply a plan that places their own
request on the same GPUs of that round's node; the result goes back on a queue.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from gpu_pool.engine.types import NodeAssignment, Placement, Plan
from gpu_pool.store import Store


def round_shape(round_no: int) -> tuple[tuple[int, ...], int, bool]:
    """(GPU indices, milli per GPU, take the advisory lock) of a round, cycling through all
    four mixes: whole GPUs or 600-milli shares (two cannot share one GPU), with the apply
    lock (how schedulers run) or without it (the database guard alone)."""
    indices, milli = ((0, 1), 1000) if round_no % 2 == 0 else ((0,), 600)
    return indices, milli, (round_no // 2) % 2 == 0


def round_plan(side: str, round_no: int) -> Plan:
    indices, milli, _ = round_shape(round_no)
    node = f"race-{round_no}"
    return Plan(placements=(Placement(f"r{round_no}-{side}",
                                      (NodeAssignment(node, indices, milli, 0, 0),)),),
                pending=())


def run(url: str, side: str, rounds: int, barrier: Any, out: Any) -> None:
    store = Store.from_url(url)
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    try:
        for round_no in range(rounds):
            store.serialize_apply = round_shape(round_no)[2]
            barrier.wait(timeout=60)
            result = store.apply_plan(round_plan(side, round_no), now, f"scheduler-{side}")
            out.put((round_no, side, list(result.placed), dict(result.dropped)))
    except Exception as error:  # report, so the parent fails with the cause, not a hang
        out.put((-1, side, [], {"error": repr(error)}))
        raise
    finally:
        store.close()
