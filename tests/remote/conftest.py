"""A real sshd fleet shared by the remote-execution tests (started once per session)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from tests.sshd.fleet import Fleet, start_fleet

FLEET_SPECS = [("node-a", "A100", 4), ("node-b", "T4", 2)]


@pytest.fixture(scope="session")
def sshd_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with start_fleet(tmp_path_factory.mktemp("sshd"), FLEET_SPECS) as fleet:
        saved = {k: os.environ.get(k) for k in fleet.airflow_env()}
        os.environ.update(fleet.airflow_env())
        try:
            yield fleet
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


@pytest.fixture
def base_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A job base directory of its own per test (nodes share this machine's filesystem)."""
    return str(tmp_path_factory.mktemp("jobs"))
