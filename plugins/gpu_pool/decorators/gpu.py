"""``@task.gpu``: a TaskFlow function whose return value is the command to run on the GPUs.

::

    from airflow.sdk import Asset, task

    @task.gpu(gpus=2, gpu_models=["A100", "H100"], team="nlp", purpose="training",
              priority="high", dataset=Asset("s3://corpora/zh-v3"), time_limit="6h")
    def finetune(epochs: int) -> str:
        return f"python train.py --epochs {epochs}"

Registered through :func:`gpu_pool.provider_info.get_provider_info` (``task-decorators``),
so ``task.gpu`` exists wherever the ``airflow-gpu-pool`` distribution is installed. Every
keyword of :class:`~gpu_pool.operators.GpuSSHOperator` is accepted; the GPU request is
validated when the function is called in the DAG body, i.e. at DAG parse time. The function
itself runs in the task process, just before the command is started on the node.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, ClassVar

from airflow.sdk.bases.decorator import (
    DecoratedOperator,
    TaskDecorator,
    determine_kwargs,
    task_decorator_factory,
)
from airflow.sdk.definitions._internal.types import SET_DURING_EXECUTION
from airflow.sdk.definitions.context import context_merge

from gpu_pool.operators.gpu_ssh import GpuSSHOperator


class _GpuDecoratedOperator(DecoratedOperator, GpuSSHOperator):
    """Calls the TaskFlow function for the command, then runs it as a GpuSSHOperator."""

    template_fields: Sequence[str] = (*DecoratedOperator.template_fields,
                                      *GpuSSHOperator.template_fields)
    template_fields_renderers: ClassVar[dict[str, str]] = {
        **DecoratedOperator.template_fields_renderers,
        **GpuSSHOperator.template_fields_renderers,
    }
    custom_operator_name: str = "@task.gpu"
    overwrite_rtif_after_execution: bool = True

    def __init__(self, *, python_callable: Callable[..., Any],
                 op_args: Collection[Any] | None = None,
                 op_kwargs: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(python_callable=python_callable, op_args=op_args,
                         op_kwargs=op_kwargs, command=SET_DURING_EXECUTION, **kwargs)

    def execute(self, context: Any) -> Any:
        context_merge(context, self.op_kwargs)
        kwargs = determine_kwargs(self.python_callable, self.op_args, context)
        command = self.python_callable(*self.op_args, **kwargs)
        if not isinstance(command, str) or not command.strip():
            raise TypeError(f"@task.gpu {self.task_id!r} must return the command to run on "
                            f"the node as a non-empty string, not {command!r}")
        self.command = command
        self.render_template_fields(context)
        return GpuSSHOperator.execute(self, context)


def gpu_task(python_callable: Callable[..., Any] | None = None,
             multiple_outputs: bool | None = None, **kwargs: Any) -> TaskDecorator:
    """Wrap a function returning a shell command into a :class:`GpuSSHOperator`."""
    return task_decorator_factory(python_callable=python_callable,
                                  multiple_outputs=multiple_outputs,
                                  decorated_operator_class=_GpuDecoratedOperator, **kwargs)
