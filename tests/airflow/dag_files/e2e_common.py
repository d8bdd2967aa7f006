"""Helpers shared by the end-to-end DAG files (copied next to them into the DAGs folder).

``probe_command(name, seconds)`` is the remote command of a test GPU task: on the node it
appends ``start``/``end`` lines with wall-clock timestamps, the node it really ran on
(``GPU_POOL_TEST_NODE``, set by that node's sshd) and the ``CUDA_VISIBLE_DEVICES`` it saw,
to ``$GPU_POOL_E2E_OUT/<name>.log`` — the file the tests read — and, once done, the metric
``probe_seconds`` to ``$GPU_POOL_METRICS_FILE`` (it must reach the task's ledger row).
"""

from __future__ import annotations

import os
import shlex


def out_dir() -> str:
    return os.environ.get("GPU_POOL_E2E_OUT", "/tmp/gpu-pool-e2e")


def probe_command(name: str, seconds: float) -> str:
    log = shlex.quote(os.path.join(out_dir(), f"{name}.log"))
    stamp = ('echo "$1 $(date +%s.%N) node=${GPU_POOL_TEST_NODE:-?} '
             'cuda=${CUDA_VISIBLE_DEVICES:-none} milli=${GPU_POOL_GPU_MILLI:-1000} '
             f'pgid=$(ps -o pgid= $$ | tr -d " ")" >> {log}')
    metrics = (f'printf \'{{"probe_seconds": {float(seconds)}}}\' > "$GPU_POOL_METRICS_FILE"')
    return (f"stamp() {{ {stamp}; }}; stamp start; sleep {seconds}; stamp end; "
            f"{metrics}")
