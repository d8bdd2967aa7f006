"""The executor's Airflow-free pieces: request names, external ids, the env contract, config."""

from __future__ import annotations

import configparser
from dataclasses import dataclass

import pytest

from gpu_pool import airflow_config
from gpu_pool.executor_support.naming import external_id, parse_external_id, request_name
from gpu_pool.spec import parse_name


@dataclass(frozen=True)
class Key:
    dag_id: str
    task_id: str
    run_id: str
    map_index: int = -1
    try_number: int = 1


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        (Key("train", "finetune", "manual__2026-12-01T12:00:00+00:00"),
         "train.finetune.1@manual__2026-12-01T12:00:00+00:00"),
        (Key("train", "sweep", "r1", map_index=3, try_number=2), "train.sweep.3.2@r1"),
    ],
)
def test_request_name_is_readable_and_deterministic(key: Key, expected: str) -> None:
    assert request_name(key) == expected
    assert parse_name(request_name(key)) == expected


def test_request_name_falls_back_to_a_valid_hash() -> None:
    long_key = Key("d" * 200, "t" * 100, "run with spaces")
    name = request_name(long_key)
    assert name.startswith("ti-") and parse_name(name) == name
    assert request_name(long_key) == name
    assert request_name(Key("d" * 200, "t" * 100, "run with spaces", try_number=2)) != name


def test_external_id_round_trip() -> None:
    parts = (("node-a", (0, 1)), ("node-b", (2,)))
    text = external_id(parts)
    assert text == "gpu://node-a/0,1+node-b/2"
    assert parse_external_id(text) == parts
    assert parse_external_id("celery-uuid") is None
    assert parse_external_id(None) is None


def test_airflow_settings_to_env_and_cfg(tmp_path) -> None:
    values = airflow_config.settings(store_url="sqlite:///x.db", dags_folder=tmp_path,
                                     extra={"scheduler": {"task_queued_timeout": 5}})
    env = airflow_config.as_environment(values)
    assert env["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor,GpuPool:gpu_pool.executor.GpuPoolExecutor"
    assert env["AIRFLOW__GPU_POOL__STORE_URL"] == "sqlite:///x.db"
    assert env["AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT"] == "5"
    cfg = tmp_path / "airflow.cfg"
    cfg.write_text("[core]\nfernet_key = keep-me\n")
    airflow_config.write_airflow_cfg(cfg, values)
    parser = configparser.ConfigParser(interpolation=None)
    parser.read(cfg)
    assert parser["core"]["fernet_key"] == "keep-me"
    assert parser["core"]["executor"] == airflow_config.EXECUTORS
    assert parser["gpu_pool"]["store_url"] == "sqlite:///x.db"
