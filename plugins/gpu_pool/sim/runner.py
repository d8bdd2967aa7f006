"""Run a named policy over seeds and summarise: what the CLI and ``bench/openb_report.py`` share.

Policies: ``engine`` (the placement engine, :mod:`gpu_pool.sim.engine_policy`) and the
baselines ``random``, ``firstfit``, ``bestfit``, ``fgd`` (:mod:`gpu_pool.sim.baselines`).
Times are wall-clock seconds per placement decision: one arrival, or one batch of ``--batch``
arrivals for the engine.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpu_pool.errors import SpecError
from gpu_pool.sim.baselines import BASELINES, make_baseline
from gpu_pool.sim.engine_policy import engine_factory
from gpu_pool.sim.packing import PackingRun, engine_mix, run_packing, typical_mix
from gpu_pool.sim.trace import Trace

POLICIES: tuple[str, ...] = ("engine", *BASELINES)
PLACEMENT_COLUMNS = ("seed", "arrival_index", "pod_name", "num_gpu", "gpu_milli", "cpu_milli",
                     "memory_mib", "gpu_spec", "node", "gpu_indices")


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-51``, ``42,45`` or ``42``."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if high < low:
                    raise ValueError(part)
                seeds.extend(range(low, high + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise SpecError("seeds", text, "integers like '42-51' or '42,43,44'") from None
    if not seeds:
        raise SpecError("seeds", text, "at least one seed, like '42-51'")
    return tuple(seeds)


def parse_policy(text: str) -> str:
    if text not in POLICIES:
        raise SpecError("policy", text, "one of " + ", ".join(POLICIES))
    return text


def run_policy(trace: Trace, policy: str, seeds: Sequence[int], *, batch: int = 1,
               exact: bool = False) -> list[PackingRun]:
    """One :class:`PackingRun` per seed; ``batch`` only changes the engine."""
    parse_policy(policy)
    if batch < 1:
        raise SpecError("batch", batch, "an integer >= 1")
    mix = typical_mix(trace.tasks)
    if policy == "engine":
        factory = engine_factory(engine_mix(trace.tasks))
        return [run_packing(trace, factory, s, batch=batch) for s in seeds]
    return [run_packing(trace, lambda f, rng: make_baseline(policy, f, rng, mix, exact), s)
            for s in seeds]


def packing_summary(trace: Trace, runs: Sequence[PackingRun], curve: bool = False) -> dict[str, Any]:
    times = np.concatenate([np.asarray(r.decision_seconds) for r in runs]) if runs else np.zeros(0)
    per_task = np.concatenate([
        np.asarray(r.decision_seconds) / max(1, r.batch) for r in runs]) if runs else np.zeros(0)
    out: dict[str, Any] = {
        "nodes": trace.nodes_path,
        "pods": trace.tasks_path,
        "policy": runs[0].policy if runs else None,
        "batch": runs[0].batch if runs else 1,
        "median_unallocated_pct": float(np.median([r.unallocated_pct for r in runs])),
        "decision_ms": {"median": float(np.median(times) * 1e3), "max": float(times.max() * 1e3),
                        "median_per_task": float(np.median(per_task) * 1e3)},
        "seeds": [],
    }
    for r in runs:
        item: dict[str, Any] = {"seed": r.seed, "unallocated_pct": r.unallocated_pct,
                                "arrived": len(r.arrivals), "placed": r.placed}
        if curve:
            item["curve"] = [{"arrived_pct": round(100 * lv, 3), "allocated_pct": 100 * a}
                             for lv, a in zip(r.levels, r.allocation, strict=True)]
        out["seeds"].append(item)
    return out


def write_placements(path: str | Path, runs: Sequence[PackingRun]) -> None:
    with Path(path).open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(PLACEMENT_COLUMNS)
        for r in runs:
            for a in r.arrivals:
                t = a.task
                writer.writerow([r.seed, a.index, t.name, t.num_gpu, t.gpu_milli, t.cpu_milli,
                                 t.memory_mib, t.gpu_spec_text, a.node or "",
                                 ";".join(str(i) for i in a.gpu_indices)])
