"""Property: whatever sequence of placements, releases and preemptions is applied, no GPU is
ever held twice, the guard's counter equals the active rows, usage is what is held, and each
ended allocation has exactly one ledger entry.

Each example works on its own fresh node and request names inside one store, so examples
need no reset between them; the invariants are checked over the whole accumulated store.
"""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from tests.store.factories import make_node, make_quota, make_request, part, plan_of

from gpu_pool.engine.types import Preemption
from gpu_pool.model import Outcome, Team
from gpu_pool.store import Store

GPUS = 3
_example = itertools.count()
# The requests of one example: (GPUs, milli per GPU).
SHAPES = ((1, 1000), (2, 1000), (1, 500), (1, 300), (1, 1000), (2, 1000))

# One step: ("place", request, first GPU index), ("release", request, outcome) or
# ("preempt", request). Placements are on purpose often impossible (a GPU already held).
steps = st.lists(st.one_of(
    st.tuples(st.just("place"), st.integers(0, len(SHAPES) - 1), st.integers(0, GPUS - 1)),
    st.tuples(st.just("release"), st.integers(0, len(SHAPES) - 1),
              st.sampled_from(list(Outcome))),
    st.tuples(st.just("preempt"), st.integers(0, len(SHAPES) - 1)),
), min_size=1, max_size=10)


def _no_drift(store: Store) -> None:
    with store.engine.connect() as conn:
        drift = conn.execute(text(
            "SELECT g.node, g.idx, g.allocated_milli, COALESCE(h.m, 0) FROM gpus g LEFT JOIN "
            "(SELECT node, gpu_index, SUM(milli) AS m FROM allocation_gpus WHERE active "
            "GROUP BY node, gpu_index) h ON h.node = g.node AND h.gpu_index = g.idx "
            "WHERE g.allocated_milli <> COALESCE(h.m, 0) OR g.allocated_milli > 1000")).all()
    assert drift == []


def _books_balance(store: Store, now: datetime) -> None:
    with store.engine.connect() as conn:
        unledgered = conn.execute(text(
            "SELECT COUNT(*) FROM allocations a LEFT JOIN ledger l ON l.allocation_id = a.id "
            "WHERE (a.state = 'active') = (l.allocation_id IS NOT NULL)")).scalar()
    assert unledgered == 0
    held = store.active_allocations()
    usage = store.quota_usage(now)
    for quota in store.list_quotas():
        assert usage[quota.id] == sum(a.gpu_milli_total for a in held if quota.matches(
            a.team, a.purpose, a.gpu_model)) / 1000


@settings(max_examples=8, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=steps)
def test_no_gpu_is_ever_held_twice(store: Store, now: datetime, ops: list[tuple]) -> None:
    n = next(_example)
    node = f"p{n}"
    if not store.list_teams():
        store.upsert_team(Team("nlp"), "t")
        store.set_quota(make_quota(gpus=4, start=now - timedelta(days=1)), "t")
    store.import_nodes([make_node(node, GPUS)], "t")
    names = [f"p{n}-r{i}" for i in range(len(SHAPES))]
    for name, (gpus, milli) in zip(names, SHAPES, strict=True):
        store.submit_request(make_request(name, gpus=gpus, gpu_milli=milli), "t", now)
    for step in ops:
        name = names[step[1]]
        if step[0] == "place":
            gpus, milli = SHAPES[step[1]]
            indices = [(step[2] + k) % GPUS for k in range(gpus)]
            store.apply_plan(plan_of((name, [part(node, indices, milli)])), now, "prop")
        elif step[0] == "release":
            store.release_request(name, step[2], "prop", "step", now + timedelta(minutes=5))
        else:
            for a in store.allocations_of(name):
                store.apply_plan(plan_of(preemptions=[Preemption(a.id, name, "x", "y")]),
                                 now, "prop")
        _no_drift(store)
    _books_balance(store, now)
