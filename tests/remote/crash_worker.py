"""One scheduler heartbeat of the GPU pool executor, in its own process, for the crash test.

``python crash_worker.py <pause point> <marker file> <ti uuid>``: queues the critical task
``d.urgent`` (4 GPUs) to a real :class:`GpuPoolExecutor` and runs one ``trigger_tasks``:
admission, the placement cycle (which preempts the batch training), then the preemption
step (the detached SSH kill). At the pause point the worker writes the marker and sleeps,
for the test to SIGKILL it there:

``in_preempt``   inside the apply transaction, right after the preemption's writes;
``in_place``     inside the apply transaction, right after the placement's writes;
``before_kill``  after the commit, just before the SSH kill is sent;
``none``         no pause: the heartbeat runs through (a restarted scheduler).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any


def main(point: str, marker: Path, ti_id: str) -> None:
    from airflow.executors.workloads import ExecuteTask
    from airflow.executors.workloads.base import BundleInfo
    from airflow.executors.workloads.task import TaskInstanceDTO

    from gpu_pool.executor import GpuPoolExecutor
    from gpu_pool.executor_support import preemption
    from gpu_pool.store import apply

    def pause(*_: Any) -> None:
        marker.write_text(point)
        time.sleep(3600)

    def after(original: Any) -> Any:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            pause()
            return result
        return wrapped

    if point == "in_preempt":
        apply.preempt = after(apply.preempt)
    elif point == "in_place":
        apply.place = after(apply.place)
    elif point == "before_kill":
        preemption.send_stop = pause

    executor = GpuPoolExecutor(parallelism=8)
    executor.start()
    ti = TaskInstanceDTO(id=uuid.UUID(ti_id), task_id="urgent", dag_id="d", run_id="r",
                         try_number=1, dag_version_id=uuid.UUID(int=1), pool_slots=1,
                         priority_weight=1, executor_config={"gpu_pool": {
                             "team": "nlp", "gpus": 4, "priority": "critical"}})
    workload = ExecuteTask(ti=ti, dag_rel_path=Path("d.py"), bundle_info=BundleInfo(name="b"),
                           log_path=None, token="")
    executor.queued_tasks[ti.key] = workload
    executor.trigger_tasks(open_slots=0)  # placed, not started: no task process here
    executor._wait_stops(timeout=60)
    print(json.dumps({"stops_in_flight": len(executor._stops_in_flight)}))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
