"""Two schedulers race for the same GPUs: exactly one wins every round.

Two OS processes (forked, each with its own engine and connections) apply, at the same
moment, plans that place different requests on the same GPUs — whole GPUs or shares, with
the advisory lock (how schedulers run) or without it (proving the database guard alone
suffices), see :func:`race_worker.round_shape`. Every round has one placement and one drop reported in ``ApplyResult.dropped`` — never an
exception — and the database never shows a GPU held past 1000 milli. PostgreSQL is the
case that matters (schedulers in HA); SQLite runs the same race, serialised by its single
writer (``BEGIN IMMEDIATE`` and the busy timeout).
"""

from __future__ import annotations

import multiprocessing
from datetime import datetime

import pytest
from sqlalchemy import text
from tests.store import race_worker
from tests.store.factories import make_node, make_request

from gpu_pool.model import Team
from gpu_pool.store import Store

ROUNDS = 24


@pytest.mark.postgres
@pytest.mark.slow
def test_two_processes_race_and_exactly_one_wins(store_url: str, now: datetime) -> None:
    store = Store.from_url(store_url)
    store.migrate()
    store.upsert_team(Team("nlp"), "test")
    store.import_nodes([make_node(f"race-{i}", 2) for i in range(ROUNDS)], "test")
    for i in range(ROUNDS):
        indices, milli, _ = race_worker.round_shape(i)
        for side in ("a", "b"):
            store.submit_request(make_request(f"r{i}-{side}", gpus=len(indices), gpu_milli=milli),
                                 "test", now)

    # fork: the children start with gpu_pool already imported (spawn spends seconds importing
    # the engine). They open their own engines; the parent's pool is emptied first so no
    # connection is shared across the fork.
    store.engine.dispose()
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(2), ctx.Queue()
    workers = [ctx.Process(target=race_worker.run,
                           args=(store_url, side, ROUNDS, barrier, out))
               for side in ("a", "b")]
    for w in workers:
        w.start()
    results = [out.get(timeout=120) for _ in range(2 * ROUNDS)]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    errors = [r for r in results if r[0] == -1]
    assert errors == []

    for round_no in range(ROUNDS):
        sides = [r for r in results if r[0] == round_no]
        placed = [name for _, _, p, _ in sides for name in p]
        dropped = {k: v for _, _, _, d in sides for k, v in d.items()}
        assert len(placed) == 1, (round_no, sides)
        assert len(dropped) == 1 and set(dropped) != set(placed), (round_no, sides)
        # the loser read the winner's hold (pre-check) or hit the database guard
        (why,) = dropped.values()
        assert why.startswith(("GPU race-", "lost a race: another writer took its GPUs first")), why

    with store.engine.connect() as conn:
        over = conn.execute(text(
            "SELECT node, gpu_index, SUM(milli) FROM allocation_gpus WHERE active "
            "GROUP BY node, gpu_index HAVING SUM(milli) > 1000")).all()
        assert over == []
        drift = conn.execute(text(
            "SELECT g.node, g.idx FROM gpus g LEFT JOIN (SELECT node, gpu_index, SUM(milli) AS m "
            "FROM allocation_gpus WHERE active GROUP BY node, gpu_index) h ON h.node = g.node "
            "AND h.gpu_index = g.idx WHERE g.allocated_milli <> COALESCE(h.m, 0)")).all()
        assert drift == []
    assert len(store.active_allocations()) == ROUNDS
    assert len(store.pending_requests()) == ROUNDS
    store.close()
