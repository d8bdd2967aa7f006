"""Pure builders of the shell commands that run one GPU job on a node, and their parsers.

Nothing here does I/O: each ``build_*`` function returns one POSIX shell command to send
over SSH, each ``parse_*`` function reads what such a command printed. The runner
(:mod:`gpu_pool.remote.runner`, sync) and the trigger
(:mod:`gpu_pool.triggers.remote_job`, async) send them.

Terms
-----
job
    One run of one command on one node, under ``<base_dir>/<job_id>/`` (:class:`RemoteJob`).
job group
    The process group (and session) the command runs in. Its id (the *pgid*) is the pid of
    the job's leader, written to ``pid``. Killing the job signals the whole group.
monitor
    A small shell in its own session (outside the job group) that starts the group, waits
    for it, and writes the exit status to ``exit`` (atomically, via ``exit.tmp``). It also
    enforces the time limit on the node itself, so a job is stopped on time even when no
    Airflow component is watching.

Files of a job directory: ``log`` (stdout and stderr of the command), ``pid`` (the pgid),
``monitor.pid``, ``started`` (UTC epoch seconds), ``ended`` (UTC epoch seconds with their
fraction, written the moment the group's leader exits, before ``exit``: what the ledger
bills up to), ``exit`` (the exit status: 128+N when the command died of signal N),
``killed`` (why it was killed: ``time_limit``, ``cancelled``, ``preempted``...).

Preemption: the executor kills a preempted job with reason ``preempted`` (SIGTERM, the
task's grace, SIGKILL). The command sees ``GPU_POOL_CHECKPOINT_DIR`` (one directory per task
instance, kept across tries and preemptions, created at start) and ``GPU_POOL_PREEMPTED``
(how many times this try was preempted before): trap SIGTERM, save there, and resume from
it when started again.

Invariants
----------
* Every value that reaches a command (paths, job id, environment values, the user's command
  itself) passes through :func:`shlex.quote` at every level of nesting; environment names
  and kill reasons are checked against strict patterns. The user's command is interpreted
  by a shell exactly once, as its author wrote it; nothing else is ever interpreted.
* ``CUDA_VISIBLE_DEVICES`` and the ``GPU_POOL_*`` variables are exported *inside* the remote
  command (sshd's ``AcceptEnv`` would drop SSH environment requests).
* A kill signals the group with SIGTERM, waits the grace period, then SIGKILL; a pgid of 0
  or 1 (a broadcast) is never signalled.
"""

from __future__ import annotations

import enum
import math
import re
import secrets
import shlex
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_pool.errors import SpecError

DEFAULT_BASE_DIR = "/tmp/gpu-pool-jobs"
DEFAULT_KILL_GRACE_S = 10.0
STATUS_TAG = "gpu-pool-status"
KILL_TAG = "gpu-pool-kill"
START_TAG = "gpu-pool-started"

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_REASON = re.compile(r"^[a-z][a-z_]{0,31}$")
_BASE_DIR = re.compile(r"^/[A-Za-z0-9_./-]*$")
# Variables the allocation owns: a task's own environment may not override them.
RESERVED_ENV = ("CUDA_VISIBLE_DEVICES", "GPU_POOL_")


@dataclass(frozen=True)
class RemoteJob:
    """Where one job lives on its node (all paths derive from ``base_dir`` and ``job_id``)."""

    job_id: str
    base_dir: str = DEFAULT_BASE_DIR

    def __post_init__(self) -> None:
        if not _JOB_ID.match(self.job_id):
            raise SpecError("job_id", self.job_id, "1-200 characters: letters, digits, . _ -")
        if not _BASE_DIR.match(self.base_dir) or ".." in self.base_dir or self.base_dir == "/":
            raise SpecError("remote_base_dir", self.base_dir, "an absolute directory path "
                            "below / of letters, digits and . _ / - (no '..')")

    @property
    def job_dir(self) -> str:
        return f"{self.base_dir.rstrip('/')}/{self.job_id}"

    def path(self, name: str) -> str:
        return f"{self.job_dir}/{name}"

    def to_dict(self) -> dict[str, str]:
        return {"job_id": self.job_id, "base_dir": self.base_dir}

    @classmethod
    def from_dict(cls, data: Mapping[str, str]) -> RemoteJob:
        return cls(job_id=data["job_id"], base_dir=data.get("base_dir", DEFAULT_BASE_DIR))


def make_job_id(*parts: str, suffix_length: int = 8) -> str:
    """A job id from readable parts (request, node, try) and a random suffix."""
    readable = "_".join(re.sub(r"[^A-Za-z0-9.-]+", "-", p).strip("-.")[:60] for p in parts if p)
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
    suffix = "".join(secrets.choice(alphabet) for _ in range(suffix_length))
    return f"{readable}_{suffix}" if readable else f"job_{suffix}"


@dataclass(frozen=True)
class JobPlacement:
    """What the remote command is told about its allocation on this node."""

    node: str
    gpu_indices: tuple[int, ...]
    request: str
    gpu_milli: int = 1000
    allocation_id: str | None = None
    node_rank: int = 0
    node_count: int = 1
    nodes: tuple[str, ...] = ()  # every node of a gang, rank order
    # Where the command may keep checkpoints: the same for every try and every preemption
    # of one task instance (see :func:`checkpoint_dir`); created on the node at start.
    checkpoint_dir: str | None = None
    preemptions: int = 0  # how many times this try was preempted before this start

    def __post_init__(self) -> None:
        if self.checkpoint_dir is not None:
            RemoteJob("checkpoint-check", self.checkpoint_dir)  # the same path rules
        if isinstance(self.preemptions, bool) or not isinstance(self.preemptions, int) \
                or self.preemptions < 0:
            raise SpecError("preemptions", self.preemptions, "a count of 0 or more")
        for index in self.gpu_indices:
            if isinstance(index, bool) or not isinstance(index, int) or index < 0:
                raise SpecError("gpu_indices", self.gpu_indices, "non-negative GPU indices")
        if not 0 < self.gpu_milli <= 1000:
            raise SpecError("gpu_milli", self.gpu_milli, "1..1000 thousandths of a GPU")


def checkpoint_dir(base_dir: str, dag_id: str, task_id: str, run_id: str,
                   map_index: int = -1) -> str:
    """``<base_dir>/checkpoints/<dag>/<task>/<run>/<map_index>``: stable across the tries and
    preemptions of one task instance. Characters a path may not hold become ``_`` and a
    short hash of the exact key keeps two such names apart."""
    import hashlib

    key = f"{dag_id}\0{task_id}\0{run_id}\0{map_index}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]

    def part(text: str) -> str:
        return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip(".")[:80] or "_"

    path = (f"{base_dir.rstrip('/')}/checkpoints/{part(dag_id)}/{part(task_id)}/"
            f"{part(run_id)}-{digest}/{int(map_index)}")
    RemoteJob("checkpoint-check", path)  # refuses what the base directory rules refuse
    return path


def job_environment(placement: JobPlacement, job: RemoteJob,
                    extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables exported to the command: the allocation's, then the task's own.

    ``GPU_POOL_ALLOCATION`` reads ``gpu://<node>/<indices>`` (``@<milli>m`` for a share).
    """
    gpus = ",".join(str(i) for i in placement.gpu_indices)
    share = f"@{placement.gpu_milli}m" if placement.gpu_milli < 1000 else ""
    env = {
        "CUDA_VISIBLE_DEVICES": gpus,
        "GPU_POOL_NODE": placement.node,
        "GPU_POOL_GPUS": gpus,
        "GPU_POOL_GPU_MILLI": str(placement.gpu_milli),
        "GPU_POOL_REQUEST": placement.request,
        "GPU_POOL_ALLOCATION": f"gpu://{placement.node}/{gpus}{share}",
        "GPU_POOL_ALLOCATION_ID": placement.allocation_id or "",
        "GPU_POOL_JOB_ID": job.job_id,
        "GPU_POOL_JOB_DIR": job.job_dir,
        "GPU_POOL_METRICS_FILE": job.path(METRICS_FILE),
        "GPU_POOL_NODE_RANK": str(placement.node_rank),
        "GPU_POOL_NODE_COUNT": str(placement.node_count),
        "GPU_POOL_NODES": ",".join(placement.nodes or (placement.node,)),
        "GPU_POOL_PREEMPTED": str(placement.preemptions),
    }
    if placement.checkpoint_dir is not None:
        env["GPU_POOL_CHECKPOINT_DIR"] = placement.checkpoint_dir
    for name, value in (extra or {}).items():
        check_env_name(name)
        if name == RESERVED_ENV[0] or name.startswith(RESERVED_ENV[1]):
            raise SpecError("environment", name, "a variable other than CUDA_VISIBLE_DEVICES "
                            "and GPU_POOL_* (those describe the allocation)")
        env[name] = str(value)
    for name, value in env.items():
        if "\x00" in value:
            raise SpecError(f"environment.{name}", value, "a value without NUL characters")
    return env


def check_env_name(name: str) -> str:
    if not isinstance(name, str) or not _ENV_NAME.match(name):
        raise SpecError("environment", name, "a variable name of letters, digits and _ "
                        "(not starting with a digit)")
    return name


def _exports(env: Mapping[str, str]) -> str:
    return "".join(f"export {check_env_name(k)}={shlex.quote(v)}\n" for k, v in env.items())


# ``group_alive PGID``: whether any process of the group still runs. Zombies do not count
# (``kill -0`` would count them): they hold no GPU memory and wait only for a reaper,
# which in a container without an init may never come.
_GROUP_ALIVE = (
    "group_alive() { if command -v ps >/dev/null 2>&1; then "
    "ps -eo pgid=,stat= | awk -v g=\"$1\" '$1 == g && $2 !~ /^Z/ { f = 1 } END { exit !f }'; "
    "else kill -0 -- \"-$1\" 2>/dev/null; fi; }\n"
)


def _kill_script(job: RemoteJob, grace_s: float, reason: str) -> str:
    """Shell that kills the job group: SIGTERM, ``grace_s``, SIGKILL; prints one status line.

    Prints ``gpu-pool-kill absent`` (no live group), ``terminated`` (gone within the grace
    period), ``killed`` (needed SIGKILL) or ``survived`` (still there after SIGKILL).
    """
    if not _REASON.match(reason):
        raise SpecError("reason", reason, "lower-case letters and _ (e.g. 'cancelled')")
    ticks = max(1, int(round(grace_s * 10)))
    d = shlex.quote(job.job_dir)
    return _GROUP_ALIVE + f"""d={d}
p=$(cat "$d/pid" 2>/dev/null || true)
case "$p" in ''|*[!0-9]*) p=0 ;; esac
if [ "$p" -le 1 ] || ! group_alive "$p"; then echo '{KILL_TAG} absent'; exit 0; fi
[ -s "$d/killed" ] || printf '%s' {reason} > "$d/killed"
kill -TERM -- "-$p" 2>/dev/null
i=0
while group_alive "$p" && [ "$i" -lt {ticks} ]; do sleep 0.1; i=$((i+1)); done
if ! group_alive "$p"; then echo '{KILL_TAG} terminated'; exit 0; fi
kill -KILL -- "-$p" 2>/dev/null
i=0
while group_alive "$p" && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i+1)); done
if group_alive "$p"; then echo '{KILL_TAG} survived'; else echo '{KILL_TAG} killed'; fi
"""


def build_start_command(command: str, job: RemoteJob, env: Mapping[str, str], *,
                        time_limit_s: float | None = None,
                        kill_grace_s: float = DEFAULT_KILL_GRACE_S,
                        start_timeout_s: float = 60.0) -> str:
    """The command that starts ``command`` detached in its own process group.

    It prints ``gpu-pool-started <job_id> <pgid>`` once the group exists, and fails (exit
    status ≠ 0) if the job directory already exists, ``setsid`` is missing, or the group
    did not appear within ``start_timeout_s`` — in which case the job is cancelled so that
    nothing runs untracked.
    """
    if not isinstance(command, str) or not command.strip():
        raise SpecError("command", command, "a non-empty shell command to run on the node")
    d = shlex.quote(job.job_dir)
    # The job group's leader: records its pid (== pgid == sid after setsid), then becomes
    # the author's command, interpreted by bash once. A launcher that gave up waiting for it
    # left ``cancelled``: then it must not run at all.
    leader = (f"printf '%s' \"$$\" > {d}/pid\n[ -e {d}/cancelled ] && exit 125\n"
              f"{_exports(env)}exec bash -c {shlex.quote(command)}\n")
    watchdog = ""
    if time_limit_s is not None:
        kill = _kill_script(job, kill_grace_s, "time_limit")
        # Until the job has exited: once past the deadline, kill every second. The kill is
        # idempotent, and retrying covers a leader that had not yet written its pid.
        # `date +%s` drops the fraction of the second the job started in, so the deadline
        # is one second further: never before the limit (it fired after 7.2 s of an 8 s
        # limit in CI), at most about two seconds after it.
        watchdog = (
            f"deadline=$(( $(date +%s) + {int(math.ceil(time_limit_s)) + 1} ))\n"
            f"( while [ ! -e {d}/exit ]; do\n"
            f"    if [ \"$(date +%s)\" -ge \"$deadline\" ]; then bash -c {shlex.quote(kill)}; fi\n"
            f"    sleep 1\n"
            f"  done ) </dev/null >/dev/null 2>&1 &\n"
        )
    monitor = (
        f"printf '%s' \"$$\" > {d}/monitor.pid\n"
        f"date -u +%s > {d}/started\n"
        f"setsid -w bash -c {shlex.quote(leader)} </dev/null >>{d}/log 2>&1 &\n"
        "child=$!\n"
        f"{watchdog}"
        "wait \"$child\"\n"
        "ec=$?\n"
        # The end, to the nanosecond where date knows %N (GNU), before the exit status: a
        # poll that sees ``exit`` always finds ``ended``.
        f"{{ date -u +%s.%N 2>/dev/null || date -u +%s; }} > {d}/ended\n"
        f"printf '%s' \"$ec\" > {d}/exit.tmp && mv -f {d}/exit.tmp {d}/exit\n"
    )
    base = shlex.quote(job.base_dir)
    checkpoints = env.get("GPU_POOL_CHECKPOINT_DIR")
    make_checkpoints = f"mkdir -p {shlex.quote(checkpoints)}\n" if checkpoints else ""
    return f"""set -eu
umask 077
command -v setsid >/dev/null 2>&1 || {{ echo 'gpu-pool: setsid not found on the node' >&2; exit 127; }}
mkdir -p {base}
{make_checkpoints}mkdir {d}
: > {d}/log
setsid bash -c {shlex.quote(monitor)} </dev/null >/dev/null 2>&1 &
i=0
while [ ! -s {d}/pid ] && [ "$i" -lt {int(start_timeout_s * 20)} ]; do sleep 0.05; i=$((i+1)); done
if [ ! -s {d}/pid ]; then
  : > {d}/cancelled
  sleep 0.2
  bash -c {shlex.quote(_kill_script(job, 1.0, "start_timeout"))} >/dev/null 2>&1 || true
  echo 'gpu-pool: the job did not start in {start_timeout_s:g}s; cancelled' >&2
  exit 1
fi
echo "{START_TAG} {job.job_id} $(cat {d}/pid)"
"""


def parse_start_output(text: str, job: RemoteJob) -> int:
    """The pgid from the start command's output; :class:`RemoteJobError` if absent."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == START_TAG and parts[1] == job.job_id \
                and parts[2].isdigit():
            return int(parts[2])
    raise RemoteJobError(f"job {job.job_id}: no start confirmation in {text[-500:]!r}")


class JobState(enum.StrEnum):
    RUNNING = "running"
    EXITED = "exited"
    LOST = "lost"  # no exit status and no monitor: the node rebooted or the job was SIGKILLed
    MISSING = "missing"  # no job directory on the node


@dataclass(frozen=True)
class JobStatus:
    state: JobState
    exit_code: int | None = None
    group_alive: bool = False
    log_size: int = 0
    killed_reason: str | None = None
    ended_at: float | None = None  # UTC epoch seconds, by the node's clock (``ended``)

    @property
    def done(self) -> bool:
        return self.state is not JobState.RUNNING


class RemoteJobError(Exception):
    """A node answered something a job command never prints (or did not answer)."""


def build_poll_command(job: RemoteJob, log_offset: int | None = None,
                       max_bytes: int = 65536, wait_s: float = 0.0) -> str:
    """Prints ``gpu-pool-status <exit|-> <group alive 0|1> <monitor alive 0|1> <log bytes>
    <killed reason|-> <ended|->`` (or ``gpu-pool-status missing``).

    With ``wait_s``, the status is read once the job has exited or ``wait_s`` seconds have
    passed, whichever comes first (checked every 0.1 s, on the node): a watcher that polls
    this way learns of the end within a tenth of a second, with no more round trips than
    polling every ``wait_s`` seconds. It waits only while the monitor or the group lives.

    With ``log_offset``, up to ``max_bytes`` of the log from that offset follow the status
    line, read *after* the status: once the status says "exited", the log is complete. One
    round trip per poll (see :func:`split_poll_output`).
    """
    d = shlex.quote(job.job_dir)
    tail = "" if log_offset is None else build_log_read_command(job, log_offset, max_bytes) + "\n"
    number = "case \"$p\" in ''|*[!0-9]*) p=0 ;; esac; "
    wait = ""
    ticks = int(math.ceil(max(0.0, wait_s) * 10))
    if ticks:
        wait = (
            f"mp=$(cat \"$d/monitor.pid\" 2>/dev/null || true); "
            "case \"$mp\" in ''|*[!0-9]*) mp=0 ;; esac\n"
            f"gp=$(cat \"$d/pid\" 2>/dev/null || true); "
            "case \"$gp\" in ''|*[!0-9]*) gp=0 ;; esac\n"
            f"i=0; while [ ! -e \"$d/exit\" ] && [ \"$i\" -lt {ticks} ] && "
            "{ { [ \"$mp\" -gt 1 ] && kill -0 \"$mp\" 2>/dev/null; } || "
            "{ [ \"$gp\" -gt 1 ] && group_alive \"$gp\"; }; }; do sleep 0.1; i=$((i+1)); done\n"
        )
    return _GROUP_ALIVE + f"""d={d}
if [ ! -d "$d" ]; then echo '{STATUS_TAG} missing'; exit 0; fi
{wait}ec=-; [ -s "$d/exit" ] && ec=$(cat "$d/exit")
p=$(cat "$d/pid" 2>/dev/null || true); {number}
g=0; [ "$p" -gt 1 ] && group_alive "$p" && g=1
p=$(cat "$d/monitor.pid" 2>/dev/null || true); {number}
m=0; [ "$p" -gt 1 ] && kill -0 "$p" 2>/dev/null && m=1
size=$(stat -c%s "$d/log" 2>/dev/null || echo 0)
k=-; [ -s "$d/killed" ] && k=$(head -c 32 "$d/killed" | tr -c 'a-z_' '_')
en=-; [ -s "$d/ended" ] && en=$(head -c 32 "$d/ended" | tr -cd '0-9.')
echo "{STATUS_TAG} $ec $g $m $size $k ${{en:--}}"
{tail}"""


def split_poll_output(data: bytes) -> tuple[JobStatus, bytes]:
    """(status, log bytes) from the output of ``build_poll_command(job, log_offset)``."""
    at = data.find(STATUS_TAG.encode())  # the first: the log after it may contain anything
    if at < 0:
        raise RemoteJobError(f"no job status in the node's answer {data[-500:]!r}")
    end = data.find(b"\n", at)
    line = data[at:] if end < 0 else data[at:end]
    status = parse_poll_output(line.decode("utf-8", "replace"))
    return status, b"" if end < 0 else data[end + 1:]


def parse_poll_output(text: str) -> JobStatus:
    lines = [line for line in text.splitlines() if line.startswith(STATUS_TAG)]
    if not lines:
        raise RemoteJobError(f"no job status in the node's answer {text[-500:]!r}")
    parts = lines[-1].split()
    if parts[1:] == ["missing"]:
        return JobStatus(JobState.MISSING)
    if len(parts) != 7 or not all(p.isdigit() for p in parts[2:5]):
        raise RemoteJobError(f"malformed job status {lines[-1]!r}")
    _, code, group, monitor, size, killed, ended = parts
    reason = None if killed == "-" else killed
    if code != "-":
        if not code.isdigit():
            raise RemoteJobError(f"malformed exit status {code!r}")
        return JobStatus(JobState.EXITED, int(code), group == "1", int(size), reason,
                         _epoch(ended))
    state = JobState.RUNNING if monitor == "1" or group == "1" else JobState.LOST
    return JobStatus(state, None, group == "1", int(size), reason)


def _epoch(text: str) -> float | None:
    """``ended`` as seconds, or None where it is absent or not a number (a node whose date
    printed something else: the watcher's own clock stands in)."""
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def build_kill_command(job: RemoteJob, *, grace_s: float = DEFAULT_KILL_GRACE_S,
                       reason: str = "cancelled", detach: bool = False) -> str:
    """Kill the job group (see :func:`_kill_script`).

    With ``detach``, the kill runs on the node in its own session and the command returns
    at once (``gpu-pool-kill sent``): for callers that may not wait out the grace period.
    """
    script = _kill_script(job, grace_s, reason)
    if not detach:
        return script
    return (f"setsid bash -c {shlex.quote(script)} </dev/null >/dev/null 2>&1 &\n"
            f"echo '{KILL_TAG} sent'\n")


def parse_kill_output(text: str) -> str:
    """``absent``, ``terminated``, ``killed``, ``survived`` or ``sent``."""
    for line in reversed(text.splitlines()):
        parts = line.split()
        if len(parts) == 2 and parts[0] == KILL_TAG:
            return parts[1]
    raise RemoteJobError(f"no kill result in the node's answer {text[-500:]!r}")


def build_log_read_command(job: RemoteJob, offset: int, max_bytes: int = 65536) -> str:
    """Up to ``max_bytes`` of the job's log from byte ``offset``."""
    if offset < 0 or max_bytes <= 0:
        raise SpecError("offset", offset, "a non-negative offset and a positive size")
    return (f"tail -c +{int(offset) + 1} {shlex.quote(job.path('log'))} 2>/dev/null "
            f"| head -c {int(max_bytes)} || true")


METRICS_FILE = "metrics.json"
METRICS_MAX_BYTES = 65536


def build_metrics_read_command(job: RemoteJob) -> str:
    """The job's metrics file (what the command wrote to ``$GPU_POOL_METRICS_FILE``), if any."""
    return (f"head -c {METRICS_MAX_BYTES} {shlex.quote(job.path(METRICS_FILE))} "
            "2>/dev/null || true")


def is_metric_value(value: object) -> bool:
    """A ledger metric is a finite number (not a bool)."""
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value))


def parse_metrics(text: str, where: str) -> tuple[dict[str, float], list[str]]:
    """``({name: value}, problems)`` from a metrics file: a JSON object of numbers.

    A training that succeeded is not failed for a bad metrics file: what is not a finite
    number under a short name is left out, and each problem is said in ``problems`` (for the
    task log), naming the file, the key and the value.
    """
    import json

    if not text.strip():
        return {}, []
    try:
        data = json.loads(text)
    except ValueError as error:
        return {}, [f"{where}: not JSON ({error}); expected an object such as "
                    '{"val_loss": 0.12, "gpu_mem_peak_mib": 30500}']
    if not isinstance(data, dict):
        return {}, [f"{where}: got a JSON {type(data).__name__}; expected an object of "
                    "name: number"]
    metrics: dict[str, float] = {}
    problems = []
    for name, value in data.items():
        ok_name = isinstance(name, str) and 0 < len(name) <= 64
        if ok_name and is_metric_value(value):
            metrics[name] = float(value)
        else:
            problems.append(f"{where}: {name!r}: got {value!r}; expected a finite number "
                            "under a name of 1 to 64 characters")
    return metrics, problems


def build_cleanup_command(job: RemoteJob) -> str:
    """Remove the job directory (only ever a directory under the base directory)."""
    return f"rm -rf -- {shlex.quote(job.job_dir)}"
