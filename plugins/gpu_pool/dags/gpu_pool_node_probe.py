"""gpu_pool_node_probe (every minute): read every node's GPUs over SSH into the store.

Marks unreachable nodes down and answering ones up again, appends utilisation samples
(``gpu_samples``) and records processes on GPUs that gpu-pool did not hand out.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import dag, task


@dag(dag_id="gpu_pool_node_probe", schedule=timedelta(minutes=1),
     start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=1,
     tags=["gpu-pool", "ops"], default_args={"retries": 0})
def gpu_pool_node_probe() -> None:
    @task(execution_timeout=timedelta(minutes=2))
    def probe_fleet() -> dict[str, int]:
        from gpu_pool.ops import airflow_adapters as af
        from gpu_pool.ops.runs import run_probe

        result = run_probe(af.open_store(), af.probe_over_ssh, datetime.now(UTC))
        for name in result.down:
            print(f"node {name} is down")
        for proc in result.foreign:
            print(f"foreign process {proc.pid} on {proc.node} GPU {proc.gpu_index}")
        return {"probed": len(result.probed), "down": len(result.down),
                "foreign_processes": len(result.foreign)}

    probe_fleet()


gpu_pool_node_probe()
