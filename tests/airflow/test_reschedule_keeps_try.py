"""The scheduler side of "requeue without spending a retry", on a real metadata database.

A preempted GPU task raises ``AirflowRescheduleException``: its task instance goes
UP_FOR_RESCHEDULE. The scheduler's DAG-run step must find it schedulable at once (it is not
a sensor, so ``ReadyToRescheduleDep`` passes) and queue it again with the same
``try_number`` — while a task up for retry gets the next try (the control). The probe runs
in a subprocess with its own AIRFLOW_HOME and SQLite database (a few seconds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).with_name("reschedule_probe.py")


def test_up_for_reschedule_is_scheduled_again_with_the_same_try(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
    env.update({"AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
                "AIRFLOW__CORE__DAGS_FOLDER": str(tmp_path / "dags")})
    (tmp_path / "dags").mkdir()
    done = subprocess.run([sys.executable, str(PROBE), str(tmp_path / "dags")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"up_for_reschedule": ["scheduled", 1],  # requeued, no retry spent
                      "up_for_retry": ["scheduled", 2]}  # a failure spends one
