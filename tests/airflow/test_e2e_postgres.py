"""Two schedulers on PostgreSQL never allocate a GPU twice (real Airflow, real sshd nodes).

The Airflow metadata database and the gpu-pool store are fresh PostgreSQL databases on
127.0.0.1:5432. Two ``airflow scheduler`` processes run side by side, each with its own
GpuPoolExecutor; both submit, plan and apply against the same store, whose advisory lock
and database guard must keep every GPU single-held. Checked from what the nodes saw.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from gpu_pool.store import Store
from tests.airflow.e2e_checks import gpu_overlaps, read_probes
from tests.airflow.harness import deployment
from tests.airflow.test_e2e import DAG_FILES, E2E, FLEET, assert_released, register_fleet
from tests.sshd.fleet import start_fleet

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.postgres]

PG = "postgresql+psycopg2://postgres@127.0.0.1:5432/{}"


def _database(name: str, create: bool) -> None:
    import psycopg2  # a dependency of gpu-pool itself
    conn = psycopg2.connect(host="127.0.0.1", port=5432, user="postgres", dbname="postgres")
    conn.autocommit = True
    with conn.cursor() as cur:
        cur.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if create:
            cur.execute(f'CREATE DATABASE "{name}"')
    conn.close()


@pytest.fixture(scope="module")
def ha(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    root = tmp_path_factory.mktemp("ha")
    out, dags = root / "out", root / "dags"
    out.mkdir()
    dags.mkdir()
    shutil.copy(DAG_FILES / "e2e_common.py", dags / "e2e_common.py")
    suffix = uuid.uuid4().hex[:8]
    meta_db, store_db = f"gpupool_af_{suffix}", f"gpupool_store_{suffix}"
    _database(meta_db, True)
    _database(store_db, True)
    try:
        with start_fleet(root / "fleet", FLEET) as fleet:
            store = Store.from_url(PG.format(store_db).replace("+psycopg2", ""))
            store.migrate()
            register_fleet(store, fleet)
            with deployment(
                home=root / "home", dags_folder=dags, store_url=store.url,
                metadata_url=PG.format(meta_db),
                extra_env={**fleet.airflow_env(), "GPU_POOL_E2E_OUT": str(out)},
                # Each executor holds at most two waiting GPU workloads, so one scheduler
                # cannot queue the whole DAG: both take part in queueing and placing.
                overrides={"gpu_pool": {"max_held_tasks": 2}},
            ) as dep:
                dep.start("scheduler")  # the second one; start_all starts the first
                dep.start_all(triggerer=True)
                yield E2E(dep, store, fleet, out, dags)
            store.close()
    finally:
        _database(meta_db, False)
        _database(store_db, False)


def test_two_schedulers_never_hold_a_gpu_twice(ha: E2E) -> None:
    states = ha.run_dag("e2e_ha", 10, timeout=420)
    assert set(states.values()) == {"success"}, (states, ha.dep.diagnose())
    assert_released(ha, "e2e_ha")
    probes = read_probes(ha.out)
    assert len(probes) == 10
    assert gpu_overlaps(probes.values()) == []
    tis = ha.ti("e2e_ha")
    for task_id, probe in probes.items():
        assert tis[task_id]["external_executor_id"] == (
            f"gpu://{probe.node}/{','.join(map(str, probe.cuda))}")
    # Both schedulers took part: each queued GPU tasks, and each executor submitted requests.
    jobs = {row[0] for row in ha.dep.query(
        "SELECT DISTINCT queued_by_job_id FROM task_instance WHERE dag_id = ?", ("e2e_ha",))}
    submitters = {e.actor for e in ha.store.events() if e.kind == "request.submitted"}
    assert len(jobs) == 2 and len(submitters) == 2, (jobs, submitters)
    names = set(ha.request_names("e2e_ha").values())
    assert names <= {entry.request_name for entry in ha.store.ledger()}
