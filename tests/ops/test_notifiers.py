"""The Airflow adapters read their settings from Airflow connections and Variables
(here from AIRFLOW_CONN_* / AIRFLOW_VAR_* environment variables) and deliver for real."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.airflow


@pytest.fixture
def airflow_env(monkeypatch, tmp_path, smtp_server, webhook, s3_config):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))
    monkeypatch.setenv("AIRFLOW_CONN_GPU_POOL_SMTP", json.dumps({
        "conn_type": "smtp", "host": smtp_server.host, "port": smtp_server.port,
        "extra": {"from_email": "pool@example.org", "disable_ssl": True, "disable_tls": True}}))
    monkeypatch.setenv("AIRFLOW_CONN_ML_ALERTS", json.dumps({
        "conn_type": "http", "extra": {"url": webhook.url}}))
    monkeypatch.setenv("AIRFLOW_CONN_GPU_POOL_S3", json.dumps({
        "conn_type": "aws", "login": s3_config.access_key, "password": s3_config.secret_key,
        "extra": {"endpoint_url": s3_config.endpoint_url, "bucket": s3_config.bucket,
                  "prefix": "from-conn"}}))
    monkeypatch.setenv("AIRFLOW_VAR_GPU_POOL_OPS", json.dumps({"idle_minutes": 30,
                                                               "idle_action": "end"}))
    return smtp_server, webhook


def test_email_notifier_renders_and_sends(airflow_env) -> None:
    from gpu_pool.notify.notifiers import GpuPoolEmailNotifier

    smtp, _ = airflow_env
    notifier = GpuPoolEmailNotifier(to="ops@example.org", subject="{{ task_id }} failed",
                                    message="see {{ run_id }}")
    notifier({"task_id": "train", "run_id": "manual__1"})
    (rcpts, msg), = smtp.messages
    assert rcpts == ["ops@example.org"] and msg["From"] == "pool@example.org"
    assert msg["Subject"] == "train failed" and "see manual__1" in msg.get_payload()


def test_webhook_notifier_resolves_connection(airflow_env) -> None:
    from gpu_pool.notify.notifiers import GpuPoolWebhookNotifier

    _, hook = airflow_env
    GpuPoolWebhookNotifier(target="conn:ml_alerts", subject="{{ task_id }} done",
                           message="ok")({"task_id": "eval"})
    assert hook.posts[0]["text"] == "eval done\nok"


def test_team_channels_config_and_object_store_from_airflow(airflow_env) -> None:
    from gpu_pool.notify import Notice
    from gpu_pool.ops import airflow_adapters as af

    smtp, hook = airflow_env
    config = af.ops_config()
    assert (config.idle_minutes, config.idle_action) == (30, "end")
    done = af.team_channels(config).deliver(Notice("t", "k", "s", "b"), "t@example.org",
                                            "conn:ml_alerts")
    assert done.channels == ("email", "webhook") and len(smtp.messages) == len(hook.posts) == 1
    store = af.object_store(config)
    store.ensure_bucket()
    assert store.put_bytes("x.txt", b"1") == "from-conn/x.txt"
    assert store.get_bytes("x.txt") == b"1"


def test_bad_variable_is_a_spec_error(airflow_env, monkeypatch) -> None:
    from gpu_pool.errors import SpecError
    from gpu_pool.ops import airflow_adapters as af

    monkeypatch.setenv("AIRFLOW_VAR_GPU_POOL_OPS", json.dumps({"idle_action": "kill"}))
    with pytest.raises(SpecError, match=r"gpu_pool_ops.idle_action: got 'kill'; expected warn"):
        af.ops_config()


def test_missing_s3_connection_says_how_to_add_it(airflow_env, monkeypatch) -> None:
    from gpu_pool.objectstore import ObjectStoreError, config_from_airflow

    with pytest.raises(ObjectStoreError, match="airflow connections add nope"):
        config_from_airflow("nope")
