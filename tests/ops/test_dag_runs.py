"""The ops DAGs run for real with ``dag.test()`` (Task SDK, Execution API in process):
settings from Variables, channels and object store from connections, liveness from
Airflow's own task states. The reclaim sweep runs while one of the GPU holds belongs to a
task that is running at that moment (the sweep's own task instance) and must keep it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from datetime import UTC, datetime, timedelta
sys.path.insert(0, sys.argv[1])
from gpu_pool.store import Store
from tests.ops.conftest import Fleet

url, email, hook = sys.argv[2], sys.argv[3], sys.argv[4]
run_after = datetime.now(UTC).replace(microsecond=0)
store = Store.from_url(url)
store.migrate()
fleet = Fleet(store)
fleet.team("vision", email=email, webhook=hook)
fleet.node("n1")
fleet.quota("vision", 4, run_after - timedelta(days=30), run_after + timedelta(days=5))
fleet.run("ghost", "vision", 1, run_after - timedelta(hours=2))  # dag 'train' never ran
fleet.run("done", "vision", 1, run_after - timedelta(hours=3))
store.release_request("done", "success", "test", "ok", run_after - timedelta(hours=1))
store.submit_request(
    __import__("gpu_pool.model", fromlist=["Request"]).Request("selfie", "vision", gpus=1,
                                                               submitted_at=run_after),
    "test", run_after - timedelta(hours=1), dag_id="gpu_pool_reclaim_sweep", task_id="sweep",
    run_id=f"manual__{run_after.isoformat()}", map_index=-1, try_number=1,
    executor_key="x")
from gpu_pool.engine import plan
from gpu_pool.model import Policy
at = run_after - timedelta(hours=1)
store.apply_plan(plan(store.load_snapshot(Policy(), at)), at, "test")
store.close()

from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1] + "/dags")
states = {}
for dag_id in ("gpu_pool_reclaim_sweep", "gpu_pool_quota_alerts", "gpu_pool_ledger_snapshot"):
    dr = bag.dags[dag_id].test(run_after=run_after, logical_date=run_after)
    states[dag_id] = str(dr.state)
store = Store.from_url(url)
print("RESULT " + json.dumps({
    "states": states,
    "active": sorted({a.request_name for a in store.active_allocations()}),
    "ledger": sorted((e.request_name, str(e.outcome)) for e in store.ledger()),
}))
"""


def test_ops_dags_run(tmp_path: Path, smtp_server, webhook, objstore, s3_config) -> None:
    home = tmp_path / "airflow"
    home.mkdir()
    url = f"sqlite:///{tmp_path / 'store.db'}"
    env = {
        **os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"), "GPU_POOL_DB_URL": url,
        "AIRFLOW_CONN_GPU_POOL_SMTP": json.dumps({
            "conn_type": "smtp", "host": smtp_server.host, "port": smtp_server.port,
            "extra": {"from_email": "pool@example.org", "disable_ssl": True,
                      "disable_tls": True}}),
        "AIRFLOW_CONN_GPU_POOL_S3": json.dumps({
            "conn_type": "aws", "login": s3_config.access_key,
            "password": s3_config.secret_key,
            "extra": {"endpoint_url": s3_config.endpoint_url, "bucket": s3_config.bucket,
                      "prefix": s3_config.prefix}}),
        "AIRFLOW_VAR_GPU_POOL_OPS": json.dumps({"reclaim_grace_minutes": 5}),
    }
    migrate = subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], env=env,
                             capture_output=True, text=True, timeout=300)
    assert migrate.returncode == 0, migrate.stderr[-2000:]
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO), url, "vision@example.org",
                           webhook.url], env=env, capture_output=True, text=True, timeout=500,
                          cwd=tmp_path)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    assert done.returncode == 0 and lines, (done.stdout + done.stderr)[-4000:]
    result = json.loads(lines[-1][len("RESULT "):])
    assert set(result["states"].values()) == {"success"}, result
    assert result["active"] == ["selfie"]  # its task was running while the sweep ran
    assert result["ledger"] == [["done", "success"], ["ghost", "reclaimed"]]
    (rcpts, msg), = smtp_server.messages
    assert rcpts == ["vision@example.org"] and "expires within 5 days" in str(msg["Subject"])
    assert [p["gpu_pool"]["kind"] for p in webhook.posts] == ["quota_expiring"]
    assert any(k.startswith("ledger/dt=") and k.endswith(".parquet")
               for k in objstore.list_keys())
