"""gpu_pool_quota_alerts (every 15 minutes): quota-expiry, run-past-expiry and GPU-hour
budget notices, and the notice before the peak to owners of off-peak work still running
(which must come inside ``Policy.off_peak_notice``, 30 minutes by default: hence the
schedule; every other notice is still sent once, however often this runs).

Each notice goes out once per quota and threshold, however often this runs (the ops table
``ops_notifications`` holds the key). Settings: Airflow Variable ``gpu_pool_ops``; channels:
the SMTP connection ``gpu_pool_smtp`` and each team's webhook (see the README).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from airflow.sdk import dag, task


@dag(dag_id="gpu_pool_quota_alerts", schedule="*/15 * * * *", start_date=datetime(2026, 1, 1),
     catchup=False, max_active_runs=1, tags=["gpu-pool", "ops"],
     default_args={"retries": 3, "retry_delay": timedelta(minutes=5)})
def gpu_pool_quota_alerts() -> None:
    @task
    def send_quota_alerts() -> dict[str, int]:
        from gpu_pool.ops import airflow_adapters as af
        from gpu_pool.ops.runs import run_alerts

        config = af.ops_config()
        result = run_alerts(af.open_store(), af.team_channels(config), config,
                            datetime.now(UTC))
        from gpu_pool.telemetry import Metrics

        Metrics("task").alerts_sent(len(result.sent))
        for key, error in result.failed:
            print(f"not delivered ({key.kind} {key.subject} {key.threshold}): {error}")
        if result.failed:
            raise RuntimeError(f"{len(result.failed)} notices could not be delivered; "
                               "they are retried on the next try")
        return {"sent": len(result.sent), "already_sent": len(result.already)}

    send_quota_alerts()


gpu_pool_quota_alerts()
