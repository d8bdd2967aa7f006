"""Migrations: applied in order, once; an unmigrated or unreachable store says so plainly."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from gpu_pool.errors import StoreError
from gpu_pool.store import Store
from gpu_pool.store.migrate import split_sqlite, sql_dir, versions


def test_migrate_applies_every_version_once(store_url: str) -> None:
    store = Store.from_url(store_url)
    expected = [v.version for v in versions(store.dialect)]
    assert "001_store" in expected and "002_guard" in expected
    assert store.migrate() == expected
    assert store.migrate() == []  # idempotent
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT version FROM schema_migrations ORDER BY version"))
        assert [r[0] for r in rows] == sorted(expected)
    store.close()


def test_unmigrated_store_refuses_with_the_fix(store_url: str) -> None:
    store = Store.from_url(store_url)
    with pytest.raises(StoreError, match=r"not migrated .*run `gpu-pool db migrate`"):
        store.list_nodes()
    store.close()


def test_a_new_numbered_file_is_applied_by_the_next_migrate(store_url: str, tmp_path,
                                                            monkeypatch) -> None:  # noqa: ANN001
    folder = tmp_path / "sql"
    folder.mkdir()
    for path in sql_dir().glob("00*.sql"):
        (folder / path.name).write_text(path.read_text())
    monkeypatch.setenv("GPU_POOL_SQL_DIR", str(folder))
    store = Store.from_url(store_url)
    first = store.migrate()
    (folder / "050_extra.sql").write_text("CREATE TABLE extra_things (id TEXT PRIMARY KEY);\n")
    (folder / "050_extra.sqlite.sql").write_text("CREATE INDEX extra_s ON extra_things (id);\n")
    (folder / "050_extra.postgresql.sql").write_text("CREATE INDEX extra_p ON extra_things (id);\n")
    assert store.migrate() == ["050_extra"]
    assert "050_extra" not in first
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM extra_things")).scalar() == 0
    store.close()


def test_a_failing_migration_names_its_file_and_leaves_nothing(store_url: str, tmp_path,
                                                               monkeypatch) -> None:  # noqa: ANN001
    folder = tmp_path / "sql"
    folder.mkdir()
    (folder / "001_ok.sql").write_text("CREATE TABLE ok_things (id TEXT PRIMARY KEY);\n")
    (folder / "002_bad.sql").write_text("CREATE TABLE half (id TEXT);\nCREATE TABLE oops (;\n")
    monkeypatch.setenv("GPU_POOL_SQL_DIR", str(folder))
    store = Store.from_url(store_url)
    with pytest.raises(StoreError, match="002_bad.sql failed"):
        store.migrate()
    with store.engine.connect() as conn:
        done = [r[0] for r in conn.execute(text("SELECT version FROM schema_migrations"))]
        assert done == ["001_ok"]
        tables = ("SELECT name FROM sqlite_master WHERE name = 'half'" if store.dialect == "sqlite"
                  else "SELECT to_regclass('half')")
        assert conn.execute(text(tables)).scalar() is None
    store.close()


def test_unreachable_server_is_a_store_error_without_password() -> None:
    with pytest.raises(StoreError, match=r"cannot reach it") as caught:
        Store.from_url("postgresql://gp:s3cret@127.0.0.1:1/nowhere")
    assert "s3cret" not in str(caught.value)
    assert "127.0.0.1:1/nowhere" in str(caught.value)


def test_sqlite_split_keeps_trigger_bodies_whole() -> None:
    script = ("-- a comment; with a semicolon\nCREATE TABLE a (x INT);\n"
              "CREATE TRIGGER t AFTER INSERT ON a BEGIN\n  UPDATE a SET x = 1;\n  "
              "UPDATE a SET x = 2;\nEND;\n-- trailing comment\n")
    parts = split_sqlite(script)
    assert len(parts) == 2
    assert "UPDATE a SET x = 2" in parts[1]
