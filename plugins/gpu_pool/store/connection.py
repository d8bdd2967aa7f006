"""Where the store lives and how to connect to it.

Terms
-----
store URL
    A SQLAlchemy URL: ``sqlite:///PATH`` (the embedded default) or
    ``postgresql://user:pw@host:port/db`` (production; driven by psycopg2).

Resolution order (first that gives a URL wins; :func:`resolve_db_url`):

1. the ``--db`` value of the command line;
2. the environment variable ``GPU_POOL_DB_URL``;
3. the Airflow connection ``gpu_pool_db``: from ``AIRFLOW_CONN_GPU_POOL_DB`` (URI or JSON,
   parsed by plain rules, no Airflow import), else — only when ``$AIRFLOW_HOME/airflow.cfg``
   exists, because importing Airflow costs seconds — from Airflow's secrets backends and
   metadata database (``Connection.get_connection_from_secrets``); any failure there means
   "no such connection", never an error;
4. ``sqlite:///$AIRFLOW_HOME/gpu_pool.db`` (``~/airflow`` when ``AIRFLOW_HOME`` is unset).

Invariants of the engines made here: SQLite runs with foreign keys on, a busy timeout, WAL,
and explicit ``BEGIN`` (``BEGIN IMMEDIATE`` for writes, so two writers queue instead of
failing on lock upgrade); PostgreSQL uses psycopg2 with pre-ping.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote, urlsplit

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from gpu_pool.errors import SpecError

ENV_URL = "GPU_POOL_DB_URL"
AIRFLOW_CONN_ID = "gpu_pool_db"
ENV_AIRFLOW_CONN = "AIRFLOW_CONN_GPU_POOL_DB"
SQLITE_BUSY_TIMEOUT_S = 30
WRITE_OPTION = "gpu_pool_write"  # execution option: this transaction will write

_URL_HINT = "a database URL like sqlite:///path/to/gpu_pool.db or postgresql://user@host/db"
_SCHEMES = {"postgres": "postgresql", "postgresql": "postgresql", "sqlite": "sqlite"}


def airflow_home() -> Path:
    return Path(os.environ.get("AIRFLOW_HOME") or Path.home() / "airflow").expanduser()


def resolve_db_url(cli_value: str | None = None) -> str:
    """The store URL, by the resolution order of the module docstring."""
    if cli_value:
        return cli_value
    if os.environ.get(ENV_URL):
        return os.environ[ENV_URL]
    from_airflow = airflow_connection_url()
    if from_airflow:
        return from_airflow
    return f"sqlite:///{airflow_home() / 'gpu_pool.db'}"


def airflow_connection_url() -> str | None:
    """The URL of the Airflow connection ``gpu_pool_db``, or None when there is none."""
    raw = os.environ.get(ENV_AIRFLOW_CONN)
    if raw:
        return connection_to_url(raw)
    if not (airflow_home() / "airflow.cfg").exists():
        return None
    try:  # Airflow may be absent or misconfigured: then there simply is no such connection
        # The core model consults every secrets backend, the metadata database included;
        # the task SDK's lookup does not outside a running task.
        from airflow.models.connection import Connection

        conn = Connection.get_connection_from_secrets(AIRFLOW_CONN_ID)
    except Exception:
        return None
    return _fields_to_url(conn.conn_type, conn.host, conn.login, conn.password, conn.schema,
                          conn.port)


def connection_to_url(raw: str) -> str:
    """A SQLAlchemy URL from an Airflow connection in URI or JSON form."""
    raw = raw.strip()
    if raw.startswith("{"):
        try:
            d = json.loads(raw)
        except ValueError as error:
            raise SpecError(ENV_AIRFLOW_CONN, raw[:60], f"an Airflow connection URI or JSON "
                            f"({error})") from None
        return _fields_to_url(d.get("conn_type"), d.get("host"), d.get("login"),
                              d.get("password"), d.get("schema"), d.get("port"))
    parts = urlsplit(raw)
    host = parts.netloc.rpartition("@")[2]  # not .hostname: it lowercases a SQLite path
    if parts.port is not None:
        host = host.rpartition(":")[0]
    return _fields_to_url(parts.scheme, unquote(host) or None,
                          unquote(parts.username) if parts.username else None,
                          unquote(parts.password) if parts.password else None,
                          unquote(parts.path.lstrip("/")) or None, parts.port)


def _fields_to_url(conn_type: str | None, host: str | None, login: str | None,
                   password: str | None, schema: str | None, port: Any) -> str:
    kind = _SCHEMES.get((conn_type or "").lower().replace("_", "-"))
    if kind is None:
        raise SpecError(f"Airflow connection {AIRFLOW_CONN_ID!r} conn_type", conn_type,
                        "postgres or sqlite")
    if kind == "sqlite":  # Airflow keeps the database file in host (or schema)
        return f"sqlite:///{host or schema or ''}"
    auth = ""
    if login:
        auth = quote(login, safe="") + (f":{quote(password, safe='')}" if password else "") + "@"
    return f"postgresql://{auth}{host or 'localhost'}{f':{port}' if port else ''}/{schema or ''}"


def parse_url(url: str) -> URL:
    """``url`` as a SQLAlchemy URL of a supported backend, else a SpecError naming it."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise SpecError("db", url, _URL_HINT) from None
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise SpecError("db", display_url(url), _URL_HINT)
    if parsed.get_backend_name() == "postgresql" and parsed.drivername == "postgresql":
        parsed = parsed.set(drivername="postgresql+psycopg2")
    return parsed


def sqlite_path(url: str) -> Path | None:
    """The file of a file-backed SQLite URL (None for PostgreSQL or an in-memory database)."""
    parsed = parse_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or not database or database == ":memory:" \
            or database.startswith("file:"):
        return None
    return Path(database).expanduser()


def display_url(url: str | URL) -> str:
    """The URL with any password hidden, for messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "<unparseable URL>"


def make_engine(url: str) -> Engine:
    """A SQLAlchemy engine for ``url`` with the invariants of the module docstring."""
    parsed = parse_url(url)
    if parsed.get_backend_name() == "postgresql":
        return create_engine(parsed, pool_pre_ping=True, pool_size=2, max_overflow=4)
    database = parsed.database or ""
    engine = create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
    file_backed = bool(database) and database != ":memory:"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # pysqlite's own transaction handling would skip BEGIN before DDL and savepoints;
        # with isolation_level None we emit BEGIN ourselves (in _on_begin).
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA foreign_keys = ON")
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}")
        if file_backed:
            cur.execute("PRAGMA journal_mode = WAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        write = conn.get_execution_options().get(WRITE_OPTION, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine
