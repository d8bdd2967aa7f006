"""The bounds every value from outside must keep, whichever way it comes in.

One table for the whole boundary: :mod:`gpu_pool.spec` refuses a value past these with a
:class:`~gpu_pool.errors.SpecError` that states the bound, and :mod:`gpu_pool.store.checks`
applies the same ones to objects built in code. They are generous for any real fleet and
keep every number far inside what Python's C layer (``timedelta``, ``float``) and the
database's columns (32-bit ``INTEGER`` on PostgreSQL) hold, so no overflow ever reaches
either.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

MAX_GPUS_PER_NODE = 64
MAX_GANG_NODES = 1024
MAX_CPU_CORES = 100_000  # millicores stay below 2**31
MAX_MEMORY_MIB = 2**30  # 1 PiB: host RAM, GPU memory, a request's RAM
MAX_DURATION = timedelta(days=366)  # time limits, estimated runtimes
MAX_GRACE = timedelta(hours=1)  # a task's SIGTERM-to-SIGKILL grace when preempted
MAX_QUOTA_GPUS = 1_000_000
MAX_GPU_HOURS = 1e9  # a quota's GPU-hour budget
MAX_DATASET_GIB = 1e9  # an exabyte
MAX_BANDWIDTH_MB_S = 1e7  # 10 TB/s
EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)  # quota windows, submission times
LATEST = datetime(2200, 1, 1, tzinfo=UTC)
# How far a submission time given by a user may be from now: clock skew, nothing more (an
# old one would jump the queue through aging, a future one would sit behind everything).
SUBMITTED_AT_SKEW = timedelta(minutes=5)
MAX_TEXT = 500  # reasons, free text
MAX_URI = 2048  # dataset URIs, webhook URLs
MAX_LABELS = 64
MAX_LABEL_TEXT = 256
MAX_INPUT_FILE_BYTES = 64 * 1024 * 1024  # request, node and quota files
# The sharing policy (gpu_pool.policy_file).
MAX_PRIORITY_WEIGHT = 1_000_000  # aged weights times milli stay far inside CP-SAT's int64
MAX_PREEMPTIONS_PER_TASK = 1000
MAX_RESERVATIONS = 1000
# Requests given a start estimate per cycle (Policy.start_estimates) at most.
MAX_START_ESTIMATES = 100_000
MAX_SOLVER_SECONDS = 60.0  # one placement cycle's solver budget
MAX_SOLVER_WORKERS = 64
MAX_SOLVER_SEED = 2**31 - 1
MAX_CROSS_ZONE_MARGIN = 100.0
MAX_BUDGET_ALERT_PCT = 1000
MAX_POLICY_ENTRIES = 1000  # headroom rules, windows, zone links, GPU models, alert steps
MAX_GPU_PRICE = 1e6  # per GPU-hour
