"""``gpu-pool queue`` and ``why`` say when a waiting request is expected to start; the
store keeps the last cycle's estimate and learns how long work runs against its limit."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpu_pool.cli import main
from gpu_pool.engine import plan
from gpu_pool.engine.types import NodeAssignment, Placement, Plan
from gpu_pool.model import Outcome, Policy, Request
from gpu_pool.store import Store

H = timedelta(hours=1)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["--db", url, "db", "migrate"]) == 0
    assert main(["--db", url, "team", "add", "nlp"]) == 0
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  - {name: n1, gpu_model: A100, gpus: 8, cpu: 64, memory: 1TiB}\n")
    assert main(["--db", url, "nodes", "import", str(fleet)]) == 0
    return Store.from_url(url)


def _run(store: Store, name: str, gpus: tuple[int, ...], at: datetime, limit: timedelta) -> None:
    store.submit_request(Request(name, "nlp", gpus=len(gpus), time_limit=limit), actor="t",
                         now=at)
    store.apply_plan(Plan((Placement(name, (NodeAssignment("n1", gpus, 1000, 0, 0),)),), ()),
                     now=at, actor="t")


def test_queue_and_why_show_the_expected_start(store: Store,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    now = datetime.now(UTC)
    _run(store, "busy", tuple(range(8)), now - H, 3 * H)  # ends by now + 2 h
    store.submit_request(Request("wait", "nlp", gpus=4, time_limit=H), actor="t")
    store.submit_request(Request("blind", "nlp", gpus=8), actor="t")  # behind wait, no limit
    capsys.readouterr()
    assert main(["--db", store.url, "--json", "queue"]) == 0
    rows = {r["request"]: r for r in json.loads(capsys.readouterr().out)}
    # blind (8 GPUs) ranks first (larger first) and starts at +2 h with no limit: for ever.
    assert rows["blind"]["starts"].endswith("(in 1 h 59 min)") or rows["blind"][
        "starts"].endswith("(in 2 h 0 min)")
    assert rows["wait"]["starts"] == "unknown"
    assert main(["--db", store.url, "--json", "why", "blind"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["state"] == "waiting_for_capacity" and info["starts"].startswith("~")


def test_a_cycle_stores_estimates_and_learns_runtimes(store: Store) -> None:
    now = datetime.now(UTC)
    # Two finished tasks ran a quarter and a half of their 4 h limits.
    for name, ran in (("q", H), ("h", 2 * H)):
        _run(store, name, (0,), now - 10 * H, 4 * H)
        store.release_request(name, Outcome.SUCCESS, "t", "done", now - 10 * H + ran)
    assert sorted(store.load_snapshot(Policy(), now).runtime_ratios) == [0.25, 0.5]
    _run(store, "busy", tuple(range(8)), now, 4 * H)
    store.submit_request(Request("next", "nlp", gpus=8, time_limit=H), actor="t", now=now)
    snapshot = store.load_snapshot(Policy(), now)
    p = plan(snapshot)
    # busy is expected to run the median of what such work ran: 0.375 x 4 h = 1.5 h.
    assert p.estimates["next"] == now + 1.5 * H
    store.apply_plan(p, now=now, actor="t")
    assert store.estimated_start("next") == now + 1.5 * H
    # busy ends; next is placed: no longer pending, no estimate.
    store.release_request("busy", Outcome.SUCCESS, "t", "done", now + 2 * H)
    store.apply_plan(plan(store.load_snapshot(Policy(), now + 5 * H)), now=now + 5 * H,
                     actor="t")
    assert store.estimated_start("next") is None
