"""The side-effect adapters against real servers: S3 protocol, SMTP, HTTP webhooks."""

from __future__ import annotations

import pytest

from gpu_pool.errors import SpecError
from gpu_pool.notify import DeliveryError, EmailChannel, Notice, TeamChannels, WebhookChannel
from gpu_pool.objectstore import (
    ObjectStoreConfig,
    ObjectStoreError,
    S3ObjectStore,
    config_from_extras,
)

NOTICE = Notice(team="vision", kind="quota_expiring", subject="Quota expires in 7 days",
                body="Quota vision/training expires on 2026-12-08.",
                facts=(("quota", "q1"), ("days_left", "7")))


def test_put_get_list_overwrite(objstore: S3ObjectStore) -> None:
    full = objstore.put_bytes("ledger/dt=2026-12-01/part-0.csv", b"a,b\n1,2\n", "text/csv")
    assert full == "gpu-pool/test/ledger/dt=2026-12-01/part-0.csv"
    objstore.put_bytes("ledger/dt=2026-12-01/part-0.csv", b"a,b\n3,4\n", "text/csv")
    objstore.put_bytes("events/dt=2026-12-01/part-0.csv", b"x\n", "text/csv")
    assert objstore.get_bytes("ledger/dt=2026-12-01/part-0.csv") == b"a,b\n3,4\n"
    assert objstore.list_keys("ledger/") == ["ledger/dt=2026-12-01/part-0.csv"]
    assert len(objstore.list_keys()) == 2


def test_unreachable_store_is_a_clear_error() -> None:
    from tests.ops.conftest import free_port

    cfg = ObjectStoreConfig(bucket="b", endpoint_url=f"http://127.0.0.1:{free_port()}",
                            access_key="k", secret_key="topsecret", max_attempts=2,
                            connect_timeout_s=0.5)
    with pytest.raises(ObjectStoreError) as info:
        S3ObjectStore(cfg).put_bytes("ledger/x.csv", b"1")
    text = str(info.value)
    assert "s3://b/" in text and "ledger/x.csv" in text and "cannot reach" in text
    assert "topsecret" not in text and "topsecret" not in repr(cfg)


def test_missing_object_names_the_key(objstore: S3ObjectStore) -> None:
    with pytest.raises(ObjectStoreError, match="NoSuchKey"):
        objstore.get_bytes("nope.csv")


@pytest.mark.parametrize(("extras", "field"), [
    ({}, "bucket"),
    ({"bucket": "a/b"}, "bucket"),
    ({"bucket": "b", "endpoint_url": "minio:9000"}, "endpoint_url"),
    ({"bucket": "b", "max_attempts": "many"}, "max_attempts"),
    ({"bucket": "b", "max_attempts": 0}, "max_attempts"),
])
def test_bad_connection_extras(extras: dict, field: str) -> None:
    with pytest.raises(SpecError) as info:
        config_from_extras(extras)
    assert info.value.field == field


def test_connection_extras_and_credentials() -> None:
    cfg = config_from_extras({"bucket": "snap", "prefix": "p/", "endpoint_url": "http://h:9000"},
                             login="AK", password="SK")
    assert (cfg.bucket, cfg.prefix, cfg.endpoint_url, cfg.access_key, cfg.secret_key) == (
        "snap", "p/", "http://h:9000", "AK", "SK")
    assert cfg.full_key("/ledger/a") == "p/ledger/a"


def test_email_reaches_smtp_server(smtp_server) -> None:
    EmailChannel(host=smtp_server.host, port=smtp_server.port, sender="pool@example.org").send(
        ["a@example.org", "b@example.org"], NOTICE)
    (rcpts, msg), = smtp_server.messages
    assert rcpts == ["a@example.org", "b@example.org"]
    assert msg["Subject"] == "Quota expires in 7 days"
    assert msg["X-GPU-Pool-Kind"] == "quota_expiring"
    body = msg.get_payload()
    assert "expires on 2026-12-08" in body and "days_left: 7" in body


def test_email_to_dead_server_is_delivery_error() -> None:
    from tests.ops.conftest import free_port

    with pytest.raises(DeliveryError, match="via 127.0.0.1"):
        EmailChannel(host="127.0.0.1", port=free_port(), timeout_s=1).send(["a@x.org"], NOTICE)


def test_webhook_posts_slack_json(webhook) -> None:
    WebhookChannel(webhook.url).send(NOTICE)
    (payload,) = webhook.posts
    assert payload["text"].startswith("Quota expires in 7 days")
    assert payload["blocks"][0]["text"]["text"] == "Quota expires in 7 days"
    assert payload["gpu_pool"] == {"team": "vision", "kind": "quota_expiring",
                                   "facts": {"quota": "q1", "days_left": "7"}}
    assert webhook.paths == ["/hooks/T000/SECRET"]


def test_webhook_error_hides_secret_path(webhook) -> None:
    webhook.status = 500
    with pytest.raises(DeliveryError) as info:
        WebhookChannel(webhook.url).send(NOTICE)
    assert "HTTP 500" in str(info.value) and "SECRET" not in str(info.value)


def test_team_channels_route_and_partial_failure(smtp_server, webhook) -> None:
    channels = TeamChannels(
        email=EmailChannel(host=smtp_server.host, port=smtp_server.port),
        resolve_webhook=lambda conn_id: webhook.url if conn_id == "ml" else "bad")
    done = channels.deliver(NOTICE, "a@x.org; b@x.org", "conn:ml")
    assert done.channels == ("email", "webhook") and done.errors == ()
    assert smtp_server.messages[0][0] == ["a@x.org", "b@x.org"]
    assert len(webhook.posts) == 1
    partial = channels.deliver(NOTICE, "a@x.org", "conn:other")
    assert partial.channels == ("email",) and "notify_webhook" in partial.errors[0]
    with pytest.raises(DeliveryError, match="neither"):
        channels.deliver(NOTICE, None, None)
    with pytest.raises(DeliveryError, match="no SMTP"):
        TeamChannels(email=None).deliver(NOTICE, "a@x.org", None)
