"""gpu_pool_reclaim_sweep (every 5 minutes): free GPUs whose task is gone, flag idle holds.

A hold is released only when Airflow says its task instance is finished, failed, removed or
up for retry (see ``gpu_pool.ops.reclaim``); every action leaves a row in ``ops_reclaims``.
Idle holds are warned about or ended per the Variable ``gpu_pool_ops`` (``idle_action``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import dag, task


@dag(dag_id="gpu_pool_reclaim_sweep", schedule=timedelta(minutes=5),
     start_date=datetime(2026, 1, 1), catchup=False, max_active_runs=1,
     tags=["gpu-pool", "ops"], default_args={"retries": 2, "retry_delay": timedelta(minutes=1)})
def gpu_pool_reclaim_sweep() -> None:
    @task
    def sweep() -> dict[str, int]:
        from gpu_pool.ops import airflow_adapters as af
        from gpu_pool.ops.runs import run_sweep

        config = af.ops_config()
        result = run_sweep(af.open_store(), af.sdk_liveness, af.team_channels(config), config,
                           datetime.now(UTC))
        for record in result.records:
            print(f"{record.action}: {record.request_name or record.node} - {record.reason}")
        return {"released": len(result.plan.dead), "idle": len(result.plan.idle),
                "kept": len(result.plan.kept)}

    sweep()


gpu_pool_reclaim_sweep()
