"""Fixtures of the policy suite: a migrated store on SQLite and on PostgreSQL.

On PostgreSQL each test gets its own schema in one database made for the session (dropped
at the end); the test fails when the server at 127.0.0.1:5432 is down.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import quote

import pytest
from sqlalchemy import create_engine, text

from gpu_pool.store import Store

PG_SERVER = os.environ.get("GPU_POOL_TEST_PG", "postgresql://postgres@127.0.0.1:5432")


class Clock:
    """A clock tests move by hand."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    name = f"gpu_pool_policy_{os.getpid()}"
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}"'))
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    except Exception as error:  # noqa: BLE001 - say why the PostgreSQL half cannot run
        pytest.fail(f"PostgreSQL at {PG_SERVER} is needed for the policy suite: {error}")
    yield f"{PG_SERVER}/{name}"
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:  # noqa: ANN001
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'store.db'}"
        return
    database = request.getfixturevalue("pg_database")
    schema = f"p_{uuid.uuid4().hex[:12]}"
    engine = create_engine(database, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    try:
        yield f"{database}?options={quote(f'-csearch_path={schema}')}"
    finally:
        with engine.connect() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


@pytest.fixture
def clock() -> Clock:
    return Clock(datetime(2026, 12, 1, 9, 0, tzinfo=UTC))


@pytest.fixture
def store(db_url: str, clock: Clock) -> Iterator[Store]:
    s = Store.from_url(db_url, clock=clock)
    s.migrate()
    yield s
    s.close()
