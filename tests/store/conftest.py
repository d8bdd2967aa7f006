"""Fixtures of the store suite: every test runs on SQLite and on PostgreSQL alike.

``store_url`` is an empty, unmigrated database: a temporary SQLite file, or a fresh schema
(its own ``search_path``) inside one PostgreSQL database created for this test session
(``gpu_pool_test_<pid>``, dropped at the end). ``store`` is a migrated, empty
:class:`Store` with a controllable clock (``clock``): on SQLite a fresh file; on PostgreSQL
one schema migrated once per session and emptied (TRUNCATE) before each test, because
migrating a schema per test costs most of a second there.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, text

from gpu_pool.store import Store

PG_SERVER = os.environ.get("GPU_POOL_TEST_PG", "postgresql://postgres@127.0.0.1:5432")


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A PostgreSQL database for this session; the test fails if the server is down."""
    name = f"gpu_pool_test_{os.getpid()}"
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
            # Durability does not matter in a throwaway test database; speed does.
            conn.execute(text(f'ALTER DATABASE "{name}" SET synchronous_commit = off'))
    except Exception as error:  # make the cause plain: these tests need the real server
        pytest.fail(f"PostgreSQL at {PG_SERVER} is needed for the store suite: {error}")
    yield f"{PG_SERVER}/{name}"
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _pg_schema_url(database: str, schema: str) -> str:
    return f"{database}?options={quote(f'-csearch_path={schema}')}"


@pytest.fixture(scope="session")
def pg_migrated(pg_database: str) -> Iterator[str]:
    """The URL of one migrated schema shared by the PostgreSQL runs of ``store``."""
    engine = create_engine(pg_database, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("CREATE SCHEMA shared"))
    url = _pg_schema_url(pg_database, "shared")
    Store.from_url(url).migrate()
    yield url
    engine.dispose()


def _empty_pg(url: str) -> None:
    # DELETE with triggers off (replica role) beats TRUNCATE, which makes new files per table;
    # it also passes the ledger's append-only trigger, which only this reset may bypass.
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text("SET LOCAL session_replication_role = replica"))
        tables = conn.execute(text(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'shared' "
            "AND table_type = 'BASE TABLE' AND table_name <> 'schema_migrations'")).scalars()
        for table in tables:
            conn.execute(text(f"DELETE FROM {table}"))
    engine.dispose()


@contextmanager
def _fresh_pg_schema(database: str) -> Iterator[str]:
    schema = f"t_{uuid.uuid4().hex[:12]}"
    engine = create_engine(database, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield _pg_schema_url(database, schema)
    finally:
        with engine.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # noqa: ANN001
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    with _fresh_pg_schema(request.getfixturevalue("pg_database")) as url:
        yield url


class Clock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(now: datetime) -> Clock:
    return Clock(now)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path, clock: Clock) -> Iterator[Store]:  # noqa: ANN001
    if request.param == "sqlite":
        s = Store.from_url(f"sqlite:///{tmp_path / 'store.db'}", clock=clock)
        s.migrate()
    else:
        url = request.getfixturevalue("pg_migrated")
        _empty_pg(url)
        s = Store.from_url(url, clock=clock)
        assert s.migrate() == []
    yield s
    s.close()
