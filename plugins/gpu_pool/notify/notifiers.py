"""Airflow adapters of the channels: connection readers and ``BaseNotifier`` subclasses.

Connections
-----------
``gpu_pool_smtp`` (type ``smtp``)
    host, port, login, password; extras as the SMTP provider reads them: ``from_email``,
    ``disable_ssl`` (default false: SMTPS), ``disable_tls`` (default false: STARTTLS when not
    SMTPS), ``timeout``.
webhook connections (any type, referenced from a team as ``conn:<id>``)
    the URL in extra ``url``, else ``host`` when it is a full ``https://`` URL.

The notifiers can be used as DAG/task callbacks like ``SmtpNotifier``:
``on_failure_callback=GpuPoolWebhookNotifier(target="conn:ml_alerts", subject=...)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.bases.notifier import BaseNotifier

from gpu_pool.notify.channels import (
    CONN_PREFIX,
    DeliveryError,
    EmailChannel,
    Notice,
    TeamChannels,
    WebhookChannel,
)

DEFAULT_SMTP_CONN_ID = "gpu_pool_smtp"


def _flag(value: Any) -> bool:
    return str(value).strip().lower() in {"1", "true", "yes", "on"}


def email_channel_from_connection(conn: Any) -> EmailChannel:
    """An :class:`EmailChannel` from an Airflow SMTP connection object."""
    extras = conn.extra_dejson or {}
    use_ssl = not _flag(extras.get("disable_ssl", False))
    return EmailChannel(
        host=conn.host or "localhost",
        port=int(conn.port or (465 if use_ssl else 25)),
        sender=extras.get("from_email") or conn.login or "gpu-pool@localhost",
        login=conn.login or None,
        password=conn.password or None,
        use_ssl=use_ssl,
        starttls=not use_ssl and not _flag(extras.get("disable_tls", False)),
        timeout_s=float(extras.get("timeout", 30)),
    )


def webhook_url_from_connection(conn: Any) -> str:
    extras = conn.extra_dejson or {}
    url = extras.get("url") or (conn.host if str(conn.host or "").startswith("http") else None)
    if not url:
        raise DeliveryError(f"webhook connection {conn.conn_id!r} has no extra 'url' and no "
                            "http(s) URL as host")
    return str(url)


def resolve_webhook(conn_id: str) -> str:
    return webhook_url_from_connection(BaseHook.get_connection(conn_id))


def airflow_team_channels(smtp_conn_id: str | None = DEFAULT_SMTP_CONN_ID) -> TeamChannels:
    """Channels as configured in Airflow; no SMTP connection means e-mail is not offered."""
    email = None
    if smtp_conn_id:
        try:
            conn = BaseHook.get_connection(smtp_conn_id)
        except Exception:  # not defined: teams with only a webhook still get notices
            conn = None
        if conn is not None:
            email = email_channel_from_connection(conn)
    return TeamChannels(email=email, resolve_webhook=resolve_webhook)


class GpuPoolEmailNotifier(BaseNotifier):
    """E-mail a templated subject and message through the SMTP connection."""

    template_fields = ("to", "subject", "message")

    def __init__(self, *, to: str | Sequence[str], subject: str, message: str,
                 smtp_conn_id: str = DEFAULT_SMTP_CONN_ID, kind: str = "airflow") -> None:
        super().__init__()
        self.to = to
        self.subject = subject
        self.message = message
        self.smtp_conn_id = smtp_conn_id
        self.kind = kind

    def notify(self, context: Any) -> None:
        to = [self.to] if isinstance(self.to, str) else list(self.to)
        channel = email_channel_from_connection(BaseHook.get_connection(self.smtp_conn_id))
        channel.send(to, Notice(team="", kind=self.kind, subject=self.subject,
                                body=self.message))


class GpuPoolWebhookNotifier(BaseNotifier):
    """POST a templated subject and message as Slack-style JSON to a URL or ``conn:<id>``."""

    template_fields = ("subject", "message")

    def __init__(self, *, target: str, subject: str, message: str,
                 kind: str = "airflow") -> None:
        super().__init__()
        self.target = target
        self.subject = subject
        self.message = message
        self.kind = kind

    def notify(self, context: Any) -> None:
        url = self.target
        if url.startswith(CONN_PREFIX):
            url = resolve_webhook(url[len(CONN_PREFIX):])
        WebhookChannel(url).send(Notice(team="", kind=self.kind, subject=self.subject,
                                        body=self.message))
