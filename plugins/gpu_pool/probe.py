"""The node probe: what ``nvidia-smi`` on a node says about its GPUs, read over SSH.

One SSH command per node runs::

    nvidia-smi --query-gpu=index,name,memory.total,memory.used,utilization.gpu,temperature.gpu,uuid --format=csv,noheader,nounits
    nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv,noheader,nounits

and :func:`parse_gpu_csv` / :func:`parse_compute_apps_csv` turn the answer into
:class:`GpuReading` and :class:`ComputeProcess` values. The parsers also accept the
header and unit forms (``--format=csv``: ``81920 MiB``, ``37 %``), so output pasted from
a terminal parses too.

Health
    A device whose fields read ``[GPU requires reset]``, ``[Unknown Error]``, ``ERR!`` or
    ``[GPU is lost]`` is *unhealthy* (kept, marked, never placed on); ``[N/A]`` is just an
    unknown value (utilisation of a MIG device, memory of a unified-memory part).
Malformed output
    Anything else (wrong number of fields, a driver error message, duplicate indices) is a
    :class:`ProbeError` naming the line; the probe reports the node down with that reason.
Models
    :func:`model_of` maps the marketing name to our model names (``NVIDIA A100-SXM4-80GB``
    → ``A100``, ``Tesla T4`` → ``T4``); an unknown card keeps ``model = None``.

:func:`probe_node` never raises for a node problem: an unreachable node or a broken driver
gives ``NodeProbe(reachable=False | error=...)`` whose :attr:`~NodeProbe.state` is ``down``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from gpu_pool.errors import GpuPoolError
from gpu_pool.model import Gpu, NodeState

GPU_FIELDS = ("index", "name", "memory.total", "memory.used", "utilization.gpu",
              "temperature.gpu", "uuid")
APP_FIELDS = ("gpu_uuid", "pid", "used_memory")
GPU_QUERY = f"nvidia-smi --query-gpu={','.join(GPU_FIELDS)} --format=csv,noheader,nounits"
APPS_QUERY = f"nvidia-smi --query-compute-apps={','.join(APP_FIELDS)} --format=csv,noheader,nounits"
_SEPARATOR = "--gpu-pool-compute-apps--"
PROBE_COMMAND = (f"{GPU_QUERY}; echo \"{_SEPARATOR} $?\"; {APPS_QUERY} 2>/dev/null || true")

_UNHEALTHY = re.compile(r"^\[(GPU requires reset|Unknown Error|GPU is lost)\]$|^ERR!$", re.I)
_NOT_AVAILABLE = {"[N/A]", "N/A", "[Not Supported]", "Not Supported"}
_UNIT = re.compile(r"^(-?\d+(?:\.\d+)?)\s*(MiB|%|W|C)?$")

# (pattern on the upper-cased name, memory bound in MiB or None, our model) — first match wins,
# so A100 comes before A10 and the 40 GB variants before the 80 GB ones.
_MODEL_RULES: tuple[tuple[str, int | None, str], ...] = (
    (r"\bH200\b", None, "H200"),
    (r"\bH100\b", None, "H100"),
    (r"\bA100\b", 48 * 1024, "A100-40G"),  # at most 48 GiB reported: the 40 GB card
    (r"\bA100\b", None, "A100"),
    (r"\bL40S\b", None, "L40S"),
    (r"\bA30\b", None, "A30"),
    (r"\bA10G?\b", None, "A10"),
    (r"\bL4\b", None, "L4"),
    (r"\bV100\b", 20 * 1024, "V100M16"),
    (r"\bV100\b", None, "V100M32"),
    (r"\bP100\b", None, "P100"),
    (r"\bT4\b", None, "T4"),
)


class ProbeError(GpuPoolError):
    """``nvidia-smi`` answered something that is not the CSV it was asked for."""


@dataclass(frozen=True)
class GpuReading:
    """One device as ``nvidia-smi`` reported it at one moment."""

    index: int
    name: str
    model: str | None  # our model name, None for a card we do not know
    memory_total_mib: int | None
    memory_used_mib: int | None
    utilization_pct: float | None
    temperature_c: float | None
    uuid: str
    healthy: bool = True
    problem: str | None = None  # what made it unhealthy, as the driver said it

    def to_gpu(self) -> Gpu:
        return Gpu(index=self.index, model=self.model or self.name,
                   memory_mib=self.memory_total_mib or 0, healthy=self.healthy,
                   utilization_pct=self.utilization_pct)


@dataclass(frozen=True)
class ComputeProcess:
    gpu_uuid: str
    pid: int
    used_memory_mib: int | None


@dataclass(frozen=True)
class NodeProbe:
    """The result of probing one node."""

    node: str
    at: datetime
    reachable: bool
    readings: tuple[GpuReading, ...] = ()
    processes: tuple[ComputeProcess, ...] = ()
    error: str | None = None

    @property
    def state(self) -> NodeState:
        """``down`` when the node cannot be reached or its driver answers nonsense."""
        return NodeState.UP if self.reachable and self.error is None else NodeState.DOWN

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return tuple(r.to_gpu() for r in self.readings)


def model_of(name: str, memory_total_mib: int | None = None) -> str | None:
    """Our model name for a name ``nvidia-smi`` reports, or ``None`` for an unknown card."""
    upper = name.upper()
    memory = memory_total_mib
    match = re.search(r"(\d+)\s*GB\b", upper)
    if memory is None and match:
        memory = int(match.group(1)) * 1024
    for pattern, bound, model in _MODEL_RULES:
        if re.search(pattern, upper) and (bound is None or (memory is not None and memory <= bound)):
            return model
    return None


def _split(line: str) -> list[str]:
    return [cell.strip() for cell in line.split(",")]


def _rows(text: str, fields: Sequence[str], what: str) -> list[tuple[int, list[str]]]:
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        cells = _split(line)
        if [c.split(" [")[0] for c in cells] == list(fields):
            continue  # the header of --format=csv
        if len(cells) != len(fields):
            raise ProbeError(f"{what} line {number}: expected {len(fields)} fields "
                             f"({', '.join(fields)}), got {len(cells)}: {line.strip()[:200]!r}")
        rows.append((number, cells))
    return rows


def _number(cell: str, field: str, number: int) -> float | None:
    if cell in _NOT_AVAILABLE:
        return None
    match = _UNIT.match(cell)
    if not match:
        raise ProbeError(f"line {number}: {field} {cell!r} is not a number")
    return float(match.group(1))


def parse_gpu_csv(text: str) -> tuple[GpuReading, ...]:
    """Readings from ``--query-gpu=`` :data:`GPU_FIELDS` output (any ``--format=csv`` form)."""
    readings: list[GpuReading] = []
    seen: set[int] = set()
    for number, cells in _rows(text, GPU_FIELDS, "nvidia-smi --query-gpu"):
        index_cell, name, total, used, util, temp, uuid = cells
        if not index_cell.isdigit():
            raise ProbeError(f"nvidia-smi --query-gpu line {number}: index {index_cell!r} is "
                             "not a GPU index")
        index = int(index_cell)
        if index in seen:
            raise ProbeError(f"nvidia-smi --query-gpu line {number}: GPU index {index} twice")
        seen.add(index)
        problems = [c for c in (total, used, util, temp) if _UNHEALTHY.match(c)]
        values: dict[str, float | None] = {}
        for field, cell in zip(GPU_FIELDS[2:6], (total, used, util, temp), strict=True):
            values[field] = None if _UNHEALTHY.match(cell) else _number(cell, field, number)
        memory_total = None if values["memory.total"] is None else int(values["memory.total"])
        readings.append(GpuReading(
            index=index, name=name, model=model_of(name, memory_total),
            memory_total_mib=memory_total,
            memory_used_mib=None if values["memory.used"] is None else int(values["memory.used"]),
            utilization_pct=values["utilization.gpu"], temperature_c=values["temperature.gpu"],
            uuid=uuid, healthy=not problems, problem=problems[0] if problems else None))
    return tuple(sorted(readings, key=lambda r: r.index))


def parse_compute_apps_csv(text: str) -> tuple[ComputeProcess, ...]:
    processes = []
    for number, (uuid, pid, used) in _rows(text, APP_FIELDS, "nvidia-smi --query-compute-apps"):
        if not pid.isdigit():
            raise ProbeError(f"nvidia-smi --query-compute-apps line {number}: pid {pid!r}")
        memory = _number(used, "used_memory", number)
        processes.append(ComputeProcess(uuid, int(pid), None if memory is None else int(memory)))
    return tuple(processes)


def parse_probe_output(node: str, stdout: str, at: datetime) -> NodeProbe:
    """A :class:`NodeProbe` from what :data:`PROBE_COMMAND` printed on a reachable node."""
    gpu_text, sep, rest = stdout.partition(_SEPARATOR)
    if not sep:
        return NodeProbe(node, at, True, error="the probe's answer was cut short")
    status_line, _, apps_text = rest.partition("\n")
    if status_line.strip() != "0":
        detail = gpu_text.strip().splitlines()[-1:] or ["no output"]
        return NodeProbe(node, at, True, error=f"nvidia-smi failed (exit status "
                         f"{status_line.strip()}): {detail[0][:300]}")
    try:
        readings = parse_gpu_csv(gpu_text)
        processes = parse_compute_apps_csv(apps_text)
    except ProbeError as error:
        return NodeProbe(node, at, True, error=str(error))
    if not readings:
        return NodeProbe(node, at, True, error="nvidia-smi reported no GPUs")
    return NodeProbe(node, at, True, readings, processes)


def probe_node(node: str, ssh_conn_id: str, *, at: datetime | None = None,
               conn_timeout: int = 10, command_timeout: float = 30.0,
               conn_retry_attempts: int = 1) -> NodeProbe:
    """Probe one node over SSH (its Airflow connection). Never raises for a node problem."""
    from gpu_pool.remote.runner import RemoteJobRunner

    at = at or datetime.now(UTC)
    try:
        with RemoteJobRunner(ssh_conn_id, conn_timeout=conn_timeout,
                             command_timeout=command_timeout,
                             conn_retry_attempts=conn_retry_attempts) as runner:
            _, stdout, stderr = runner.exec(PROBE_COMMAND)
    except Exception as error:  # any failure to talk to the node means "down"
        return NodeProbe(node, at, False, error=f"unreachable over {ssh_conn_id!r}: "
                         f"{type(error).__name__}: {error}"[:500])
    probe = parse_probe_output(node, stdout, at)
    if probe.error and stderr.strip():
        return NodeProbe(node, at, True, error=f"{probe.error}; stderr: {stderr.strip()[:300]}")
    return probe


class ProbeSink(Protocol):
    """The store methods the probe writes through (see :mod:`gpu_pool.store`)."""

    def record_gpu_readings(self, node: str, readings: Sequence[GpuReading], at: datetime) -> Any: ...

    def set_node_state(self, name: str, state: NodeState, actor: str, reason: str) -> Any: ...


def record_probe(store: ProbeSink, probe: NodeProbe, *, current: NodeState | None = None,
                 actor: str = "probe") -> None:
    """Write a probe's readings; mark the node down (or back up) when that changed.

    A draining node stays draining while it answers: only an operator undrains it.
    """
    if probe.readings:
        store.record_gpu_readings(probe.node, probe.readings, probe.at)
    if probe.state is NodeState.DOWN and current is not NodeState.DOWN:
        store.set_node_state(probe.node, NodeState.DOWN, actor, probe.error or "probe failed")
    elif probe.state is NodeState.UP and current is NodeState.DOWN:
        store.set_node_state(probe.node, NodeState.UP, actor, "probe answered")
