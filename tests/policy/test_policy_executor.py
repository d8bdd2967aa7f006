"""The executor and the policy: ``[gpu_pool] policy_file`` at start (a bad file stops it
with one line; a changed file becomes a version), and the placement cycle following new
store versions while it runs."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from gpu_pool.engine import plan
from gpu_pool.errors import SpecError
from gpu_pool.executor_support.cycle import PlacementCycle
from gpu_pool.model import Policy, Team
from gpu_pool.spec import parse_node, parse_request
from gpu_pool.store import Store

pytestmark = pytest.mark.airflow


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.from_url(f"sqlite:///{tmp_path / 'store.db'}")
    s.migrate()
    s.upsert_team(Team("nlp"), actor="t")
    s.import_nodes([parse_node({"name": "node-a", "gpu_model": "A100", "gpus": 2, "cpu": 8,
                                "memory": "64GiB"})], actor="t")
    yield s
    s.close()


def _executor(store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              policy_file: Path) -> Any:
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "test-secret")
    monkeypatch.setenv("AIRFLOW__GPU_POOL__STORE_URL", store.url)
    monkeypatch.setenv("AIRFLOW__GPU_POOL__POLICY_FILE", str(policy_file))
    from gpu_pool.executor import GpuPoolExecutor

    return GpuPoolExecutor(parallelism=4)


def test_start_on_a_bad_policy_file_raises_one_clear_line(store, tmp_path, monkeypatch):
    path = tmp_path / "policy.yaml"
    path.write_text("preemption_grace: 90s\noff_peak: {timezone: Europe/Berlim}\n")
    executor = _executor(store, tmp_path, monkeypatch, path)
    with pytest.raises(SpecError) as caught:
        executor.start()
    assert str(caught.value) == (
        f"{path}: off_peak.timezone: got 'Europe/Berlim'; expected an IANA time zone like "
        "'Europe/Berlin', 'America/New_York' or 'UTC'")
    assert executor.cycle is None
    assert store.policy_version() == 0


def test_start_records_a_changed_file_and_plans_with_it(store, tmp_path, monkeypatch):
    path = tmp_path / "policy.yaml"
    path.write_text("reserve_after: 0\ncritical_headroom_gpus: 1\n")
    executor = _executor(store, tmp_path, monkeypatch, path)
    executor.start()
    assert executor.cycle.policy.critical_headroom_gpus == 1
    (version,) = store.policy_history()
    assert version.actor.startswith("executor@") and version.comment == f"from {path}"
    # A restart on the same file records nothing new.
    _executor(store, tmp_path, monkeypatch, path).start()
    assert store.policy_version() == 1


def test_the_cycle_follows_a_new_store_version(store, caplog):
    store.set_policy("critical_headroom_gpus: 1\n", "alice")
    cycle = PlacementCycle(store=store, policy=store.load_policy(), planner=plan, actor="ex")
    request = parse_request({"name": "r1", "team": "nlp", "gpus": 2})
    cycle.admit(request, {})
    cycle.run(["r1"])
    # One GPU is kept free for critical work: a normal 2-GPU request waits.
    assert store.allocations_of("r1") == []
    store.set_policy("critical_headroom_gpus: 0\n", "bob")
    cycle.mark_dirty()
    with caplog.at_level(logging.INFO, logger="gpu_pool.executor_support.cycle"):
        report = cycle.run(["r1"])
    assert "policy v2 in force" in caplog.text
    assert cycle.policy.critical_headroom_gpus == 0 and cycle.policy_version == 2
    assert [b.request_name for b in report.bindings] == ["r1"]


def test_a_cycle_given_a_policy_keeps_it_until_the_store_changes(store):
    custom = Policy(reserve_after=timedelta(0))
    cycle = PlacementCycle(store=store, policy=custom, planner=plan, actor="ex")
    cycle.admit(parse_request({"name": "r1", "team": "nlp", "gpus": 1}), {})
    cycle.run(["r1"])
    assert cycle.policy is custom and cycle.policy_version == 0
