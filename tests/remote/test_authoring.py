"""Authoring: @task.gpu and GpuSSHOperator validate at DAG parse time; provider discovery."""

from __future__ import annotations

import json
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from airflow.sdk import DAG, Asset, task

from gpu_pool.decorators.gpu import gpu_task
from gpu_pool.errors import SpecError
from gpu_pool.operators import GpuSSHOperator
from gpu_pool.provider_info import get_provider_info


def test_provider_info_registers_the_decorator() -> None:
    info = get_provider_info()
    assert info["package-name"] == "airflow-gpu-pool"
    assert info["task-decorators"] == [
        {"name": "gpu", "class-name": "gpu_pool.decorators.gpu.gpu_task"}]


def test_task_gpu_is_ours() -> None:
    assert task.gpu is gpu_task


def test_the_issue_example_routes_to_the_gpu_pool_executor() -> None:
    with DAG("nlp_finetune", schedule=None):
        @task.gpu(gpus=2, gpu_models=["A100", "H100"], team="nlp", purpose="training",
                  priority="high", dataset=Asset("s3://corpora/zh-v3", extra={"zone": "eu",
                                                                              "size_gib": 120}),
                  time_limit=timedelta(hours=6))
        def finetune() -> str:
            return "python train.py --epochs 3"

        op = finetune().operator
    assert op.executor == "GpuPool"
    spec = op.executor_config["gpu_pool"]
    assert spec == {"team": "nlp", "gpus": 2, "gpu_models": ["A100", "H100"],
                    "purpose": "training", "priority": "high", "time_limit": 21600.0,
                    "dataset": "s3://corpora/zh-v3", "dataset_zone": "eu",
                    "dataset_size_gib": 120}
    json.dumps(spec)  # plain data all the way down
    assert [a.uri for a in op.inlets] == ["s3://corpora/zh-v3"]
    assert op.time_limit_s == 21600.0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"gpus": 0, "team": "nlp"}, "gpus"),
    ({"gpus": 1}, "team"),
    ({"gpus": 1, "team": "nlp", "gpu_models": ["Z80"]}, "gpu_models"),
    ({"gpus": 1, "team": "nlp", "priority": "urgent"}, "priority"),
    ({"gpus": 1, "team": "nlp", "time_limit": "soon"}, "time_limit"),
    ({"gpu_share": 1500, "team": "nlp"}, "gpu_share"),
    ({"gpus": 1, "team": "nlp", "min_gpu_memory": "lots"}, "min_gpu_memory"),
    ({"gpus": 1, "team": "nlp", "environment": {"A-B": "x"}}, "environment"),
    ({"gpus": 1, "team": "nlp", "warn_at": 1.5}, "warn_at"),
    ({"gpus": 1, "team": "nlp", "executor": "LocalExecutor"}, "executor"),
    ({"gpus": 1, "team": "nlp", "remote_base_dir": "/tmp/$(x)"}, "remote_base_dir"),
    ({"gpus": 1, "team": "nlp", "kill_grace": "never"}, "kill_grace"),
])
def test_bad_specs_fail_at_dag_definition_naming_task_and_field(kwargs: dict,
                                                                field: str) -> None:
    with DAG("bad", schedule=None), pytest.raises(SpecError) as info:
        @task.gpu(**kwargs)
        def train_model() -> str:
            return "true"

        train_model()
    assert info.value.field == field
    assert str(info.value).startswith(f"task 'train_model': {field}: got ")


def test_operator_keeps_the_users_executor_config() -> None:
    op = GpuSSHOperator(task_id="t", command="true", gpus=1, team="nlp",
                        executor_config={"other": 1})
    assert op.executor_config == {"other": 1, "gpu_pool": {"team": "nlp", "gpus": 1}}


@pytest.mark.slow
def test_a_bad_spec_is_a_dag_import_error_naming_task_and_field(tmp_path: Path) -> None:
    from airflow.dag_processing.dagbag import DagBag

    (tmp_path / "bad_dag.py").write_text(textwrap.dedent("""
        from airflow.sdk import DAG, task

        with DAG("bad_gpu_dag", schedule=None):
            @task.gpu(gpus=3, team="nlp", gpu_models=["A100", "B9000"])
            def pretrain() -> str:
                return "python pretrain.py"

            pretrain()
    """))
    bag = DagBag(dag_folder=str(tmp_path))
    (error,) = bag.import_errors.values()
    assert "task 'pretrain': gpu_models: got 'B9000'; expected a known GPU model" in error


def test_the_scheduler_sees_the_routing_after_serialization() -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    with DAG("serialized_gpu", schedule=None) as dag:
        @task.gpu(gpu_share=250, team="cv", priority="critical", time_limit="90m")
        def infer() -> str:
            return "python serve.py"

        infer()
    rebuilt = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    op = rebuilt.get_task("infer")
    assert op.executor == "GpuPool"
    assert op.executor_config == {"gpu_pool": {"gpu_share": 250, "team": "cv",
                                               "priority": "critical", "time_limit": 5400.0}}


def test_a_task_names_a_template_and_sets_only_what_differs() -> None:
    with DAG("templated", schedule=None):
        @task.gpu(team="nlp", template="llm-finetune", priority="high")
        def finetune() -> str:
            return "python train.py"

        op = finetune().operator
    spec = op.executor_config["gpu_pool"]
    assert spec["template"] == "llm-finetune" and spec["priority"] == "high"
    assert "gpus" not in spec  # the template's, added by the executor at admission
    with pytest.raises(SpecError, match="task 'bad': template: got 'no spaces'"):
        GpuSSHOperator(task_id="bad", command="true", team="nlp", template="no spaces")
