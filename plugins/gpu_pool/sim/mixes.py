"""Workload mixes made from a trace, the way the FGD paper's openb variants are made.

The paper (Weng et al., USENIX ATC'23, figures 11 and 13) varies the proportion of GPU
requests that share a card (``gpushare40`` .. ``gpushare100``) and that name a GPU model
(``gpuspec10`` .. ``gpuspec33``). Only some of those files are published with the trace, so
the others are made here from the ones we have:

- :func:`with_shares` replaces whole-GPU tasks by copies of the trace's own share tasks
  until share tasks ask for ``fraction`` of the GPU requests (GPU-milli: a 0.4-card task asks
  400, an 8-GPU task 8,000; measured so, ``gpushare40`` is 40.1 % and ``default`` 28.5 %).
  That is how the published ``gpushare40`` was made from ``default``: every one of its rows
  is a row of ``default`` (shape and times), its 1,088 CPU-only tasks are untouched, and 923
  whole-GPU tasks (singles and multi-GPU alike, 23 % and 17 % of each) gave way to copies of
  share tasks, whose CPU and memory come with them. A replaced task keeps its name; it takes
  the copied task's CPU, memory, share, model, QoS and times. Keeping the replaced task's
  CPU instead (an 88-core 8-GPU task become a half-card task, as this module first did)
  gives mixes far more CPU-bound than the paper's: the engine left 15.8 % and 20.7 %
  unallocated at 80 % and 100 % on seed 42, against 10.8 % at 80 % with copies.
- :func:`with_models` gives tasks that name no model one drawn from the trace's own
  ``gpu_spec`` values among tasks of the same GPU count (``gpuspec10`` is 10.9 % by GPU
  requests, 10.4 % by tasks). With ``nodes``, a task draws only values some node could hold
  it under, so a mix never asks for a card that cannot take the task.

Both are seeded and deterministic, keep every task's name and the order of the list, leave
tasks they do not change as they were, and never remove a share or a model the trace already
has: a fraction below the trace's own is refused, as is a trace with nothing to draw from.
"""

from __future__ import annotations

import csv
import os
import random
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from gpu_pool.engine.fragmentation import MILLI
from gpu_pool.errors import SpecError
from gpu_pool.sim.trace import TASK_COLUMNS, TASK_OPTIONAL, TraceNode, TraceTask


def _requested(task: TraceTask) -> int:
    return task.num_gpu * task.gpu_milli


def _is_share(task: TraceTask) -> bool:
    return task.num_gpu == 1 and task.gpu_milli < MILLI


def _fraction(tasks: Sequence[TraceTask], counted) -> float:
    total = sum(_requested(t) for t in tasks)
    return sum(_requested(t) for t in tasks if counted(t)) / total if total else 0.0


def share_fraction(tasks: Sequence[TraceTask]) -> float:
    """The share of GPU requests (GPU-milli) made by tasks that take part of one card."""
    return _fraction(tasks, _is_share)


def model_fraction(tasks: Sequence[TraceTask]) -> float:
    """The share of GPU requests (GPU-milli) made by tasks that name a GPU model."""
    return _fraction(tasks, lambda t: bool(t.gpu_spec))


def _check_fraction(fraction: float, field: str, current: float) -> None:
    if not current - 1e-9 <= fraction <= 1:
        raise SpecError(field, fraction, f"a fraction from the trace's own {current:.4f} up to "
                        "1 (a mix only adds; it never takes away what the trace has)")


def with_shares(tasks: Sequence[TraceTask], fraction: float, seed: int) -> tuple[TraceTask, ...]:
    """``tasks`` with whole-GPU tasks, drawn at random, each replaced by a copy of a share
    task drawn at random from the trace's own (name kept), until share tasks make
    ``fraction`` of the GPU requests (the first replacement that reaches it is the last)."""
    _check_fraction(fraction, "share-fraction", share_fraction(tasks))
    donors = [t for t in tasks if _is_share(t)]
    if not donors:
        raise SpecError("pods", "no share tasks", "a task list with tasks that take part of a "
                        "card (gpu_milli < 1000), whose copies replace whole-GPU tasks")
    rng = random.Random(seed)
    out = list(tasks)
    whole = [i for i, t in enumerate(out) if t.num_gpu and not _is_share(t)]
    rng.shuffle(whole)
    shared = sum(_requested(t) for t in out if _is_share(t))
    total = sum(_requested(t) for t in out)
    for i in whole:
        if shared >= fraction * total - 1e-9:
            break
        copy = replace(rng.choice(donors), name=out[i].name)
        total += _requested(copy) - _requested(out[i])
        shared += _requested(copy)
        out[i] = copy
    return tuple(out)


def with_models(tasks: Sequence[TraceTask], fraction: float, seed: int,
                nodes: Sequence[TraceNode] | None = None) -> tuple[TraceTask, ...]:
    """``tasks`` with GPU tasks that name no model given one (a ``gpu_spec`` of the trace's
    own, drawn by how often tasks of the same GPU count name it) until tasks naming a model
    make ``fraction`` of the GPU requests. With ``nodes``, only a value some node can hold
    the task under is drawn; a task no value fits keeps naming none."""
    _check_fraction(fraction, "model-fraction", model_fraction(tasks))
    by_count: dict[int, Counter[frozenset[str]]] = {}
    for t in tasks:
        if t.gpu_spec and t.num_gpu:
            by_count.setdefault(t.num_gpu, Counter())[t.gpu_spec] += 1
    if not by_count:
        raise SpecError("pods", "no gpu_spec values", "a task list whose GPU tasks name models "
                        "in gpu_spec (like openb_pod_list_gpuspec10.csv), to draw from")
    every: Counter[frozenset[str]] = sum(by_count.values(), Counter())
    rng = random.Random(seed)
    out = list(tasks)
    free = [i for i, t in enumerate(out) if t.num_gpu and not t.gpu_spec]
    rng.shuffle(free)
    named = sum(_requested(t) for t in out if t.gpu_spec)
    target = fraction * sum(_requested(t) for t in out)
    for i in free:
        if named >= target:
            break
        task = out[i]
        pool = by_count.get(task.num_gpu, every)
        specs = [s for s in sorted(pool, key=sorted) if nodes is None or _holds(nodes, task, s)]
        if not specs:
            continue
        spec = rng.choices(specs, weights=[pool[s] for s in specs])[0]
        out[i] = replace(task, gpu_spec=spec)
        named += _requested(task)
    return tuple(out)


def _holds(nodes: Sequence[TraceNode], task: TraceTask, spec: frozenset[str]) -> bool:
    return any(n.model in spec and n.gpus >= task.num_gpu and n.cpu_milli >= task.cpu_milli
               and n.memory_mib >= task.memory_mib for n in nodes)


def write_tasks(path: str | Path, tasks: Sequence[TraceTask]) -> None:
    """``tasks`` as an openb task list; written whole to a temporary file beside ``path``
    and renamed over it, so a failed write leaves any earlier file as it was."""
    target = Path(path)
    fd, temp = tempfile.mkstemp(dir=target.resolve().parent, prefix=f".{target.name}.")
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would make the task list private
        with os.fdopen(fd, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle)
            writer.writerow(TASK_COLUMNS + TASK_OPTIONAL)  # the order of the row below
            for t in tasks:
                writer.writerow([t.name, t.cpu_milli, t.memory_mib, t.num_gpu, t.gpu_milli,
                                 t.gpu_spec_text, t.qos or "", t.pod_phase or "",
                                 *("" if v is None else v for v in
                                   (t.creation_time, t.deletion_time, t.scheduled_time))])
        os.replace(temp, target)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
