"""A real Airflow deployment in a temp AIRFLOW_HOME, for end-to-end tests.

:class:`AirflowDeployment` migrates the metadata database once, then starts real
components as subprocesses (``airflow scheduler``, ``airflow dag-processor``,
``airflow api-server``, optionally ``airflow triggerer``), each with its output in
``<home>/<component>.out``. Tests read task-instance state straight from the metadata
database (SQLite file or PostgreSQL) so the test process never imports Airflow.

DAGs are made to run without any CLI call: ``[core] dags_are_paused_at_creation = False``
and ``schedule="@once"`` in the test DAGs.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_pool import airflow_config

AIRFLOW = str(Path(sys.executable).with_name("airflow"))
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class AirflowDeployment:
    home: Path
    dags_folder: Path
    store_url: str
    metadata_url: str | None = None  # None: SQLite under home
    extra_env: Mapping[str, str] = field(default_factory=dict)
    overrides: Mapping[str, Mapping[str, object]] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        extra: dict[str, dict[str, object]] = {
            "core": {
                "dags_are_paused_at_creation": False,
                "execution_api_server_url": f"http://127.0.0.1:{self.port}/execution/",
                "parallelism": 32,
                "min_serialized_dag_update_interval": 1,
            },
            "database": {"sql_alchemy_conn": self.metadata_url
                         or f"sqlite:///{self.home / 'airflow.db'}"},
            "api_auth": {"jwt_secret": "gpu-pool-e2e-secret"},
            "api": {"secret_key": "gpu-pool-e2e-secret", "port": self.port,
                    "base_url": f"http://127.0.0.1:{self.port}"},
            "dag_processor": {"refresh_interval": 2, "min_file_process_interval": 2},
            "scheduler": {"scheduler_heartbeat_sec": 1, "task_queued_timeout": 600,
                          "orphaned_tasks_check_interval": 5,
                          "scheduler_health_check_threshold": 8},
            "logging": {"base_log_folder": str(self.home / "logs")},
            # SQLite under a loaded 2-core machine answers slowly; do not fail on it.
            "workers": {"execution_api_timeout": 60},
        }
        for section, values in self.overrides.items():  # merged key by key, not replaced
            extra.setdefault(section, {}).update(values)
        values = airflow_config.settings(store_url=self.store_url, dags_folder=self.dags_folder,
                                         idle_replan_seconds=1.0, extra=extra)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(airflow_config.as_environment(values))
        env.update({"AIRFLOW_HOME": str(self.home), "PYTHONUNBUFFERED": "1",
                    # This checkout's gpu_pool first: the installed one may be another's.
                    "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO)])})
        env.update(self.extra_env)
        return env

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([AIRFLOW, *args], env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False, cwd=self.home)
        if done.returncode != 0:
            raise AssertionError(f"airflow {' '.join(args)} exited {done.returncode}:\n"
                                 f"{done.stderr[-3000:]}")
        return done

    def migrate(self) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        self.cli("db", "migrate", timeout=300)

    def start(self, component: str, *args: str) -> subprocess.Popen[bytes]:
        name = component if component not in self.processes else f"{component}-{len(self.processes)}"
        out = open(self.home / f"{name}.out", "ab")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen([AIRFLOW, component, *args], env=self.env, stdout=out,
                                stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True)
        self.processes[name] = proc
        return proc

    def start_all(self, *, triggerer: bool = False) -> None:
        self.start("api-server", "--port", str(self.port), "--workers", "1")
        self.start("dag-processor")
        self.start("scheduler")
        if triggerer:
            self.start("triggerer")
        wait_for(self.api_ready, 120, "api-server to answer")

    def start_celery_worker(self, queue: str, env: Mapping[str, str]) -> None:
        """``airflow celery worker`` on ``queue``, with its own environment."""
        out = open(self.home / "celery-worker.out", "ab")  # noqa: SIM115 - owned by the process
        self.processes["celery-worker"] = subprocess.Popen(
            [AIRFLOW, "celery", "worker", "--queues", queue, "--concurrency", "2",
             "--without-mingle", "--without-gossip"], env=dict(env), stdout=out,
            stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True)

    def api_ready(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.5):
            return True
        return False

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.processes.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(30)

    def stop(self) -> None:
        for name in list(self.processes):
            self.kill(name, signal.SIGTERM)

    def output(self, name: str) -> str:
        path = self.home / f"{name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    # -- reading the metadata database ------------------------------------------------

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.metadata_url is None:
            with contextlib.closing(sqlite3.connect(self.home / "airflow.db", timeout=30)) as db:
                return list(db.execute(sql, params).fetchall())
        import psycopg2

        with contextlib.closing(psycopg2.connect(self.metadata_url.replace("+psycopg2", ""))) as db:
            cur = db.cursor()
            cur.execute(sql.replace("?", "%s"), params)
            return list(cur.fetchall())

    def task_states(self, dag_id: str) -> dict[str, str | None]:
        rows = self.query("SELECT task_id, state FROM task_instance WHERE dag_id = ?", (dag_id,))
        return {task_id: state for task_id, state in rows}

    def task_rows(self, dag_id: str) -> list[dict[str, Any]]:
        cols = ("task_id", "state", "try_number", "external_executor_id", "queued_dttm",
                "start_date", "end_date", "executor")
        rows = self.query(f"SELECT {', '.join(cols)} FROM task_instance WHERE dag_id = ?",
                          (dag_id,))
        return [dict(zip(cols, row, strict=True)) for row in rows]

    def wait_dag_done(self, dag_id: str, expected_tasks: int, timeout: float) -> dict[str, Any]:
        def done() -> bool:
            states = self.task_states(dag_id)
            finished = {"success", "failed", "upstream_failed", "skipped"}
            return len(states) >= expected_tasks and all(s in finished for s in states.values())

        wait_for(done, timeout, f"DAG {dag_id} to finish", self.diagnose)
        return self.task_states(dag_id)

    def diagnose(self) -> str:
        tails = [f"--- {p.name}\n" + p.read_text(errors="replace")[-3000:]
                 for p in sorted(self.home.glob("*.out"))]
        return "\n".join(tails)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str,
             diagnose: Callable[[], str] | None = None, interval: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    detail = diagnose() if diagnose else ""
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{detail}")


@contextlib.contextmanager
def deployment(**kwargs: Any) -> Iterator[AirflowDeployment]:
    dep = AirflowDeployment(**kwargs)
    dep.migrate()
    try:
        yield dep
    finally:
        dep.stop()
