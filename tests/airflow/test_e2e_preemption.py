"""End to end on a real Airflow 3.3: a batch training is preempted by critical work, with
grace, and comes back without spending a retry.

One sshd "GPU node" with 2 GPUs; the batch DAG's training (deferrable GpuSSHOperator, no
retries, 10 s grace) runs; then a critical DAG needs both GPUs. The scheduler's executor
preempts the training: the node SIGTERMs it, it writes its checkpoint, the trigger sees
``killed=preempted``, the resumed operator reschedules the task (UP_FOR_RESCHEDULE); the
critical task runs; the training is placed again with the same try and resumes from its
checkpoint to success.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_pool.model import AllocationState, Team
from gpu_pool.spec import parse_node
from gpu_pool.store import Store
from tests.airflow.harness import AirflowDeployment, deployment, wait_for
from tests.sshd.fleet import start_fleet

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

DAG_FILES = Path(__file__).parent / "dag_files"


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[tuple[AirflowDeployment, Store, Path, Path]]:
    root = tmp_path_factory.mktemp("e2e-preempt")
    out, dags = root / "out", root / "dags"
    out.mkdir()
    dags.mkdir()
    shutil.copy(DAG_FILES / "e2e_common.py", dags / "e2e_common.py")
    with start_fleet(root / "fleet", [("node-a", "A100", 2)]) as fleet:
        store_url = f"sqlite:///{root / 'store.db'}"
        store = Store.from_url(store_url)
        store.migrate()
        store.import_nodes([parse_node({"name": "node-a", "gpu_model": "A100", "gpus": 2,
                                        "cpu": 32, "memory": "256GiB",
                                        "ssh_conn_id": fleet["node-a"].conn_id})], actor="e2e")
        store.upsert_team(Team("nlp"), actor="e2e")
        # A training seconds old may be preempted here (the default waits 10 minutes).
        store.set_policy("min_runtime_before_preemption: 0\n", actor="e2e")
        with deployment(home=root / "home", dags_folder=dags, store_url=store_url,
                        extra_env={**fleet.airflow_env(), "GPU_POOL_E2E_OUT": str(out)},
                        overrides={"gpu_pool": {"watch_interval_seconds": 1}}) as dep:
            dep.start_all(triggerer=True)
            yield dep, store, out, dags


def test_a_preempted_training_requeues_with_its_try_and_resumes(
        setup: tuple[AirflowDeployment, Store, Path, Path]) -> None:
    dep, store, out, dags = setup
    log = out / "train.log"
    shutil.copy(DAG_FILES / "e2e_preempt_batch.py", dags / "e2e_preempt_batch.py")
    wait_for(lambda: log.exists() and "step 10\n" in log.read_text(), 240,
             "the training to run", dep.diagnose)
    shutil.copy(DAG_FILES / "e2e_preempt_urgent.py", dags / "e2e_preempt_urgent.py")
    urgent = dep.wait_dag_done("e2e_preempt_urgent", 1, 300)
    assert urgent == {"urgent": "success"}, dep.diagnose()
    batch = dep.wait_dag_done("e2e_preempt_batch", 1, 300)
    assert batch == {"train": "success"}, dep.diagnose()
    (train,) = dep.task_rows("e2e_preempt_batch")
    assert train["try_number"] == 1  # preempted, rescheduled: no retry spent
    text = log.read_text()
    assert "SIGTERM at step" in text and "checkpoint written" in text
    saved = int(text.split("SIGTERM at step ")[1].split()[0])
    assert f"resumed from step {saved}" in text and "preempted before: 1" in text
    assert f"finished at step {saved + 5}" in text
    reschedules = dep.query("SELECT COUNT(*) FROM task_reschedule")
    assert reschedules[0][0] >= 1
    states = [a.state for r in _requests(store, "e2e_preempt_batch")
              for a in store.allocations_of(r)]
    assert AllocationState.PREEMPTED in states and AllocationState.RELEASED in states
    assert store.active_allocations() == []


def _requests(store: Store, dag_id: str) -> list[str]:
    from sqlalchemy import text

    with store.engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT name FROM requests WHERE dag_id = :d"),
                                           {"d": dag_id})]
