"""Numbered SQL migrations in ``sql/``, applied in order, each once.

Terms
-----
migration file
    ``sql/NNN_name.sql`` (portable, applied on every dialect) or
    ``sql/NNN_name.<dialect>.sql`` with dialect ``postgresql`` or ``sqlite`` (applied only
    there). Files of one stem ``NNN_name`` form one **version**; its portable file runs
    before its dialect file.
version
    ``NNN_name``; ``schema_migrations`` holds one row per version applied.

Invariants: versions apply in (number, name) order; each version applies in one
transaction together with its ``schema_migrations`` row, so a failed file leaves nothing
behind on PostgreSQL (SQLite DDL is transactional too); :func:`migrate` is idempotent.
The folder is the package's own ``gpu_pool/sql`` (shipped inside the wheel, so an install
without the source tree migrates; the checkout's top-level ``sql`` is a link to it) unless
the environment variable ``GPU_POOL_SQL_DIR`` names another.
"""

from __future__ import annotations

import os
import re
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Connection, Engine, text

import gpu_pool
from gpu_pool.errors import StoreError
from gpu_pool.store.codec import db_time
from gpu_pool.store.connection import WRITE_OPTION

DIALECTS = ("postgresql", "sqlite")
_FILE = re.compile(r"^(?P<num>\d{3,})_(?P<name>[A-Za-z0-9_]+?)(?:\.(?P<dialect>[a-z]+))?\.sql$")
_BOOTSTRAP = ("CREATE TABLE IF NOT EXISTS schema_migrations "
              "(version TEXT PRIMARY KEY, applied_at TIMESTAMP NOT NULL)")
# Serialises concurrent `migrate` runs on PostgreSQL (any constant unique to gpu-pool).
MIGRATE_LOCK_KEY = 0x6770755F6D6967


@dataclass(frozen=True)
class Version:
    version: str  # NNN_name
    files: tuple[Path, ...]  # portable first, then this dialect's


def sql_dir() -> Path:
    override = os.environ.get("GPU_POOL_SQL_DIR")
    return Path(override) if override else Path(gpu_pool.__file__).resolve().parent / "sql"


def versions(dialect: str, folder: Path | None = None) -> list[Version]:
    """The versions found in ``folder`` for ``dialect``, in the order they apply."""
    folder = folder or sql_dir()
    if not folder.is_dir():
        raise StoreError(f"no migrations folder at {folder} (set GPU_POOL_SQL_DIR)")
    found: dict[tuple[int, str], list[tuple[int, Path]]] = {}
    for path in folder.iterdir():
        m = _FILE.match(path.name)
        if m is None:
            continue
        file_dialect = m["dialect"]
        if file_dialect is not None and file_dialect not in DIALECTS:
            continue  # a name like 001_x.y.sql that is not a dialect file: not ours to run
        key = (int(m["num"]), f"{m['num']}_{m['name']}")
        found.setdefault(key, [])
        if file_dialect is None:
            found[key].append((0, path))
        elif file_dialect == dialect:
            found[key].append((1, path))
    return [Version(version, tuple(p for _, p in sorted(files)))
            for (_, version), files in sorted(found.items()) if files]


def applied_versions(conn: Connection) -> set[str] | None:
    """Versions recorded in ``schema_migrations``; None when the table does not exist."""
    if conn.dialect.name == "sqlite":
        exists = conn.execute(text("SELECT 1 FROM sqlite_master WHERE type = 'table' "
                                   "AND name = 'schema_migrations'")).first()
    else:
        exists = conn.execute(text("SELECT to_regclass('schema_migrations')")).scalar()
    if not exists:
        return None
    return set(conn.execute(text("SELECT version FROM schema_migrations")).scalars())


def missing_versions(conn: Connection, folder: Path | None = None) -> list[str]:
    """Versions in ``sql/`` that the database has not applied yet."""
    done = applied_versions(conn) or set()
    return [v.version for v in versions(conn.dialect.name, folder) if v.version not in done]


def migrate(engine: Engine, folder: Path | None = None) -> list[str]:
    """Apply every version not applied yet; return those applied now, in order."""
    dialect = engine.dialect.name
    with engine.begin() as conn:
        conn.exec_driver_sql(_BOOTSTRAP)
    applied: list[str] = []
    for version in versions(dialect, folder):
        with engine.connect() as conn:
            conn.execution_options(**{WRITE_OPTION: True})
            with conn.begin():
                _apply_version(conn, version, applied)
    return applied


def _apply_version(conn: Connection, version: Version, applied: list[str]) -> None:
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": MIGRATE_LOCK_KEY})
    done = conn.execute(text("SELECT 1 FROM schema_migrations WHERE version = :v"),
                        {"v": version.version}).first()
    if done:
        return
    for path in version.files:
        _run_script(conn, path)
    conn.execute(text("INSERT INTO schema_migrations (version, applied_at) VALUES (:v, :at)"),
                 {"v": version.version, "at": db_time(datetime.now(UTC))})
    applied.append(version.version)


def _run_script(conn: Connection, path: Path) -> None:
    script = path.read_text()
    cursor = conn.connection.cursor()  # the DBAPI cursor of this transaction: no % parsing
    try:
        if conn.dialect.name == "postgresql":
            cursor.execute(script)  # psycopg2 runs a multi-statement script ($$ bodies intact)
        else:
            for statement in split_sqlite(script):
                cursor.execute(statement)
    except Exception as error:
        raise StoreError(f"migration {path.name} failed: {_first_line(error)}") from error
    finally:
        cursor.close()


def split_sqlite(script: str) -> list[str]:
    """Statements of a SQLite script; trigger bodies (BEGIN ... END;) stay whole."""
    statements: list[str] = []
    buffer = ""
    for line in script.splitlines(keepends=True):
        buffer += line
        if sqlite3.complete_statement(buffer):
            if buffer.strip():
                statements.append(buffer)
            buffer = ""
    if _strip_comments(buffer).strip():
        statements.append(buffer)
    return [s for s in statements if _strip_comments(s).strip()]


def _strip_comments(sql: str) -> str:
    return "\n".join(line.split("--", 1)[0] for line in sql.splitlines())


def _first_line(error: BaseException) -> str:
    orig = getattr(error, "orig", None) or error
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0]
