"""The README's main command: ``gpu-pool demo --airflow`` runs for real, start to finish.

It starts ``airflow standalone`` on a simulated fleet (embedded SSH servers), triggers the
example DAGs of ``dags/`` and must see every GPU task placed, run and released, with a
ledger row each; the folder it wipes must be one it made.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.airflow.harness import free_port

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

GPU_POOL = str(Path(sys.executable).with_name("gpu-pool"))


def test_airflow_demo_places_runs_and_releases_every_gpu_task(tmp_path: Path) -> None:
    home = tmp_path / "demo"
    done = subprocess.run([GPU_POOL, "demo", "--airflow", "--home", str(home), "--port",
                           str(free_port()), "--timeout", "480"],
                          capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-2000:]
    placed = re.findall(r"placed  (\S+) on (\S+) GPU ([\d,]+)", out)
    released = re.findall(r"released (\S+): task success", out)
    assert len(placed) == 10 and sorted(p[0] for p in placed) == sorted(released)
    assert "waits   example_gpu_sweep.trial_" in out  # the sweep outgrows the fleet
    assert "10 GPU tasks placed, run over SSH and released; 10 ledger rows" in out
    assert "GPUs still held: 0" in out
    for name, node, _ in placed:  # the summary names the same placement as Airflow's TI
        task = name.rsplit(".", 1)[0]
        assert re.search(rf"{re.escape(task)}\s+success\s+GpuPool\s+gpu://{node}/", out), task


def test_airflow_demo_refuses_to_wipe_a_folder_it_did_not_make(tmp_path: Path) -> None:
    (tmp_path / "thesis.tex").write_text("precious")
    done = subprocess.run([GPU_POOL, "demo", "--airflow", "--home", str(tmp_path)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    assert f"home: got '{tmp_path}'" in done.stderr or "home:" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert (tmp_path / "thesis.tex").read_text() == "precious"
