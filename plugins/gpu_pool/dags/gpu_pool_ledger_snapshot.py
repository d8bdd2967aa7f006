"""gpu_pool_ledger_snapshot (hourly): ledger, fleet, queue and events to object storage,
and the monthly per-team report once a month is over.

Keys are deterministic (``ledger/dt=2026-12-01/part-0.parquet``): a rerun overwrites. If the
object store is down the task fails with a clear message and retries; the next run catches
up every missed day and month (``ops_exports`` records what was written).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import dag, task


@dag(dag_id="gpu_pool_ledger_snapshot", schedule="@hourly", start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["gpu-pool", "ops"],
     default_args={"retries": 3, "retry_delay": timedelta(minutes=10)})
def gpu_pool_ledger_snapshot() -> None:
    @task
    def export_snapshots() -> list[str]:
        from gpu_pool.ops import airflow_adapters as af
        from gpu_pool.ops.runs import records_for, run_snapshots
        from gpu_pool.ops.snapshot import DATASET
        from gpu_pool.telemetry import Metrics

        config = af.ops_config()
        objstore = af.object_store(config)
        if not objstore.keeps_history():
            print("The bucket has no versioning: each export goes under an exported_at= "
                  "folder of its own, so no rerun replaces an earlier snapshot")
        store, now = af.open_store(), datetime.now(UTC)
        # Read before exporting: a lag that grows run after run is an export that keeps failing.
        Metrics("task").export_lag(records_for(store).last_exported_at(DATASET), now)
        done = run_snapshots(store, objstore, config, now)
        return [d.period.isoformat() for d in done]

    @task
    def monthly_reports() -> list[str]:
        from gpu_pool.cli.context import policy
        from gpu_pool.ops import airflow_adapters as af
        from gpu_pool.ops.runs import months_due, run_report

        config = af.ops_config()
        store, now = af.open_store(), datetime.now(UTC)
        objstore = af.object_store(config)
        months = months_due(store, now)
        for month in months:
            run_report(store, objstore, month, policy(), now)
        return months

    export_snapshots() >> monthly_reports()


gpu_pool_ledger_snapshot()
