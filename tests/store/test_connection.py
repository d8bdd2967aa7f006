"""Where the store is: --db, then GPU_POOL_DB_URL, then the Airflow connection, then SQLite."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_pool.errors import SpecError
from gpu_pool.store import Store, resolve_db_url
from gpu_pool.store.connection import connection_to_url, display_url, parse_url


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No store settings at all; AIRFLOW_HOME is an empty folder without airflow.cfg."""
    for name in ("GPU_POOL_DB_URL", "AIRFLOW_CONN_GPU_POOL_DB"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path / "airflow-home"))
    return monkeypatch


def test_resolution_order(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    default = f"sqlite:///{tmp_path / 'airflow-home' / 'gpu_pool.db'}"
    assert resolve_db_url(None) == default
    # Resolving makes nothing: only a command that creates a store (db migrate) makes its
    # folder, and any other refuses a store that is not there.
    assert not (tmp_path / "airflow-home").exists()
    env.setenv("AIRFLOW_CONN_GPU_POOL_DB", "postgres://af:pw@db.example.com:5433/gp")
    assert resolve_db_url(None) == "postgresql://af:pw@db.example.com:5433/gp"
    env.setenv("GPU_POOL_DB_URL", "postgresql://env@h/e")
    assert resolve_db_url(None) == "postgresql://env@h/e"
    assert resolve_db_url("sqlite:///cli.db") == "sqlite:///cli.db"
    assert resolve_db_url("") == "postgresql://env@h/e"  # an empty --db is no --db


def test_home_defaults_to_tilde_airflow(env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    env.delenv("AIRFLOW_HOME")
    env.setenv("HOME", str(tmp_path / "home"))
    assert resolve_db_url(None) == f"sqlite:///{tmp_path / 'home' / 'airflow' / 'gpu_pool.db'}"


@pytest.mark.parametrize(("raw", "url"), [
    ("postgres://u:p%40ss@h:5432/db", "postgresql://u:p%40ss@h:5432/db"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    (json.dumps({"conn_type": "postgres", "host": "h", "login": "u", "password": "p",
                 "schema": "db", "port": 6432}), "postgresql://u:p@h:6432/db"),
    ("sqlite://%2Fvar%2FGpuPool.db", "sqlite:////var/GpuPool.db"),
    (json.dumps({"conn_type": "sqlite", "host": "/data/gp.db"}), "sqlite:////data/gp.db"),
])
def test_airflow_connection_forms(raw: str, url: str) -> None:
    assert connection_to_url(raw) == url


def test_airflow_connection_of_another_kind_is_refused() -> None:
    with pytest.raises(SpecError) as caught:
        connection_to_url("mysql://u@h/db")
    assert caught.value.value == "mysql" and "postgres or sqlite" in caught.value.expected


@pytest.mark.parametrize("bad", ["not a url", "mysql://u@h/db", "http://x"])
def test_bad_urls_are_spec_errors(bad: str) -> None:
    with pytest.raises(SpecError) as caught:
        Store.from_url(bad)
    assert caught.value.field == "db" and "sqlite:///" in caught.value.expected


def test_postgresql_urls_use_psycopg2_and_hide_passwords() -> None:
    assert parse_url("postgresql://u:pw@h/db").drivername == "postgresql+psycopg2"
    assert display_url("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"


def test_sqlite_store_creates_its_folder(tmp_path: Path) -> None:
    store = Store.from_url(f"sqlite:///{tmp_path / 'deep' / 'er' / 'gp.db'}")
    assert store.migrate()
    assert (tmp_path / "deep" / "er" / "gp.db").exists()
    store.close()


@pytest.mark.slow
def test_configured_airflow_is_asked_for_the_connection(env: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    """With airflow.cfg in AIRFLOW_HOME, Airflow's own lookup (its secrets backends) is used.

    A local-filesystem secrets backend stands in for the metadata database, which would
    take a minute of `airflow db migrate` to create here.
    """
    home = tmp_path / "airflow-home"
    home.mkdir()
    conns = home / "connections.json"
    conns.write_text(json.dumps({"gpu_pool_db": "postgres://al:pw@db.example.com/gp"}))
    (home / "airflow.cfg").write_text(
        "[core]\nload_examples = False\n[secrets]\n"
        "backend = airflow.secrets.local_filesystem.LocalFilesystemBackend\n"
        f'backend_kwargs = {{"connections_file_path": "{conns}"}}\n')
    probe = "from gpu_pool.store import resolve_db_url; print(resolve_db_url(None))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "postgresql://al:pw@db.example.com/gp"


def test_a_store_that_is_not_there_is_refused_unless_created(tmp_path: Path) -> None:
    from gpu_pool.errors import SpecError
    from gpu_pool.store import Store

    url = f"sqlite:///{tmp_path / 'typo' / 'gpu_pool.db'}"
    with pytest.raises(SpecError, match=r"^db: got 'sqlite:///.*; expected an existing gpu-pool "
                                        r"store; create one with `gpu-pool --db sqlite:///"
                                        r".*/typo/gpu_pool.db db migrate` \(no file "):
        Store.from_url(url, create=False)
    assert not (tmp_path / "typo").exists()
    empty = tmp_path / "empty.db"
    empty.touch()  # a SQLite file without gpu-pool's schema
    with pytest.raises(SpecError, match="the database has no gpu-pool schema"):
        Store.from_url(f"sqlite:///{empty}", create=False)
    made = Store.from_url(url)  # create=True (db migrate, the demo, the executor)
    made.migrate()
    made.close()
    Store.from_url(url, create=False).close()
