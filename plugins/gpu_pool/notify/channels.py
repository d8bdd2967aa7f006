"""Plain senders, usable without Airflow: e-mail over SMTP and Slack-style JSON webhooks.

Terms
-----
notice
    One message to one team: a kind (``quota_expiring``, ``budget``, ``idle_gpus``, ...), a
    subject line, a body of plain text, and facts (ordered key/value pairs) that a webhook
    receiver can read without parsing prose.
webhook target
    A team's ``notify_webhook`` in the store: an ``http(s)://`` URL used as is,
    ``conn:<id>`` naming an Airflow connection that holds the URL (for webhook URLs that are
    secrets, such as Slack's), or ``file:///<absolute path>``: each notice appended to that
    file as one line of the same JSON (for a machine without a receiver, a log shipper, or
    the demo). Resolving ``conn:`` needs a resolver; the Airflow adapter passes one.
    Messages and logs show a webhook only as ``scheme://host/...``.

A delivery failure is a :class:`DeliveryError` naming the channel and target (redacted),
never the credentials.
"""

from __future__ import annotations

import json
import smtplib
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from email.message import EmailMessage
from urllib.parse import urlsplit

from gpu_pool.errors import GpuPoolError, SpecError

CONN_PREFIX = "conn:"
FILE_PREFIX = "file://"


class DeliveryError(GpuPoolError):
    """A notice could not be delivered on a channel."""


@dataclass(frozen=True)
class Notice:
    team: str
    kind: str
    subject: str
    body: str
    facts: tuple[tuple[str, str], ...] = ()

    def to_webhook_json(self) -> dict[str, object]:
        """A Slack-compatible payload (``text`` + ``blocks``) that also carries the facts."""
        fields = [{"type": "mrkdwn", "text": f"*{k}*\n{v}"} for k, v in self.facts]
        blocks: list[dict[str, object]] = [
            {"type": "header", "text": {"type": "plain_text", "text": self.subject[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": self.body}},
        ]
        if fields:
            blocks.append({"type": "section", "fields": fields[:10]})
        return {
            "text": f"{self.subject}\n{self.body}",
            "blocks": blocks,
            "gpu_pool": {"team": self.team, "kind": self.kind, "facts": dict(self.facts)},
        }

    def to_text(self) -> str:
        lines = [self.body, ""]
        lines.extend(f"{k}: {v}" for k, v in self.facts)
        lines.append("")
        lines.append("-- gpu-pool")
        return "\n".join(lines)


def redact_url(url: str) -> str:
    """``https://hooks.example.com/...``: enough to say where, nothing of the secret path."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}/..."


@dataclass(frozen=True)
class EmailChannel:
    """An SMTP server; ``password`` is kept out of ``repr``."""

    host: str
    port: int = 25
    sender: str = "gpu-pool@localhost"
    login: str | None = None
    password: str | None = field(default=None, repr=False)
    use_ssl: bool = False
    starttls: bool = False
    timeout_s: float = 30.0

    def send(self, to: Sequence[str], notice: Notice) -> None:
        recipients = [addr.strip() for addr in to if addr and addr.strip()]
        if not recipients:
            raise SpecError("notify_email", list(to), "at least one e-mail address")
        msg = EmailMessage()
        msg["From"] = self.sender
        msg["To"] = ", ".join(recipients)
        msg["Subject"] = notice.subject
        msg["X-GPU-Pool-Kind"] = notice.kind
        msg.set_content(notice.to_text())
        try:
            smtp_cls = smtplib.SMTP_SSL if self.use_ssl else smtplib.SMTP
            with smtp_cls(self.host, self.port, timeout=self.timeout_s) as smtp:
                if self.starttls and not self.use_ssl:
                    smtp.starttls(context=ssl.create_default_context())
                if self.login:
                    smtp.login(self.login, self.password or "")
                smtp.send_message(msg)
        except (OSError, smtplib.SMTPException) as error:
            raise DeliveryError(
                f"e-mail to {', '.join(recipients)} via {self.host}:{self.port} failed: "
                f"{type(error).__name__}: {error}") from error


@dataclass(frozen=True)
class WebhookChannel:
    """POSTs a notice as JSON to one URL."""

    url: str = field(repr=False)
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise SpecError("notify_webhook", redact_url(self.url),
                            "an http:// or https:// URL, or conn:<airflow connection id>")

    def send(self, notice: Notice) -> None:
        data = json.dumps(notice.to_webhook_json()).encode()
        req = urllib.request.Request(self.url, data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                resp.read()
        except urllib.error.HTTPError as error:
            raise DeliveryError(
                f"webhook {redact_url(self.url)} answered HTTP {error.code}") from None
        except (OSError, urllib.error.URLError) as error:
            raise DeliveryError(
                f"webhook {redact_url(self.url)} unreachable: {type(error).__name__}") from None


@dataclass(frozen=True)
class FileChannel:
    """Appends a notice to a file as one line of the webhook JSON."""

    path: str

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise SpecError("notify_webhook", f"{FILE_PREFIX}{self.path}",
                            "file:/// and an absolute path, e.g. file:///var/log/gpu-pool.jsonl")

    def send(self, notice: Notice) -> None:
        line = json.dumps(notice.to_webhook_json(), sort_keys=True) + "\n"
        try:
            with open(self.path, "a", encoding="utf-8") as out:
                out.write(line)
        except OSError as error:
            raise DeliveryError(f"webhook file {self.path} could not be written: "
                                f"{error.strerror or type(error).__name__}") from None


WebhookResolver = Callable[[str], str]


def _no_resolver(conn_id: str) -> str:
    raise DeliveryError(f"webhook target conn:{conn_id} needs Airflow connections to resolve")


@dataclass(frozen=True)
class Delivery:
    """What happened to one notice: the channels that took it and the errors of the others."""

    channels: tuple[str, ...]
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class TeamChannels:
    """Routes a notice to its team's channels: e-mail if the team has an address, webhook if
    it has a target. ``email`` None means no SMTP server is configured."""

    email: EmailChannel | None
    resolve_webhook: WebhookResolver = _no_resolver
    webhook_timeout_s: float = 10.0

    def deliver(self, notice: Notice, notify_email: str | None,
                notify_webhook: str | None) -> Delivery:
        """Sends on every channel the team has. Raises :class:`DeliveryError` when no
        channel took the notice; a partial failure is reported in ``Delivery.errors``."""
        used: list[str] = []
        errors: list[str] = []
        if notify_email:
            if self.email is None:
                errors.append("e-mail: no SMTP connection configured")
            else:
                try:
                    self.email.send(notify_email.replace(";", ",").split(","), notice)
                    used.append("email")
                except DeliveryError as error:
                    errors.append(str(error))
        if notify_webhook:
            try:
                url = notify_webhook
                if url.startswith(CONN_PREFIX):
                    url = self.resolve_webhook(url[len(CONN_PREFIX):])
                if url.startswith(FILE_PREFIX):
                    FileChannel(url[len(FILE_PREFIX):]).send(notice)
                else:
                    WebhookChannel(url, self.webhook_timeout_s).send(notice)
                used.append("webhook")
            except (DeliveryError, SpecError) as error:
                errors.append(str(error))
        if not notify_email and not notify_webhook:
            errors.append(f"team {notice.team!r} has neither notify_email nor notify_webhook")
        if not used:
            raise DeliveryError("; ".join(errors))
        return Delivery(tuple(used), tuple(errors))
