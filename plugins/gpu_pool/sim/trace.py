"""Reading GPU-cluster traces in the Alibaba ``openb`` CSV format (cluster-trace-gpu-v2023).

Source: alibaba/clusterdata ``cluster-trace-gpu-v2023``, published with Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent",
USENIX ATC'23.

Node list columns: ``sn, cpu_milli, memory_mib, gpu, model``. Task list columns: ``name,
cpu_milli, memory_mib, num_gpu, gpu_milli`` and optionally ``gpu_spec, qos, pod_phase,
creation_time, deletion_time, scheduled_time`` (the ``multigpu*`` files stop after
``gpu_milli``). Extra columns are ignored, so a file can carry more than we read.

Every bad cell is a :class:`~gpu_pool.errors.SpecError` whose ``where`` is
``FILE:LINE:COLUMN`` (1-based; the header is line 1), naming the column, the value and what
would be valid. A missing column is reported at ``FILE:1``.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path

from gpu_pool.engine.fragmentation import MILLI, TaskShape
from gpu_pool.errors import SpecError
from gpu_pool.model import DEFAULT_GPU_MODELS
from gpu_pool.spec import parse_int, read_input_file

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
TASK_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
TASK_OPTIONAL = ("gpu_spec", "qos", "pod_phase", "creation_time", "deletion_time",
                 "scheduled_time")
QOS_VALUES = ("LS", "BE", "Burstable", "Guaranteed")
MAX_GPUS_PER_NODE = 8
MAX_CELL = 2**53  # any count or time in a trace: exact in a float, far inside int64
KNOWN_MODELS: tuple[str, ...] = tuple(m.name for m in DEFAULT_GPU_MODELS)


@dataclass(frozen=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str | None  # None for a node without GPUs


@dataclass(frozen=True)
class TraceTask:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int  # per GPU: 1..1000 when num_gpu > 0, else 0
    gpu_spec: frozenset[str] = frozenset()  # acceptable models; empty: any
    qos: str | None = None
    pod_phase: str | None = None
    creation_time: int | None = None
    deletion_time: int | None = None
    scheduled_time: int | None = None

    @property
    def total_gpu_milli(self) -> int:
        return self.num_gpu * self.gpu_milli

    @property
    def shape(self) -> TaskShape:
        return TaskShape(self.num_gpu, self.gpu_milli, self.cpu_milli, self.memory_mib,
                         self.gpu_spec)

    @property
    def gpu_spec_text(self) -> str:
        return "|".join(sorted(self.gpu_spec))


@dataclass(frozen=True)
class Trace:
    """A node list and a task list read from two CSV files."""

    nodes: tuple[TraceNode, ...]
    tasks: tuple[TraceTask, ...]
    nodes_path: str
    tasks_path: str

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)


class _Rows:
    """A CSV file read row by row, with cell access that locates its errors."""

    def __init__(self, path: Path, required: tuple[str, ...], field: str) -> None:
        """Reads the whole file (it must exist and be UTF-8) and checks its header: both
        before any row is looked at."""
        self.path = path
        self._reader = csv.reader(io.StringIO(read_input_file(path, field), newline=""))
        try:
            header = next(self._reader)
        except (StopIteration, csv.Error):
            raise SpecError("header", "", "a header line with " + ", ".join(required),
                            where=f"{path}:1") from None
        self.column = {name.strip(): i for i, name in enumerate(header)}
        for name in required:
            if name not in self.column:
                raise SpecError(name, None, "a column named " + repr(name) + " in the header ("
                                + ", ".join(required) + ")", where=f"{path}:1")
        self.row: list[str] = []

    def __iter__(self) -> Iterator[_Rows]:
        try:
            for row in self._reader:
                if not row or all(not c.strip() for c in row):
                    continue
                self.row = row
                yield self
        except csv.Error as error:  # a NUL byte, a field past the csv module's size limit
            raise SpecError("row", str(error), "a CSV row",
                            where=f"{self.path}:{self._reader.line_num}") from None

    @property
    def line(self) -> int:
        return self._reader.line_num

    def where(self, name: str) -> str:
        return f"{self.path}:{self.line}:{self.column[name] + 1}"

    def has(self, name: str) -> bool:
        return name in self.column

    def text(self, name: str) -> str:
        i = self.column[name]
        if i >= len(self.row):
            raise SpecError(name, None, f"a value in column {i + 1}", where=self.where(name))
        return self.row[i].strip()

    def integer(self, name: str, low: int = 0, high: int | None = None,
                optional: bool = False) -> int | None:
        raw = self.text(name)
        if raw == "" and optional:
            return None
        hint = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
        try:
            return parse_int(raw, name, minimum=low,
                             maximum=MAX_CELL if high is None else high, hint=hint)
        except SpecError as error:
            raise error.located(self.where(name)) from None


def load_nodes(path: str | Path, known_models: Collection[str] = KNOWN_MODELS) -> tuple[TraceNode, ...]:
    """The node list; each GPU node's model must be one of ``known_models``."""
    return _nodes(_Rows(Path(path), NODE_COLUMNS, "nodes"), known_models)


def _nodes(rows: _Rows, known_models: Collection[str]) -> tuple[TraceNode, ...]:
    path = rows.path
    nodes: list[TraceNode] = []
    seen: set[str] = set()
    for r in rows:
        name = r.text("sn")
        if not name:
            raise SpecError("sn", name, "a node name", where=r.where("sn"))
        if name in seen:
            raise SpecError("sn", name, "a name not used by an earlier node", where=r.where("sn"))
        seen.add(name)
        cpu = r.integer("cpu_milli")
        mem = r.integer("memory_mib")
        gpus = r.integer("gpu", 0, MAX_GPUS_PER_NODE)
        model = r.text("model") or None
        if gpus and model is None:
            raise SpecError("model", "", "the GPU model of a node with GPUs: one of "
                            + ", ".join(known_models), where=r.where("model"))
        if model is not None and model not in known_models:
            raise SpecError("model", model, "one of " + ", ".join(known_models),
                            where=r.where("model"))
        nodes.append(TraceNode(name, cpu, mem, gpus, model if gpus else None))
    if not nodes:
        raise SpecError("rows", 0, "at least one node", where=f"{path}:2")
    return tuple(nodes)


def load_tasks(path: str | Path, known_models: Collection[str] = KNOWN_MODELS) -> tuple[TraceTask, ...]:
    """The task list; models named in ``gpu_spec`` must be among ``known_models``."""
    return _tasks(_Rows(Path(path), TASK_COLUMNS, "pods"), known_models)


def _tasks(rows: _Rows, known_models: Collection[str]) -> tuple[TraceTask, ...]:
    path = rows.path
    tasks: list[TraceTask] = []
    for r in rows:
        name = r.text("name")
        if not name:
            raise SpecError("name", name, "a task name", where=r.where("name"))
        cpu = r.integer("cpu_milli")
        mem = r.integer("memory_mib")
        num_gpu = r.integer("num_gpu", 0, MAX_GPUS_PER_NODE)
        if num_gpu == 0:
            milli = r.integer("gpu_milli", 0, 0)
        elif num_gpu == 1:
            milli = r.integer("gpu_milli", 1, MILLI)
        else:
            milli = r.integer("gpu_milli", MILLI, MILLI)
        spec: frozenset[str] = frozenset()
        if r.has("gpu_spec"):
            raw = r.text("gpu_spec")
            parts = [p.strip() for p in raw.split("|") if p.strip()]
            for part in parts:
                if part not in known_models:
                    raise SpecError("gpu_spec", raw, "GPU models separated by '|', each one of "
                                    + ", ".join(known_models), where=r.where("gpu_spec"))
            spec = frozenset(parts)
        qos = r.text("qos") or None if r.has("qos") else None
        if qos is not None and qos not in QOS_VALUES:
            raise SpecError("qos", qos, "one of " + ", ".join(QOS_VALUES), where=r.where("qos"))
        phase = (r.text("pod_phase") or None) if r.has("pod_phase") else None
        times = {
            col: (r.integer(col, optional=True) if r.has(col) else None)
            for col in ("creation_time", "deletion_time", "scheduled_time")
        }
        created, deleted = times["creation_time"], times["deletion_time"]
        if created is not None and deleted is not None and deleted < created:
            raise SpecError("deletion_time", deleted, f"a time >= creation_time ({created})",
                            where=r.where("deletion_time"))
        tasks.append(TraceTask(name, cpu, mem, num_gpu, milli, spec, qos, phase, created,
                               deleted, times["scheduled_time"]))
    if not tasks:
        raise SpecError("rows", 0, "at least one task", where=f"{path}:2")
    return tuple(tasks)


def load_trace(nodes_path: str | Path, tasks_path: str | Path) -> Trace:
    """Both files read and their headers checked first, then their rows."""
    node_rows = _Rows(Path(nodes_path), NODE_COLUMNS, "nodes")
    task_rows = _Rows(Path(tasks_path), TASK_COLUMNS, "pods")
    return Trace(_nodes(node_rows, KNOWN_MODELS), _tasks(task_rows, KNOWN_MODELS),
                 str(nodes_path), str(tasks_path))
