"""``gpu-pool demo --airflow``: gpu-pool inside a real Airflow, on a simulated fleet.

What it does, in order:

1. lays out a fresh demo home (default ``.demo/airflow``): the Airflow home with its SQLite
   metadata database, and the gpu-pool store ``gpu_pool.db`` beside it;
2. starts a simulated fleet: one embedded SSH server per node on loopback
   (:mod:`gpu_pool.simnode`), each with a fake ``nvidia-smi``; the nodes go into the store,
   each with the Airflow connection that reaches it (``AIRFLOW_CONN_GPU_NODE_*``);
3. starts ``airflow standalone`` (scheduler, dag-processor, triggerer, api-server) with
   ``executor = LocalExecutor,GpuPool:gpu_pool.executor.GpuPoolExecutor`` and the example
   DAGs of ``dags/``;
4. unpauses and triggers the example DAGs, then prints, as it happens, every request
   submitted, every placement (node and GPUs), why waiting requests wait, and every release;
5. when the runs end, prints each GPU task's state, placement and GPU-hours from the ledger,
   and stops Airflow (``--keep-running`` leaves it up to browse the UI until Ctrl-C).

Stopping: SIGINT, SIGTERM or SIGHUP (also when the demo runs in the background, where a
shell starts it with SIGINT ignored) stop every process the demo started, the scheduler's
task processes included, before it exits. The api-server listens on 127.0.0.1 unless
``--host`` says otherwise, and ``[core] parallelism`` is sized to the machine (LocalExecutor
forks that many workers up front).

Exit status 0 when every task of the triggered runs succeeded and no GPU stayed held, 1
otherwise (and on a time-out, with the tail of Airflow's output).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from gpu_pool import airflow_config
from gpu_pool.errors import GpuPoolError, SpecError

ACTOR = "demo"
MARKER = ".gpu-pool-demo"
FLEET = (("sim-a100-1", "A100", 4), ("sim-h100-1", "H100", 2), ("sim-t4-1", "T4", 2))
DAG_IDS = ("example_gpu_training", "example_gpu_sweep")
TEAMS = ("nlp", "vision")
FINISHED = frozenset({"success", "failed", "upstream_failed", "skipped", "removed"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--airflow", action="store_true",
                        help="run the demo in a real Airflow (standalone) on a simulated fleet")
    parser.add_argument("--home", type=Path, default=Path(".demo/airflow"),
                        help="with --airflow: the demo's folder, wiped on start "
                             "(default .demo/airflow)")
    parser.add_argument("--dags", type=Path, default=None,
                        help="with --airflow: the DAGs folder (default: the dags/ folder of "
                             "this checkout)")
    parser.add_argument("--port", default="8080",
                        help="with --airflow: the api-server's port (default 8080)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="with --airflow: the address the api-server listens on (default "
                             "127.0.0.1: this machine only; 0.0.0.0 for every interface)")
    parser.add_argument("--timeout", default="600",
                        help="with --airflow: give up after this many seconds (default 600)")
    parser.add_argument("--keep-running", action="store_true",
                        help="with --airflow: keep Airflow up after the runs, until Ctrl-C")


def airflow_demo(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from gpu_pool.spec import parse_int, parse_number

    out = out or sys.stdout
    args.port = parse_int(args.port, "port", minimum=1, maximum=65535,
                          hint="a TCP port from 1 to 65535")
    args.timeout = parse_number(args.timeout, "timeout", maximum=86_400, strict=True)
    _check_host(args.host)
    dags = _dags_folder(args.dags)
    home = _fresh_home(args.home)  # after every value is checked: it wipes a previous demo
    if _port_taken(args.port):
        raise SpecError("port", args.port,
                        "a free port (this one is taken: stop what listens there, or pass "
                        "--port with another)")
    from gpu_pool.simnode.server import airflow_env, sim_fleet

    say = _Say(out)
    with _stopped_by_signals(), sim_fleet(home / "fleet", FLEET) as nodes:
        store_url = f"sqlite:///{home / 'gpu_pool.db'}"
        store = _prepare_store(store_url, nodes)
        say(f"Fleet: {', '.join(f'{n} ({c} x {m})' for n, m, c in FLEET)}: simulated nodes, "
            "each a real SSH server on 127.0.0.1 with a fake nvidia-smi")
        airflow = _Standalone(home, dags, store_url, args.port, airflow_env(nodes), args.host)
        say(f"Starting airflow standalone in {home} (about a minute) ...")
        airflow.start()
        try:
            return _run(airflow, store, say, args)
        except _Stop as stop:  # before the runs ended: they did not all succeed
            say(f"\n{stop}: stopping Airflow and every process the demo started")
            return 1
        finally:
            airflow.stop()
            store.close()


class _Stop(BaseException):  # noqa: N818 - not an error: a request to stop
    """A stop signal arrived (raised from the signal handler, unwinds to ``finally``)."""


@contextlib.contextmanager
def _stopped_by_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise :class:`_Stop` inside, whatever they did before.

    A shell starts a background job with SIGINT ignored, and SIGTERM's default ends Python
    without running ``finally``: either way Airflow and its workers were left behind.
    """
    def stop(signum: int, _frame: object) -> None:
        raise _Stop(f"got {signal.Signals(signum).name}")

    wanted = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {sig: signal.signal(sig, stop) for sig in wanted}
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _check_host(host: str) -> None:
    import ipaddress

    try:
        ipaddress.ip_address(host)
    except ValueError:
        raise SpecError("host", host, "an IP address to listen on, such as 127.0.0.1 (this "
                        "machine only) or 0.0.0.0 (every interface)") from None


def demo_parallelism() -> int:
    """``[core] parallelism`` for this machine: LocalExecutor forks that many workers at
    start, 32 by default, whatever the cores."""
    return max(4, min(32, 2 * (os.cpu_count() or 1)))


def _run(airflow: _Standalone, store: Any, say: _Say, args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.timeout
    airflow.wait(airflow.api_ready, deadline, "the Airflow api-server to answer")
    airflow.wait(lambda: airflow.parsed(DAG_IDS), deadline, "the example DAGs to be parsed")
    for dag_id in DAG_IDS:
        airflow.cli("dags", "unpause", dag_id)
        airflow.cli("dags", "trigger", dag_id)
    say(f"Airflow is up at http://127.0.0.1:{args.port} (user admin, password in "
        f"{airflow.home / 'simple_auth_manager_passwords.json.generated'}); "
        f"triggered {', '.join(DAG_IDS)}\n")
    watch = _Watch(store, say)
    while True:
        watch.poll()
        if airflow.runs_done(DAG_IDS) and not watch.held(DAG_IDS):
            break
        if time.monotonic() > deadline:
            say(f"gave up after {args.timeout:.0f} s; the tail of Airflow's output:\n"
                + airflow.tail())
            return 1
        if airflow.exited():
            say("airflow standalone exited early; the tail of its output:\n" + airflow.tail())
            return 1
        time.sleep(1.0)
    watch.poll()
    ok = _summary(airflow, store, say)
    if args.keep_running:
        say(f"\nAirflow keeps running at http://127.0.0.1:{args.port} (GPU pool page: "
            f"/gpu-pool/); Ctrl-C to stop.")
        try:
            while not airflow.exited():  # until a signal (Ctrl-C) raises _Stop
                time.sleep(1.0)
        except _Stop as stop:
            say(f"\n{stop}: stopping Airflow and every process the demo started")
    return 0 if ok else 1


# -- the demo home, fleet and store ------------------------------------------------------


def _fresh_home(home: Path) -> Path:
    """Wipe a previous demo's folder; refuse to wipe a folder the demo did not make."""
    home = home.expanduser().resolve()
    if home.exists() and any(home.iterdir()):
        if not (home / MARKER).exists():
            raise SpecError("home", str(home),
                            "an empty folder or one a previous demo made (it holds other "
                            "files, which the demo would delete)")
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    (home / MARKER).write_text("made by gpu-pool demo --airflow; wiped by the next one\n")
    return home


def _dags_folder(dags: Path | None) -> Path:
    if dags is None:
        from gpu_pool.cli.dags import PACKAGED

        dags = PACKAGED  # the DAGs shipped in the package
    dags = dags.expanduser().resolve()
    if not all((dags / f"{dag_id}.py").is_file() for dag_id in DAG_IDS):
        raise SpecError("dags", str(dags), "a folder holding "
                        + " and ".join(f"{d}.py" for d in DAG_IDS)
                        + " (gpu-pool's own: `gpu-pool dags install FOLDER` copies them)")
    return dags


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _prepare_store(url: str, nodes: dict[str, Any]) -> Any:
    from gpu_pool.model import Team
    from gpu_pool.spec import parse_node
    from gpu_pool.store import Store

    store = Store.from_url(url)
    store.migrate()
    store.import_nodes([
        parse_node({"name": name, "zone": "demo", "gpu_model": model, "gpus": count,
                    "cpu": 32, "memory": "256GiB", "ssh_conn_id": nodes[name].conn_id})
        for name, model, count in FLEET], actor=ACTOR)
    for team in TEAMS:
        store.upsert_team(Team(team), actor=ACTOR)
    return store


# -- airflow standalone ------------------------------------------------------------------


@dataclass
class _Standalone:
    home: Path
    dags: Path
    store_url: str
    port: int
    conns: dict[str, str]
    host: str = "127.0.0.1"
    process: subprocess.Popen[bytes] | None = None
    binary: str = field(default_factory=lambda: str(Path(sys.executable).with_name("airflow")))

    @property
    def env(self) -> dict[str, str]:
        values = airflow_config.settings(
            store_url=self.store_url, dags_folder=self.dags, idle_replan_seconds=1.0,
            extra={
                "core": {"execution_api_server_url": f"http://127.0.0.1:{self.port}/execution/",
                         "min_serialized_dag_update_interval": 1,
                         "parallelism": demo_parallelism()},
                "api": {"host": self.host, "port": self.port,
                        "base_url": f"http://127.0.0.1:{self.port}"},
                "dag_processor": {"refresh_interval": 5},
                "scheduler": {"scheduler_heartbeat_sec": 1},
                "logging": {"base_log_folder": str(self.home / "logs")},
                "workers": {"execution_api_timeout": 60},
            })
        env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
        env.update(airflow_config.as_environment(values))
        env.update(self.conns)
        env.update({"AIRFLOW_HOME": str(self.home), "PYTHONUNBUFFERED": "1",
                    "GPU_POOL_DB_URL": self.store_url,
                    # standalone starts its components as `airflow ...` from PATH
                    "PATH": os.pathsep.join([str(Path(self.binary).parent),
                                             env.get("PATH", os.defpath)])})
        return env

    def start(self) -> None:
        log = open(self.home / "standalone.out", "ab")  # noqa: SIM115 - owned by the process
        self.process = subprocess.Popen([self.binary, "standalone"], env=self.env, stdout=log,
                                        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=self.home, start_new_session=True)

    def stop(self) -> None:
        """Stop standalone and every process under it, those in sessions of their own too
        (the GPU executor starts task processes that way, so they outlive a scheduler)."""
        import psutil

        if self.process is None:
            return
        try:
            tree = [psutil.Process(self.process.pid),
                    *psutil.Process(self.process.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)  # standalone stops its components
        _, alive = psutil.wait_procs(tree, timeout=30)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        psutil.wait_procs(alive, timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def tail(self, chars: int = 4000) -> str:
        path = self.home / "standalone.out"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def cli(self, *args: str) -> str:
        done = subprocess.run([self.binary, *args], env=self.env, capture_output=True,
                              text=True, timeout=180, check=False, cwd=self.home)
        if done.returncode != 0:
            raise GpuPoolError(f"airflow {' '.join(args)} exited {done.returncode}: "
                               f"{(done.stderr.strip().splitlines() or ['?'])[-1]}")
        return done.stdout

    def wait(self, ready: Callable[[], bool], deadline: float, what: str) -> None:
        while not ready():
            if self.exited():
                raise GpuPoolError("airflow standalone exited while waiting for "
                                   f"{what}; see {self.home / 'standalone.out'}")
            if time.monotonic() > deadline:
                raise GpuPoolError(f"timed out waiting for {what}; see "
                                   f"{self.home / 'standalone.out'}")
            time.sleep(1.0)

    def api_ready(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 1):
            return True
        return False

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        path = self.home / "airflow.db"
        if not path.exists():
            return []
        try:
            with contextlib.closing(sqlite3.connect(path, timeout=30)) as db:
                return list(db.execute(sql, params).fetchall())
        except sqlite3.OperationalError:  # not migrated yet, or busy: ask again later
            return []

    def parsed(self, dag_ids: tuple[str, ...]) -> bool:
        marks = ",".join("?" * len(dag_ids))
        rows = self.query(f"SELECT DISTINCT dag_id FROM serialized_dag WHERE dag_id IN ({marks})",
                          dag_ids)
        return len(rows) == len(dag_ids)

    def runs_done(self, dag_ids: tuple[str, ...]) -> bool:
        marks = ",".join("?" * len(dag_ids))
        runs = self.query(f"SELECT state FROM dag_run WHERE dag_id IN ({marks})", dag_ids)
        return len(runs) == len(dag_ids) and all(s in ("success", "failed") for (s,) in runs)

    def task_rows(self, dag_ids: tuple[str, ...]) -> list[tuple[Any, ...]]:
        marks = ",".join("?" * len(dag_ids))
        return self.query(
            "SELECT dag_id, task_id, state, executor, external_executor_id, queued_dttm, "
            f"start_date, end_date FROM task_instance WHERE dag_id IN ({marks}) "
            "ORDER BY start_date", dag_ids)


# -- watching the store ------------------------------------------------------------------


class _Say:
    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()


class _Watch:
    """Prints the store's events as they happen, and pending reasons when they change."""

    def __init__(self, store: Any, say: _Say) -> None:
        self.store = store
        self.say = say
        self.seen = 0
        self.reasons: dict[str, str] = {}
        self.allocations: dict[str, str] = {}  # allocation id -> request name

    def poll(self) -> None:
        for event in self.store.events()[self.seen:]:
            self.seen += 1
            line = self._line(event)
            if line:
                self.say(f"{event.at:%H:%M:%S}  {line}")
        for request in self.store.pending_requests():
            reason = self.store.request_reason(request.name)
            if reason and self.reasons.get(request.name) != reason[1]:
                self.reasons[request.name] = reason[1]
                self.say(f"{_clock()}  waits   {_short(request.name)}: {reason[1]}")

    def _line(self, event: Any) -> str | None:
        data = dict(event.data or {})
        if event.kind == "request.submitted":
            return (f"request {_short(event.subject)}: team {data.get('team')}, "
                    f"{data.get('gpus')} GPU(s), priority {data.get('priority')}")
        if event.kind == "allocation.created":
            self.allocations[event.subject] = str(data.get("request"))
            share = data.get("gpu_milli", 1000)
            gpus = ",".join(map(str, data.get("gpus", [])))
            return (f"placed  {_short(str(data.get('request')))} on {data.get('node')} "
                    f"GPU {gpus}" + (f" ({share}/1000 of it)" if share != 1000 else ""))
        if event.kind.startswith("allocation.") and event.kind != "allocation.created":
            name = self.allocations.get(event.subject, event.subject)
            return (f"{event.kind.split('.', 1)[1]:<7} {_short(name)}"
                    + (f": {event.reason}" if event.reason else ""))
        if event.kind == "request.data_ready":
            return f"data    {_short(event.subject)}: its dataset is ready"
        return None

    def held(self, dag_ids: tuple[str, ...]) -> list[str]:
        return [a.request_name for a in self.store.active_allocations()
                if a.request_name.split(".", 1)[0] in dag_ids]


def _short(name: str) -> str:
    """``dag.task.try@run`` without the run id, for one-line messages."""
    return name.split("@", 1)[0]


def _clock() -> str:
    return datetime.now().astimezone().strftime("%H:%M:%S")


def _summary(airflow: _Standalone, store: Any, say: _Say) -> bool:
    ledger: dict[str, list[Any]] = {}
    for entry in store.ledger():
        ledger.setdefault(entry.request_name.split("@", 1)[0].rsplit(".", 1)[0], []).append(entry)
    rows = airflow.task_rows(DAG_IDS)
    say("\nTask instances:")
    say(f"  {'task':<38} {'state':<9} {'executor':<14} {'placement':<26} GPU-hours")
    for dag_id, task_id, state, executor, external, *_ in rows:
        entries = ledger.get(f"{dag_id}.{task_id}", [])
        hours = f"{sum(e.gpu_hours for e in entries):.4f}" if entries else "-"
        say(f"  {dag_id + '.' + task_id:<38} {state or '-':<9} {executor or 'default':<14} "
            f"{external or '-':<26} {hours}")
    held = [a.request_name for a in store.active_allocations()]
    gpu_tasks = [r for r in rows if r[3] == airflow_config.EXECUTOR_ALIAS]
    ok = bool(rows) and all(r[2] == "success" for r in rows) and not held
    say(f"\n{len(gpu_tasks)} GPU tasks placed, run over SSH and released; "
        f"{len(store.ledger())} ledger rows, "
        f"{sum(e.gpu_hours for e in store.ledger()):.4f} GPU-hours; GPUs still held: "
        f"{len(held)}" + ("" if ok else "  -- NOT all tasks succeeded"))
    return ok

