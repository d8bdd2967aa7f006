"""End to end on a real Airflow 3.3 (SQLite): scheduler, dag-processor, api-server, triggerer.

One deployment serves the module: a gpu-pool store with two real OpenSSH sshd "GPU nodes"
on loopback (node-a: 4 x A100, node-b: 2 x T4, fake ``nvidia-smi``), Airflow configured with
``LocalExecutor,GpuPool:gpu_pool.executor.GpuPoolExecutor`` and a short
``task_queued_timeout`` (checked every 3 s) so that every GPU task that waits for capacity
longer than that also tests that the stuck-in-queued check never requeues or fails it.
(Shorter than ~60 s fails *ordinary* tasks on a loaded 2-core machine: the queue-time token
of a LocalExecutor workload lives only ``task_queued_timeout`` seconds.)

Each test copies its DAG file into the DAGs folder; DAGs run ``@once`` unpaused.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpu_pool.model import Team
from gpu_pool.spec import parse_node
from gpu_pool.store import Store
from tests.airflow.e2e_checks import gpu_overlaps, read_probes
from tests.airflow.harness import AirflowDeployment, deployment, wait_for
from tests.sshd.fleet import Fleet, start_fleet

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

DAG_FILES = Path(__file__).parent / "dag_files"
FLEET = [("node-a", "A100", 4), ("node-b", "T4", 2)]
QUEUED_TIMEOUT_S = 60


@dataclass
class E2E:
    dep: AirflowDeployment
    store: Store
    fleet: Fleet
    out: Path
    dags: Path

    def run_dag(self, dag_id: str, tasks: int, timeout: float = 240) -> dict[str, str | None]:
        shutil.copy(DAG_FILES / f"{dag_id}.py", self.dags / f"{dag_id}.py")
        return self.dep.wait_dag_done(dag_id, tasks, timeout)

    def ti(self, dag_id: str) -> dict[str, dict]:
        return {r["task_id"]: r for r in self.dep.task_rows(dag_id)}

    def request_names(self, dag_id: str) -> dict[str, str]:
        return dict(self.store_rows("SELECT task_id, name FROM requests WHERE dag_id = :d",
                                    d=dag_id))

    def submitted_at(self, dag_id: str) -> dict[str, float]:
        rows = self.store_rows("SELECT task_id, submitted_at FROM requests WHERE dag_id = :d",
                               d=dag_id)
        return {task_id: _ts(at) for task_id, at in rows}

    def store_rows(self, sql: str, **params: object) -> list[tuple]:
        from sqlalchemy import text

        with self.store.engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(sql), params)]


def register_fleet(store: Store, fleet: Fleet) -> None:
    store.import_nodes([
        parse_node({"name": name, "gpu_model": model, "gpus": count, "cpu": 32,
                    "memory": "256GiB", "ssh_conn_id": fleet[name].conn_id})
        for name, model, count in FLEET], actor="e2e")
    store.upsert_team(Team("nlp"), actor="e2e")


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    root = tmp_path_factory.mktemp("e2e")
    out, dags = root / "out", root / "dags"
    out.mkdir()
    dags.mkdir()
    shutil.copy(DAG_FILES / "e2e_common.py", dags / "e2e_common.py")
    with start_fleet(root / "fleet", FLEET) as fleet:
        store_url = f"sqlite:///{root / 'store.db'}"
        store = Store.from_url(store_url)
        store.migrate()
        register_fleet(store, fleet)
        with deployment(
            home=root / "home", dags_folder=dags, store_url=store_url,
            extra_env={**fleet.airflow_env(), "GPU_POOL_E2E_OUT": str(out)},
            overrides={"scheduler": {"task_queued_timeout": QUEUED_TIMEOUT_S,
                                     "task_queued_timeout_check_interval": 3}},
        ) as dep:
            dep.start_all(triggerer=True)
            yield E2E(dep, store, fleet, out, dags)


def _ts(value: str | datetime) -> float:
    """Epoch seconds of a database timestamp; naive ones are UTC (both stores write UTC)."""
    when = value if isinstance(value, datetime) else datetime.fromisoformat(
        str(value).replace(" ", "T"))
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def assert_released(e2e: E2E, dag_id: str, within_s: float = 20) -> None:
    """Every GPU request of the DAG released (the executor reaps within a few heartbeats)."""
    names = e2e.request_names(dag_id)

    def held() -> set[str]:
        return {a.request_name for a in e2e.store.active_allocations()} & set(names.values())

    wait_for(lambda: not held(), within_s, f"release of {held()}", e2e.dep.diagnose)
    ledgered = {entry.request_name for entry in e2e.store.ledger()}
    assert set(names.values()) <= ledgered, f"no ledger row for {set(names.values()) - ledgered}"


def assert_never_requeued(e2e: E2E, dag_id: str) -> None:
    rows = e2e.dep.query("SELECT event FROM log WHERE dag_id = ? AND event LIKE '%stuck%'",
                         (dag_id,))
    assert rows == [], f"stuck-in-queued handling touched GPU tasks: {rows}"
    tries = {r["task_id"]: r["try_number"] for r in e2e.dep.task_rows(dag_id)
             if r["executor"] == "GpuPool"}
    assert tries and set(tries.values()) == {1}, tries


def test_one_gpu_task_is_placed_run_and_released(e2e: E2E) -> None:
    states = e2e.run_dag("e2e_one_gpu", 2, timeout=180)
    assert states == {"gpu_probe": "success", "ordinary": "success"}, e2e.dep.diagnose()
    tis = e2e.ti("e2e_one_gpu")
    assert tis["gpu_probe"]["executor"] == "GpuPool"
    import json

    seen = json.loads((e2e.out / "gpu_probe.json").read_text())
    node, indices = seen["GPU_POOL_NODE"], seen["GPU_POOL_GPU_INDICES"]
    assert node in dict((n, m) for n, m, _ in FLEET)
    assert seen["CUDA_VISIBLE_DEVICES"] == indices and len(indices.split(",")) == 1
    assert seen["GPU_POOL_SSH_CONN_ID"] == e2e.fleet[node].conn_id
    assert tis["gpu_probe"]["external_executor_id"] == f"gpu://{node}/{indices}"
    assert_released(e2e, "e2e_one_gpu")
    queued_to_running = _ts(tis["gpu_probe"]["start_date"]) - _ts(tis["gpu_probe"]["queued_dttm"])
    (e2e.out.parent / "queued_to_running.txt").write_text(f"{queued_to_running:.2f}\n")
    print(f"queued-to-running of a GPU task on an idle fleet: {queued_to_running:.2f} s")


def test_twelve_mixed_gpu_tasks_on_a_six_gpu_fleet(e2e: E2E) -> None:
    states = e2e.run_dag("e2e_fleet", 13, timeout=400)
    assert set(states.values()) == {"success"}, (states, e2e.dep.diagnose())
    tis = e2e.ti("e2e_fleet")
    gpu_tasks = [t for t in tis if t != "gate"]
    assert_released(e2e, "e2e_fleet")
    probes = read_probes(e2e.out)
    ledger = {entry.request_name: entry for entry in e2e.store.ledger()}
    names = e2e.request_names("e2e_fleet")
    submitted = e2e.submitted_at("e2e_fleet")
    assert set(names) == set(gpu_tasks)
    for task_id in gpu_tasks:
        probe = probes[task_id]
        # The node the command really ran on (its sshd says so) and the GPUs it saw are
        # exactly what the executor published for the task instance.
        share = f"@{probe.milli}m" if probe.milli < 1000 else ""
        assert tis[task_id]["external_executor_id"] == (
            f"gpu://{probe.node}/{','.join(map(str, probe.cuda))}{share}"), task_id
        assert ledger[names[task_id]].node == probe.node
        assert probe.end is not None, f"{task_id} did not finish on the node"
        # What the command wrote to $GPU_POOL_METRICS_FILE went through XCom to the ledger.
        assert ledger[names[task_id]].metrics.get("probe_seconds") == 25.0, task_id
    sizes = {"big_a100": 4, "pair_1": 2, "pair_2": 2, "pair_3": 2, "one_1": 1, "critical": 1}
    for task_id, size in sizes.items():
        assert len(probes[task_id].cuda) == size
    assert probes["big_a100"].node == "node-a"
    assert probes["half_1"].milli == probes["half_2"].milli == 500
    assert gpu_overlaps(probes[t] for t in gpu_tasks) == []
    # The critical task was submitted last, behind waiting lower-priority work, and was placed
    # no later than any of the tasks that were still waiting when it arrived.
    placed = {t: ledger[names[t]].started_at.timestamp() for t in gpu_tasks}
    waiting = [t for t in gpu_tasks if t != "critical"
               and submitted[t] < submitted["critical"] < placed[t]]
    assert waiting, "the test needs lower-priority tasks waiting when the critical one arrives"
    for task_id in waiting:
        assert placed["critical"] <= placed[task_id], task_id
    # Some GPU tasks sat in QUEUED (submitted, not placed) past task_queued_timeout ...
    longest_wait = max(placed[t] - submitted[t] for t in gpu_tasks)
    print(f"longest wait from submitted to placed: {longest_wait:.1f} s")
    assert longest_wait > QUEUED_TIMEOUT_S + 3, f"no GPU task waited past the timeout ({longest_wait})"
    # ... and the stuck-in-queued check never requeued or failed one of them.
    assert_never_requeued(e2e, "e2e_fleet")


def test_data_not_ready_holds_no_gpu_until_the_asset_event(e2e: E2E) -> None:
    shutil.copy(DAG_FILES / "e2e_data_ready.py", e2e.dags / "e2e_data_ready.py")

    def train_request() -> str | None:
        return e2e.request_names("e2e_data_ready").get("train")

    wait_for(lambda: train_request() is not None, 120, "the train request", e2e.dep.diagnose)
    name = train_request()
    held_while_waiting = []
    reasons_while_waiting = set()
    while e2e.dep.task_states("e2e_data_ready").get("produce") != "success":
        held_while_waiting += [a for a in e2e.store.active_allocations() if a.request_name == name]
        reason = e2e.store.request_reason(name)
        reasons_while_waiting.add(reason[0] if reason else None)
        assert e2e.dep.task_states("e2e_data_ready").get("produce") != "failed"
        time.sleep(0.5)
    assert held_while_waiting == []
    # Read while produce ran: once it succeeds the event may place train (and clear its
    # reason) before this loop sees the success.
    assert "data_not_ready" in reasons_while_waiting, reasons_while_waiting
    states = e2e.dep.wait_dag_done("e2e_data_ready", 2, 180)
    assert states == {"produce": "success", "train": "success"}
    event_at = e2e.dep.query("SELECT timestamp FROM asset_event")[0][0]
    assert read_probes(e2e.out)["data_train"].start > _ts(event_at)
    assert_released(e2e, "e2e_data_ready")


def test_time_limit_kills_the_remote_process_group(e2e: E2E) -> None:
    states = e2e.run_dag("e2e_time_limit", 1, timeout=180)
    assert states == {"overrun": "failed"}
    probe = read_probes(e2e.out)["overrun"]
    assert probe.end is None
    groups = e2e.fleet[probe.node].sh("ps -eo pgid=").stdout.split()
    assert str(probe.pgid) not in groups, "the remote process group survived the time limit"
    assert_released(e2e, "e2e_time_limit")


def test_scheduler_killed_mid_run_is_restarted_and_adopts(e2e: E2E) -> None:
    shutil.copy(DAG_FILES / "e2e_restart.py", e2e.dags / "e2e_restart.py")
    dep = e2e.dep

    def both_running() -> bool:
        probes = read_probes(e2e.out)
        return all(p in probes for p in ("long_1", "long_2"))

    wait_for(both_running, 180, "both long tasks to start on the nodes", dep.diagnose)
    held_before = {a.request_name for a in e2e.store.active_allocations()}
    dep.kill("scheduler", signal.SIGKILL)
    # A crashed scheduler is declared dead after [scheduler] scheduler_health_check_threshold
    # (8 s here); the new one adopts at start-up once that has passed.
    time.sleep(12)
    dep.start("scheduler")
    states = dep.wait_dag_done("e2e_restart", 2, 240)
    assert states == {"long_1": "success", "long_2": "success"}, dep.diagnose()
    probes = read_probes(e2e.out)
    assert probes["long_1"].end is not None and probes["long_2"].end is not None
    assert {r["try_number"] for r in dep.task_rows("e2e_restart")} == {1}
    restarted = dep.output(max(dep.processes, key=lambda n: n.startswith("scheduler")))
    assert restarted.count("Adopted GPU task") == 2, "the new scheduler must adopt both tasks"
    names = set(e2e.request_names("e2e_restart").values())
    assert names <= held_before
    assert_released(e2e, "e2e_restart")
    finished = [p for p in read_probes(e2e.out).values() if p.end is not None]
    assert gpu_overlaps(finished) == []  # across every task of the module that finished
