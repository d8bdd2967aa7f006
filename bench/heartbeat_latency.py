"""How long GpuPoolExecutor.heartbeat() takes, with 0 and with N held GPU tasks.

The heartbeat runs inside the scheduler loop, so its wall time is latency added to every
scheduler iteration. Measured: the steady state of a saturated fleet (its GPUs held by
requests of another scheduler), N GPU workloads held by this executor waiting for
capacity, and ``idle_replan_seconds = 0`` so *every* heartbeat loads a snapshot, plans all
N pending requests and applies the (empty) plan. Nothing is started, so no task process
disturbs the timing. Not measured here: a heartbeat in which GPUs have just freed also
pays one full engine plan with the CP-SAT search, which ``bench/placement_scale.py``
times (bounded by the solver's wall-clock cap, twice ``Policy.solver_time_limit_s``).

Run::

    .venv/bin/python bench/heartbeat_latency.py            # 0 and 500 held tasks
    .venv/bin/python bench/heartbeat_latency.py --held 0 500 2000 --beats 30

Prints one line per N: the admission phase (the executor records at most
``[gpu_pool] max_admit_per_heartbeat`` new requests per beat; its slowest beat) and the
median / p95 / max of the steady-state heartbeats that follow, in milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any


def _prepare_env(home: Path) -> None:
    os.environ["AIRFLOW_HOME"] = str(home)
    os.environ["AIRFLOW__API_AUTH__JWT_SECRET"] = "bench-secret"
    os.environ["AIRFLOW__CORE__LOAD_EXAMPLES"] = "False"
    os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{home / 'airflow.db'}"
    os.environ["AIRFLOW__GPU_POOL__IDLE_REPLAN_SECONDS"] = "0"
    os.environ["AIRFLOW__GPU_POOL__MAX_HELD_TASKS"] = "100000"


def _workload(i: int, spec: dict[str, Any]) -> Any:
    from airflow.executors.workloads import ExecuteTask
    from airflow.executors.workloads.base import BundleInfo
    from airflow.executors.workloads.task import TaskInstanceDTO

    ti = TaskInstanceDTO(
        id=uuid.uuid4(), task_id=f"train_{i}", dag_id="bench", run_id="r1", try_number=1,
        dag_version_id=uuid.uuid4(), map_index=-1, pool_slots=1, priority_weight=1,
        executor_config={"gpu_pool": spec},
    )
    return ExecuteTask(ti=ti, dag_rel_path=Path("bench.py"),
                       bundle_info=BundleInfo(name="dags-folder"), log_path=None, token="")


def fill_fleet(store: Any, nodes: int = 8, gpus: int = 8) -> None:
    """A fleet whose every GPU is held by requests of another scheduler."""
    from gpu_pool.engine import plan
    from gpu_pool.model import Policy, Team
    from gpu_pool.spec import parse_node, parse_request

    store.upsert_team(Team("bench"), actor="bench")
    store.import_nodes([parse_node({"name": f"n{i:02d}", "gpu_model": "A100", "gpus": gpus,
                                    "cpu": 64, "memory": "512GiB",
                                    "ssh_conn_id": f"gpu_node_n{i:02d}"})
                        for i in range(nodes)], actor="bench")
    now = datetime.now(UTC)
    for i in range(nodes):
        store.submit_request(parse_request({"name": f"other-{i}", "team": "bench",
                                            "gpus": gpus}), actor="bench", now=now)
    store.apply_plan(plan(store.load_snapshot(Policy(), now)), now, "bench")
    held = sum(len(a.gpu_indices) for a in store.active_allocations())
    assert held == nodes * gpus, f"fleet not full: {held} of {nodes * gpus} GPUs held"


def measure(held: int, beats: int, store_url: str) -> dict[str, float]:
    from gpu_pool.executor import GpuPoolExecutor

    executor = GpuPoolExecutor()
    executor.start()
    assert executor.cycle is not None
    fill_fleet(executor.cycle.store)
    for i in range(held):
        wl = _workload(i, {"team": "bench", "gpus": 1 + i % 4})
        executor.queued_tasks[wl.ti.key] = wl
    admitting = []
    while len(executor._names) < held or not admitting:  # admission is batched per beat
        t0 = time.perf_counter()
        executor.heartbeat()
        admitting.append(time.perf_counter() - t0)
    first = max(admitting)
    times = []
    for _ in range(beats):
        t0 = time.perf_counter()
        executor.heartbeat()
        times.append(time.perf_counter() - t0)
    assert not executor.running, "the bench fleet must be full: nothing may start"
    assert len(executor.queued_tasks) == held
    times.sort()
    return {
        "admit_beats": float(len(admitting)),
        "first_ms": first * 1000,
        "median_ms": statistics.median(times) * 1000,
        "p95_ms": times[int(0.95 * (len(times) - 1))] * 1000,
        "max_ms": times[-1] * 1000,
        "store": store_url,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--held", type=int, nargs="+", default=[0, 500])
    parser.add_argument("--beats", type=int, default=20)
    parser.add_argument("--store-url", default=None,
                        help="store URL (default: a fresh SQLite file per run)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).parent))
    with tempfile.TemporaryDirectory(prefix="gpu-pool-bench-") as tmp:
        _prepare_env(Path(tmp))
        import subprocess

        subprocess.run([str(Path(sys.executable).with_name("airflow")), "db", "migrate"],
                       check=True, capture_output=True)
        for n in args.held:
            url = args.store_url or f"sqlite:///{tmp}/store-{n}.db"
            os.environ["AIRFLOW__GPU_POOL__STORE_URL"] = url
            r = measure(n, args.beats, url)
            print(f"held={n:5d}  admission: {r['admit_beats']:.0f} beats, worst {r['first_ms']:7.1f} ms"
                  f"  |  steady: median={r['median_ms']:7.1f} ms"
                  f"  p95={r['p95_ms']:7.1f} ms  max={r['max_ms']:7.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
