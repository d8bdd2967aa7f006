"""Real servers for the ops tests: an S3 server (moto, server mode), an SMTP server (aiosmtpd),
an HTTP webhook receiver (http.server), and the store on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gpu_pool.objectstore import ObjectStoreConfig, S3ObjectStore


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- S3 (moto server mode)

@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_config(s3_endpoint: str) -> ObjectStoreConfig:
    """A fresh bucket per test; the keys are test fixtures, not real credentials."""
    return ObjectStoreConfig(bucket=f"b-{uuid.uuid4().hex[:12]}", prefix="gpu-pool/test",
                             endpoint_url=s3_endpoint, access_key="testing",
                             secret_key="testing", max_attempts=1)


@pytest.fixture
def objstore(s3_config: ObjectStoreConfig) -> S3ObjectStore:
    store = S3ObjectStore(s3_config)
    store.ensure_bucket()
    return store


# ---------------------------------------------------------------- SMTP (aiosmtpd)

@dataclass
class Mailbox:
    host: str
    port: int
    messages: list[tuple[list[str], Message]] = field(default_factory=list)

    def by_subject(self, needle: str) -> list[Message]:
        return [m for _, m in self.messages if needle in str(m["Subject"])]


@pytest.fixture
def smtp_server() -> Iterator[Mailbox]:
    from aiosmtpd.controller import Controller

    box = Mailbox("127.0.0.1", free_port())

    class Handler:
        async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd API
            box.messages.append((list(envelope.rcpt_tos), message_from_bytes(envelope.content)))
            return "250 OK"

    controller = Controller(Handler(), hostname=box.host, port=box.port)
    controller.start()
    yield box
    controller.stop()


# ---------------------------------------------------------------- webhook receiver

@dataclass
class Receiver:
    url: str
    posts: list[dict] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    status: int = 200


@pytest.fixture
def webhook() -> Iterator[Receiver]:
    receiver = Receiver(url="")

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server API
            length = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(length)
            if receiver.status == 200:
                receiver.posts.append(json.loads(body))
                receiver.paths.append(self.path)
            self.send_response(receiver.status)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver.url = f"http://127.0.0.1:{server.server_address[1]}/hooks/T000/SECRET"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield receiver
    server.shutdown()
    server.server_close()
