"""gpu-pool installed the way a user installs it: a wheel (``pip wheel .``) in a fresh
virtualenv, run from a folder that is not the checkout. The store migrates from the
migrations inside the package, the CLI demo runs, the DAGs it ships install into a dags
folder and parse in Airflow's DagBag.

The fresh virtualenv borrows the dependencies (Airflow, OR-Tools, ...) of the project's
own through a ``.pth`` line, so nothing is downloaded but the build backend; gpu-pool
itself comes only from the wheel (asserted: the imported module lives in the fresh venv).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def sh(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None,
       timeout: float = 600) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{argv}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the fresh venv's bin folder, a working folder outside the checkout)."""
    root = tmp_path_factory.mktemp("wheel")
    wheels = root / "wheels"
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", wheels, REPO, cwd=root)
    (wheel,) = wheels.glob("airflow_gpu_pool-*.whl")
    venv = root / "venv"
    sh(sys.executable, "-m", "venv", venv, cwd=root)
    bin_dir = venv / "bin"
    fresh_site = Path(sh(bin_dir / "python", "-c",
                         "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                         cwd=root).strip())
    # The dependencies only: a path line adds the folder but runs none of its .pth files,
    # so the checkout's editable finder stays out.
    (fresh_site / "zz_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    sh(bin_dir / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index", wheel,
       cwd=root)
    work = root / "work"
    work.mkdir()
    return bin_dir, work


def env_for(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GPU_POOL_", "AIRFLOW", "PYTHONPATH"))}
    return {**env, "AIRFLOW_HOME": str(work / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "True",
            # the example DAGs name the executor, as a deployment configures it
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor,GpuPool:gpu_pool.executor.GpuPoolExecutor"}


def test_the_package_comes_from_the_wheel(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    out = sh(bin_dir / "python", "-c",
             "import gpu_pool, json; from gpu_pool.store.migrate import sql_dir; "
             "print(json.dumps([gpu_pool.__file__, str(sql_dir())]))",
             cwd=work, env=env_for(work))
    module, sql = json.loads(out)
    assert Path(module).is_relative_to(bin_dir.parent), module
    assert not Path(module).is_relative_to(REPO)
    assert Path(sql).is_relative_to(bin_dir.parent) and any(Path(sql).glob("001_*.sql"))


def test_migrate_and_the_demo_run_from_the_wheel(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    env = env_for(work)
    url = f"sqlite:///{work / 'store.db'}"
    out = json.loads(sh(bin_dir / "gpu-pool", "--json", "--db", url, "db", "migrate",
                        cwd=work, env=env))
    assert out["store"] == url
    with sqlite3.connect(work / "store.db") as db:
        applied = {v for (v,) in db.execute("SELECT version FROM schema_migrations")}
    shipped = {p.name.split(".")[0] for p in (REPO / "plugins/gpu_pool/sql").glob("*.sql")}
    assert applied == shipped, applied ^ shipped
    out = sh(bin_dir / "gpu-pool", "--db", f"sqlite:///{work / 'demo.db'}", "demo",
             cwd=work, env=env, timeout=300)
    assert "Fleet: 6 nodes, 36 GPUs" in out and "Ledger: 2 finished allocations" in out


@pytest.mark.airflow
def test_the_shipped_dags_install_and_parse(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    env = env_for(work)
    dags = work / "airflow" / "dags"
    sh(bin_dir / "gpu-pool", "dags", "install", dags, cwd=work, env=env)
    script = ("import json, sys\n"
              "from airflow.dag_processing.dagbag import DagBag\n"
              "bag = DagBag(dag_folder=sys.argv[1])\n"
              "print(json.dumps({'errors': {k: str(v)[-300:] for k, v in "
              "bag.import_errors.items()}, 'dags': sorted(bag.dags)}))\n")
    out = sh(bin_dir / "python", "-c", script, dags, cwd=work, env=env, timeout=300)
    bag = json.loads(out.strip().splitlines()[-1])
    assert bag["errors"] == {}
    assert bag["dags"] == sorted([
        "example_gpu_sweep", "example_gpu_training", "gpu_pool_ledger_snapshot",
        "gpu_pool_node_probe", "gpu_pool_quota_alerts", "gpu_pool_reclaim_sweep"])
