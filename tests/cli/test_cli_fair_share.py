"""``gpu-pool queue`` shows each team's decayed use and rank (fair share)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpu_pool.cli import main
from gpu_pool.engine.types import NodeAssignment, Placement, Plan
from gpu_pool.model import Outcome, Request
from gpu_pool.store import Store


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    assert main(["--db", url, "db", "migrate"]) == 0
    for team in ("nlp", "cv"):
        assert main(["--db", url, "team", "add", team]) == 0
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  - {name: n1, gpu_model: A100, gpus: 8, cpu: 64, memory: 1TiB}\n")
    assert main(["--db", url, "nodes", "import", str(fleet)]) == 0
    return url


def test_queue_shows_decayed_use_and_rank(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    store = Store.from_url(db)
    start = datetime.now(UTC) - timedelta(hours=3)
    store.submit_request(Request("old", "nlp", gpus=4), actor="t", now=start)
    store.apply_plan(Plan((Placement("old", (NodeAssignment("n1", (0, 1, 2, 3), 1000, 0, 0),)),),
                          ()), now=start, actor="t")
    store.release_request("old", Outcome.SUCCESS, "t", "done", start + timedelta(hours=1))
    for name, team in (("a", "nlp"), ("b", "cv")):
        store.submit_request(Request(name, team, gpus=8), actor="t")
    capsys.readouterr()
    assert main(["--db", db, "--json", "queue"]) == 0
    rows = {r["request"]: r for r in json.loads(capsys.readouterr().out)}
    # 4 GPUs for 1 h, 2-3 h ago, half-life 7 days: just under 4 GPU-h.
    assert 3.9 <= rows["a"]["used"] <= 4.0 and rows["b"]["used"] == 0.0
    # Equal requests, one node: cv (less used) goes first.
    assert rows["b"]["state"] == "next" and rows["a"]["state"] != "next"
    assert main(["--db", db, "queue"]) == 0
    out = capsys.readouterr().out
    assert "team cv: 0.0 decayed GPU-h, rank 1/2" in out
    assert "team nlp: 4.0 decayed GPU-h, rank 2/2" in out
