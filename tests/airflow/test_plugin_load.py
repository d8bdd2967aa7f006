"""Airflow loads gpu-pool's plugin and provider once, in a fresh Airflow home, with no warning.

An editable install used to leave ``plugins/airflow_gpu_pool.egg-info`` on ``sys.path``, so
``importlib.metadata`` saw the distribution twice and every Airflow process logged "Plugin
'gpu_pool' already registered, skipping" (and listed it as a plugin import error).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.airflow
REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json
from importlib import metadata

from airflow import plugins_manager

plugins, errors = plugins_manager._get_plugins()
print(json.dumps({
    "plugins": [p.name for p in plugins],
    "errors": errors,
    "distributions": [str(d._path) for d in metadata.distributions()
                      if d.metadata["Name"] == "airflow-gpu-pool"],
}))
"""


def test_loading_the_plugins_registers_gpu_pool_once_without_a_warning(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({"AIRFLOW_HOME": str(tmp_path / "airflow"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False"})
    # From the checkout's root, as `make` and pytest run things (the cwd is on sys.path).
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    output = done.stdout + done.stderr
    assert "already registered" not in output, output[-3000:]
    assert result["plugins"].count("gpu_pool") == 1
    assert result["errors"] == {}
    assert len(result["distributions"]) == 1, result["distributions"]
