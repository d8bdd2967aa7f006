"""End-to-end DAG: a batch training that checkpoints on SIGTERM and resumes (preemption test).

The command appends everything it says to ``$GPU_POOL_E2E_OUT/train.log`` (the path is
fixed at parse time: the node's environment has only the allocation's variables). No
retries: a preemption that failed the task would fail the DAG.
"""

from __future__ import annotations

import os
import shlex
from datetime import datetime

from airflow.sdk import DAG
from e2e_common import out_dir

from gpu_pool.operators import GpuSSHOperator

LOG = shlex.quote(os.path.join(out_dir(), "train.log"))
TRAINING = f"exec >> {LOG} 2>&1\n" + r"""
ck="$GPU_POOL_CHECKPOINT_DIR/step"
step=0; stop=100000
if [ -s "$ck" ]; then step=$(cat "$ck"); stop=$((step + 5)); echo "resumed from step $step"; fi
echo "preempted before: $GPU_POOL_PREEMPTED"
trap 'echo "SIGTERM at step $step"; sleep 1; echo "$step" > "$ck"; echo "checkpoint written"; exit 143' TERM
while [ "$step" -lt "$stop" ]; do step=$((step + 1)); echo "step $step"; sleep 0.2 & wait $!; done
echo "finished at step $step"
"""

with DAG("e2e_preempt_batch", schedule="@once", start_date=datetime(2026, 1, 1),
         catchup=False, tags=["gpu-pool-e2e"]):
    # Job and checkpoint directories of this test run only: a checkpoint left by another
    # run of the same DAG run id would be resumed from.
    GpuSSHOperator(task_id="train", command=TRAINING, team="nlp", gpus=2, priority="batch",
                   preemption_grace=10, poll_interval=1, retries=0,
                   remote_base_dir=os.path.join(out_dir(), "jobs"))
