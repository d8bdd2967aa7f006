"""The four ops DAGs parse in Airflow's DagBag with no import errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
OURS = {
    "gpu_pool_quota_alerts": "gpu_pool_quota_alerts.py",
    "gpu_pool_reclaim_sweep": "gpu_pool_reclaim_sweep.py",
    "gpu_pool_node_probe": "gpu_pool_node_probe.py",
    "gpu_pool_ledger_snapshot": "gpu_pool_ledger_snapshot.py",
}
SCRIPT = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
print(json.dumps({"errors": {k: str(v)[-400:] for k, v in bag.import_errors.items()},
                  "dags": {d: {"tasks": sorted(t.task_id for t in dag.tasks),
                               "tags": sorted(dag.tags), "fileloc": dag.fileloc}
                           for d, dag in bag.dags.items()}}))
"""


@pytest.mark.airflow
def test_ops_dags_parse(tmp_path: Path) -> None:
    env = {**os.environ, "AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
           "AIRFLOW__CORE__UNIT_TEST_MODE": "True"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(REPO / "dags")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    bag = json.loads(done.stdout.strip().splitlines()[-1])
    ours = {k: v for k, v in bag["errors"].items() if Path(k).name in OURS.values()}
    assert ours == {}
    for dag_id, file in OURS.items():
        assert dag_id in bag["dags"], f"{dag_id} not found in {file}"
        assert Path(bag["dags"][dag_id]["fileloc"]).name == file
        assert "gpu-pool" in bag["dags"][dag_id]["tags"]
    assert bag["dags"]["gpu_pool_ledger_snapshot"]["tasks"] == ["export_snapshots",
                                                                 "monthly_reports"]
