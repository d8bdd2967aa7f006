"""Run a named policy over seeds and summarise: what the CLI and ``bench/openb_report.py`` share.

Policies: ``engine`` (the placement engine, :mod:`gpu_pool.sim.engine_policy`) and the
baselines ``random``, ``firstfit``, ``bestfit``, ``fgd`` (:mod:`gpu_pool.sim.baselines`).
Times are wall-clock seconds per placement decision: one arrival, or one batch of ``--batch``
arrivals for the engine.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpu_pool.errors import SpecError
from gpu_pool.model import Policy
from gpu_pool.sim.baselines import BASELINES, make_baseline
from gpu_pool.sim.engine_policy import engine_factory
from gpu_pool.sim.packing import PackingRun, engine_mix, run_packing, typical_mix
from gpu_pool.sim.trace import Trace

POLICIES: tuple[str, ...] = ("engine", *BASELINES)
PLACEMENT_COLUMNS = ("seed", "arrival_index", "pod_name", "num_gpu", "gpu_milli", "cpu_milli",
                     "memory_mib", "gpu_spec", "node", "gpu_indices")


MAX_SEEDS = 1000
_SEED = re.compile(r"^\s*(\d{1,10})\s*(?:-\s*(\d{1,10})\s*)?$")


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-51``, ``42,45`` or ``42``: at most 1,000 seeds, each from 0 to 2**32 - 1."""
    expected = (f"seeds from 0 to {2**32 - 1} like '42-51' or '42,43,44', at most "
                f"{MAX_SEEDS:,} of them")
    seeds: list[int] = []
    for part in str(text).split(","):
        if not part.strip():
            continue
        match = _SEED.match(part)
        if match is None:
            raise SpecError("seeds", text, expected)
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) else low
        # Counted before a range is made: '1-4000000000' must not build a list first.
        if high < low or high >= 2**32 or len(seeds) + high - low + 1 > MAX_SEEDS:
            raise SpecError("seeds", text, expected)
        seeds.extend(range(low, high + 1))
    if not seeds:
        raise SpecError("seeds", text, "at least one seed, like '42-51'")
    return tuple(seeds)


def parse_policy(text: str) -> str:
    if text not in POLICIES:
        raise SpecError("policy", text, "one of " + ", ".join(POLICIES))
    return text


def run_policy(trace: Trace, policy: str, seeds: Sequence[int], *, batch: int = 1,
               exact: bool = False, engine_policy: Policy | None = None) -> list[PackingRun]:
    """One :class:`PackingRun` per seed; ``batch`` and ``engine_policy`` (a sharing policy,
    default ``Policy()``) only change the engine."""
    parse_policy(policy)
    if batch < 1:
        raise SpecError("batch", batch, "an integer >= 1")
    mix = typical_mix(trace.tasks)
    if policy == "engine":
        factory = engine_factory(engine_mix(trace.tasks), policy=engine_policy)
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
