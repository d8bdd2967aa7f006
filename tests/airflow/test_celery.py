"""Scale-out with two executors in one Airflow: ``CeleryExecutor,GpuPool:…`` — and team
membership read from Airflow's own DAG owners at admission.

A real Celery worker (broker: the Redis on 127.0.0.1:6379, a queue of this test's own)
runs the DAG's CPU tasks; its GPU tasks go through GpuPoolExecutor to a simulated GPU node
(gpu-pool's embedded SSH server). Checked from what each task saw: the CPU tasks carry the
worker's mark (an environment variable only the worker has) and no GPU; the GPU tasks ran
on the node with their own CUDA_VISIBLE_DEVICES, their allocations released and ledgered.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from gpu_pool.model import Team
from gpu_pool.simnode.server import airflow_env, sim_fleet
from gpu_pool.spec import parse_node
from gpu_pool.store import Store
from tests.airflow.harness import deployment, wait_for

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

DAG_FILES = Path(__file__).parent / "dag_files"
REDIS = "redis://127.0.0.1:6379/7"


def redis_answers() -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(REDIS, socket_connect_timeout=2).ping())
    except redis.RedisError:
        return False


@pytest.fixture
def out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "out"
    folder.mkdir()
    monkeypatch.setenv("GPU_POOL_E2E_OUT", str(folder))  # the simulated node's commands see it
    return folder


def test_cpu_tasks_on_a_celery_worker_gpu_tasks_through_gpu_pool(
        tmp_path: Path, out: Path) -> None:
    assert redis_answers(), f"Redis does not answer at {REDIS}: the Celery test needs it"
    queue = f"gpu-pool-test-{uuid.uuid4().hex[:8]}"  # no other worker takes our tasks
    dags = tmp_path / "dags"
    dags.mkdir()
    with sim_fleet(tmp_path / "fleet", [("sim-a100", "A100", 2)]) as nodes:
        store_url = f"sqlite:///{tmp_path / 'store.db'}"
        store = Store.from_url(store_url)
        store.migrate()
        store.import_nodes([parse_node({"name": "sim-a100", "gpu_model": "A100", "gpus": 2,
                                        "cpu": 16, "memory": "64GiB",
                                        "ssh_conn_id": nodes["sim-a100"].conn_id})],
                           actor="test")
        store.upsert_team(Team("nlp"), actor="test")
        store.upsert_team(Team("cv"), actor="test")
        # Closed teams: the DAGs' owner (airflow, the default) is in nlp, not in cv.
        store.add_member("nlp", "airflow", "test")
        store.add_member("cv", "alice", "test", role="lead")
        with deployment(
            home=tmp_path / "home", dags_folder=dags, store_url=store_url,
            extra_env={**airflow_env(nodes), "GPU_POOL_E2E_OUT": str(out)},
            overrides={
                "core": {"executor": "CeleryExecutor,GpuPool:gpu_pool.executor.GpuPoolExecutor"},
                "celery": {"broker_url": REDIS,
                           "result_backend": f"db+sqlite:///{tmp_path / 'celery.db'}",
                           "worker_concurrency": 2},
                "operators": {"default_queue": queue},
            },
        ) as dep:
            dep.start_all(triggerer=True)  # @task.gpu defers to the triggerer
            worker_env = {**dep.env, "GPU_POOL_E2E_WORKER": "celery-worker-1"}
            dep.start_celery_worker(queue, worker_env)
            shutil.copy(DAG_FILES / "e2e_celery.py", dags / "e2e_celery.py")
            shutil.copy(DAG_FILES / "e2e_not_a_member.py", dags / "e2e_not_a_member.py")
            states = dep.wait_dag_done("e2e_celery", 4, timeout=300)
            refused = dep.wait_dag_done("e2e_not_a_member", 1, timeout=120)
            assert refused == {"train": "failed"}
            assert "airflow is not a member of cv" in dep.output("scheduler")
            assert states == dict.fromkeys(("prepare", "train", "evaluate", "report"),
                                           "success"), dep.diagnose()
            rows = {r["task_id"]: r for r in dep.task_rows("e2e_celery")}
            worker_log = dep.output("celery-worker")

        seen = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
        for cpu in ("prepare", "report"):
            assert seen[cpu]["GPU_POOL_E2E_WORKER"] == "celery-worker-1"
            assert "CUDA_VISIBLE_DEVICES" not in seen[cpu]
            assert rows[cpu]["executor"] in (None, "CeleryExecutor")
            assert rows[cpu]["external_executor_id"], "a Celery task id"
        assert "e2e_celery" in worker_log, worker_log[-2000:]
        devices = set()
        for gpu in ("train", "evaluate"):
            assert "GPU_POOL_E2E_WORKER" not in seen[gpu]  # not on the Celery worker
            assert seen[gpu]["GPU_POOL_NODE"] == "sim-a100"
            assert seen[gpu]["GPU_POOL_SIM_NODE"] == "sim-a100"
            assert seen[gpu]["upstream_worker"] == "celery-worker-1"  # XCom across executors
            devices.add(seen[gpu]["CUDA_VISIBLE_DEVICES"])
            assert rows[gpu]["executor"] == "GpuPool"
            assert rows[gpu]["external_executor_id"].startswith("gpu://sim-a100/")
        assert devices == {"0", "1"}  # one GPU each, both at once on the 2-GPU node
        wait_for(lambda: not store.active_allocations(), 30, "the GPUs to be released")
        assert len({e.request_name for e in store.ledger()}) == 2
        store.close()
