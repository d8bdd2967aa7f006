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
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
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
    """A bucket gpu-pool created itself: versioning on."""
    store = S3ObjectStore(s3_config)
    store.ensure_bucket()
    return store


@pytest.fixture
def plain_objstore(s3_config: ObjectStoreConfig) -> S3ObjectStore:
    """A bucket made elsewhere without versioning, as many S3-compatible stores have."""
    store = S3ObjectStore(s3_config)
    store._client.create_bucket(Bucket=s3_config.bucket)
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
    import logging

    from aiosmtpd.controller import Controller

    logging.getLogger("mail.log").setLevel(logging.WARNING)  # per-connection chatter
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


# ---------------------------------------------------------------- databases

PG_ADMIN = "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres"


def _pg_database() -> Iterator[str]:
    from sqlalchemy import create_engine, text

    name = f"gp_ops_{uuid.uuid4().hex[:10]}"
    admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as error:  # noqa: BLE001 - say why the PostgreSQL half cannot run
        admin.dispose()
        pytest.fail(f"PostgreSQL at 127.0.0.1:5432 is needed for this test: {error}")
    try:
        yield f"postgresql+psycopg2://postgres@127.0.0.1:5432/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    """A fresh, empty database of each dialect."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
    else:
        yield from _pg_database()


def apply_ops_sql(engine) -> None:  # noqa: ANN001 - an Engine
    """Run sql/020_ops.sql statement by statement (what the store's migrate does)."""
    from pathlib import Path

    from sqlalchemy import text

    sql = (Path(__file__).resolve().parents[2] / "sql" / "020_ops.sql").read_text()
    body = "\n".join(line.split("--", 1)[0] for line in sql.splitlines())
    with engine.begin() as conn:
        for statement in filter(str.strip, body.split(";")):
            conn.execute(text(statement))


@pytest.fixture
def records(db_url: str):
    from sqlalchemy import create_engine

    from gpu_pool.ops.records import OpsRecords

    engine = create_engine(db_url)
    apply_ops_sql(engine)
    yield OpsRecords(engine)
    engine.dispose()


# ---------------------------------------------------------------- the store and its factories

@dataclass
class Fleet:
    """Factories over a real, migrated store: teams, nodes, quotas, running tasks."""

    store: object

    def team(self, name: str, email: str | None = None, webhook: str | None = None) -> None:
        from gpu_pool.model import Team

        self.store.upsert_team(Team(name, notify_email=email, notify_webhook=webhook), "test")

    def node(self, name: str, gpus: int = 4, model: str = "A100",
             memory_mib: int = 80 * 1024, ssh_conn_id: str | None = None) -> None:
        from gpu_pool.model import Gpu, Node

        self.store.import_nodes([Node(name, tuple(Gpu(i, model, memory_mib) for i in range(gpus)),
                                      cpu_milli=64000, memory_mib=512 * 1024,
                                      ssh_conn_id=ssh_conn_id or f"ssh_{name}")], "test")

    def quota(self, team: str, gpus: float, valid_from, expires_at, **kw) -> object:
        from gpu_pool.model import Purpose, Quota

        return self.store.set_quota(Quota(team, Purpose.TRAINING, gpus, valid_from, expires_at,
                                          **kw), "test")

    def run(self, name: str, team: str, gpus: int, at, *, link: bool = True,
            time_limit=None, estimated=None) -> list:
        """Submit and place a request at ``at``; returns its allocations."""
        from gpu_pool.engine import plan
        from gpu_pool.model import Policy, Request

        req = Request(name, team, gpus=gpus, time_limit=time_limit, estimated_runtime=estimated,
                      submitted_at=at)
        fields = ({"dag_id": "train", "task_id": name, "run_id": "r1", "map_index": -1,
                   "try_number": 1, "executor_key": f"ti-{name}"} if link else {})
        self.store.submit_request(req, "test", at, **fields)
        result = self.store.apply_plan(plan(self.store.load_snapshot(Policy(), at)), at, "test")
        allocs = self.store.allocations_of(name)
        assert allocs, f"{name} was not placed: {result}"
        return allocs


@pytest.fixture
def store(db_url: str):
    from gpu_pool.store import Store

    s = Store.from_url(db_url)
    s.migrate()
    yield s
    s.close()


@pytest.fixture
def fleet(store) -> Fleet:
    return Fleet(store)
