"""Fair share: decayed GPU-hours per team from the ledger and active allocations, hand
computed, on SQLite and PostgreSQL."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest
from tests.store.factories import place, seed, submit

from gpu_pool.model import Outcome, Policy
from gpu_pool.store import Store
from gpu_pool.store.usage import decayed_gpu_hours, ranks

H = timedelta(hours=1)
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize("gpus, start_h, end_h, expected", [
    # 1 GPU for the last hour, half-life 1 h: integral of 2^-t over [0, 1] h = 0.5/ln 2.
    (1, -1, 0, 0.5 / math.log(2)),
    # 2 GPUs from 2 h ago to 1 h ago: 2 * (2^-1 - 2^-2) / ln 2 = 0.5/ln 2.
    (2, -2, -1, 0.5 / math.log(2)),
    # Time after now counts nothing: [-1, +3] is [-1, 0].
    (1, -1, 3, 0.5 / math.log(2)),
    (1, 1, 2, 0.0),
    (0, -1, 0, 0.0),
])
def test_decayed_gpu_hours_by_hand(gpus, start_h, end_h, expected):
    value = decayed_gpu_hours(gpus, NOW + start_h * H, NOW + end_h * H, NOW, H)
    assert value == pytest.approx(expected, rel=1e-12)


def test_long_half_life_tends_to_plain_gpu_hours():
    value = decayed_gpu_hours(4, NOW - 3 * H, NOW, NOW, timedelta(days=10_000))
    assert value == pytest.approx(12.0, rel=1e-4)


def test_zero_half_life_is_off():
    assert decayed_gpu_hours(4, NOW - H, NOW, NOW, timedelta(0)) == 0.0


def test_ranks_least_use_first():
    assert ranks({"cv": 41.2, "nlp": 3.0}, ["ml", "cv", "nlp"]) == {"ml": 1, "nlp": 2, "cv": 3}


def test_snapshot_team_usage_from_ledger_and_active(store: Store, now: datetime) -> None:
    seed(store)
    # nlp: 2 GPUs for 1 h, ended 1 h ago (in the ledger); vision: 1 GPU active for 1 h.
    submit(store, "done", now - 2 * H, gpus=2)
    place(store, "done", "n1", [0, 1], now - 2 * H)
    store.release_request("done", Outcome.SUCCESS, "exec", "ok", now - H)
    submit(store, "run", now - H, team="vision", gpus=1)
    place(store, "run", "n1", [2], now - H)
    snap = store.load_snapshot(Policy(fair_share_half_life=H), now)
    assert snap.team_usage["nlp"] == pytest.approx(2 * (0.5 - 0.25) / math.log(2), rel=1e-9)
    assert snap.team_usage["vision"] == pytest.approx(0.5 / math.log(2), rel=1e-9)
    off = store.load_snapshot(Policy(fair_share_half_life=timedelta(0)), now)
    assert off.team_usage == {}
