"""The objective every planner of the engine maximises, and the per-request views it uses.

Terms
-----
aged weight ``w(r)``
    ``policy.weight(class) * 2 ** (waited / aging_half_life)``, rounded down, capped one
    below the weight of the next more urgent class (the most urgent class is capped at 8x)
    so that aging reorders requests within a class but never across classes.
effective milli ``e(r)``
    GPU milli of one part (``gpus * gpu_milli``); a CPU-only part counts as 1 so that it is
    still worth placing.
penalty ``p(r, n)`` of putting one part of ``r`` on node ``n`` (0..300)
    ``2 * waste`` + ``zone`` where ``waste`` = round(100 * (m_n - m_min(r)) / m_n) is the
    card memory the part leaves unused against the smallest card of the fleet it accepts
    (right-sizing), and ``zone`` = 60 + round(40 * t / t_max) when the dataset must move
    (t = transfer seconds), else 0. A move with ``t > t_max`` is not allowed at all;
    :mod:`gpu_pool.engine.zones` further allows one only when it pays, per cycle.
transfer ``t`` to a node in zone ``z``
    dataset size (GiB x 1024 MB) over ``policy.zone_links[(home, z)]`` MB/s when that link
    is listed, else over the node's ``bandwidth_mb_s``; 0 in the home zone.
value of a placement
    ``sum over its parts of e(r) * (1000 * w(r) - p(r, n))``. Since ``w >= 1`` and
    ``p <= 300``, placing more weighted GPU-milli always dominates the secondary terms of
    the same request: the scaled-weight form of the lexicographic order
    (weighted GPUs placed > right-size > fewer/shorter data moves).

Fragmentation is the last tie-break. It acts inside node choice (which of the nodes with
equal value) and is not part of the value, so the brute-force oracle and CP-SAT compare the
same numbers.

Invariants: every function is pure; a :class:`RequestView` depends only on the static
layout, never on free capacity, so it is shared by identical requests and across cycles.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from gpu_pool.engine.capacity import FleetLayout
from gpu_pool.engine.compat import model_accepts
from gpu_pool.model import Policy, PriorityClass, Request

VALUE_SCALE = 1000  # per effective milli per unit of aged weight
WASTE_COEF = 2
ZONE_BASE = 60
ZONE_SPAN = 40
MAX_PENALTY = WASTE_COEF * 100 + ZONE_BASE + ZONE_SPAN
TOP_CLASS_AGING_CAP = 8


def aged_weight(request: Request, policy: Policy, now: datetime) -> int:
    """``w(r)`` of the module docstring."""
    base, cap = _aging_bounds(policy.priority_weights)[request.priority]
    return _aged(base, cap, policy.aging_half_life.total_seconds(), request, now)


def _aging_bounds(weights: Mapping[PriorityClass, int]) -> dict[PriorityClass, tuple[int, int]]:
    """Per class its base weight and the most aging may raise it to: one below the next
    class up (the top class: ``TOP_CLASS_AGING_CAP`` times its base)."""
    out = {}
    for cls, base in weights.items():
        higher = min((w for w in weights.values() if w > base), default=None)
        out[cls] = (base, max(higher - 1 if higher is not None else base * TOP_CLASS_AGING_CAP,
                              base))
    return out


def _aged(base: int, cap: int, half_life: float, request: Request, now: datetime) -> int:
    if request.submitted_at is None:
        return base
    waited = max((now - request.submitted_at).total_seconds(), 0.0)
    if half_life <= 0:
        return cap
    factor = 2.0 ** min(waited / half_life, 64.0)
    return int(min(math.floor(base * factor), cap))


def aged_weights(requests: Sequence[Request], policy: Policy, now: datetime) -> dict[str, int]:
    """``w(r)`` per request name; requests of one class submitted at the same instant
    (a pipeline's batch) share one computation."""
    bounds = _aging_bounds(policy.priority_weights)
    half_life = policy.aging_half_life.total_seconds()
    seen: dict[tuple, int] = {}
    out: dict[str, int] = {}
    for r in requests:
        key = (r.priority, r.submitted_at)
        w = seen.get(key)
        if w is None:
            base, cap = bounds[r.priority]
            w = seen[key] = _aged(base, cap, half_life, r, now)
        out[r.name] = w
    return out


def effective_milli(request: Request) -> int:
    """``e(r)``: GPU milli of one part, 1 for a CPU-only part."""
    return max(request.gpus * request.gpu_milli, 1)


def view_key(request: Request) -> tuple:
    """Requests with equal keys have equal static views (shape, models, data)."""
    ds = request.dataset
    return (request.gpus, request.gpu_milli, request.nodes, request.gpu_models,
            request.min_gpu_memory_mib, request.cpu_milli, request.memory_mib,
            None if ds is None else (ds.zone, ds.size_gib))


@dataclass(frozen=True)
class RequestView:
    """Static facts of a request over the rows of a :class:`FleetLayout`.

    ``compatible``: model, memory and GPU count allow a part on the row (ignoring zone).
    ``zone_ok``: the data move to the row is within ``max_transfer_seconds``.
    ``penalty``: ``p(r, n)`` per row (only meaningful where both masks hold).
    """

    compatible: np.ndarray
    zone_ok: np.ndarray
    penalty: np.ndarray
    transfer: np.ndarray
    cross_zone: np.ndarray
    signature: int  # equal for views with equal masks and penalties (request classes)
    # Rows allowed (compatible, move allowed) split by penalty, lowest first, each sorted:
    # the best row is always in the first level that has a fitting row.
    levels: tuple[np.ndarray, ...]
    # Some compatible row is outside the data's zone (gpu_pool.engine.zones decides).
    moves: bool = False


def build_view(request: Request, layout: FleetLayout, policy: Policy,
               policy_key: tuple | None = None) -> RequestView:
    """The :class:`RequestView` of ``request``, cached on the layout by :func:`view_key`;
    ``policy_key``: :func:`view_policy_key` of ``policy``, when the caller has it."""
    key = (view_key(request), policy_key or view_policy_key(policy))
    view = layout.views.get(key)
    if view is None:
        view = _build_view(request, layout, policy)
        layout.views[key] = view
    return view


def view_policy_key(policy: Policy) -> tuple:
    """What of ``policy`` a view depends on (data moves), hashable."""
    links = policy.zone_links
    return (policy.max_transfer_seconds, tuple(sorted(links.items())) if links else ())


def _build_view(request: Request, layout: FleetLayout, policy: Policy) -> RequestView:
    kinds = layout.views.get("kinds")
    if kinds is None:  # distinct (model, GPU memory) pairs and zones, once per layout
        pairs = sorted({(m, int(mem)) for m, mem in zip(layout.models, layout.gpu_memory,
                                                         strict=True)}, key=str)
        pair_of = {p: i for i, p in enumerate(pairs)}
        zones = sorted(layout.zone_rows)
        zone_of = {z: i for i, z in enumerate(zones)}
        kinds = (pairs, np.array([pair_of[(m, int(mem))] for m, mem in zip(
            layout.models, layout.gpu_memory, strict=True)], dtype=np.int64),
            zone_of, np.array([zone_of[z] for z in layout.zones], dtype=np.int64))
        layout.views["kinds"] = kinds
    pairs, pair_idx, zone_of, zone_idx = kinds
    accepts = np.array([model_accepts(request, m, mem) for m, mem in pairs], dtype=bool)
    compatible = accepts[pair_idx]
    compatible &= layout.gpu_count >= request.gpus
    compatible &= layout.cpu_total >= request.cpu_milli
    compatible &= layout.mem_total >= request.memory_mib
    ds = request.dataset
    if ds is not None and ds.zone is not None:
        cross = zone_idx != zone_of.get(ds.zone, -1)
        if ds.size_gib > 0:
            bandwidth = layout.bandwidth
            links = {z: mb_s for (src, z), mb_s in policy.zone_links.items()
                     if src == ds.zone and z in zone_of}
            if links:  # a listed link between the zones wins over the node's own bandwidth
                per_zone = np.full(len(zone_of), np.nan)
                for z, mb_s in links.items():
                    per_zone[zone_of[z]] = mb_s
                linked = per_zone[zone_idx]
                bandwidth = np.where(np.isnan(linked), bandwidth, linked)
            t = np.where(bandwidth > 0, ds.size_gib * 1024.0 / np.maximum(bandwidth, 1e-12),
                         np.inf)
            transfer = np.where(cross, t, 0.0)
        else:
            transfer = np.zeros(len(layout.names))
    else:
        cross = np.zeros(len(layout.names), dtype=bool)
        transfer = np.zeros(len(layout.names))
    zone_ok = transfer <= policy.max_transfer_seconds
    penalty = np.zeros(len(layout.names), dtype=np.int64)
    if request.gpus > 0 and compatible.any():
        mem_min = int(layout.gpu_memory[compatible].min())
        mem = np.maximum(layout.gpu_memory, 1)
        waste = np.rint(100.0 * (mem - mem_min) / mem).clip(0, 100).astype(np.int64)
        penalty += WASTE_COEF * waste
    t_max = max(policy.max_transfer_seconds, 1e-9)
    zone_pen = ZONE_BASE + np.rint(ZONE_SPAN * np.minimum(transfer / t_max, 1.0))
    penalty += np.where(cross, zone_pen, 0).astype(np.int64)
    signature = hash((compatible.tobytes(), zone_ok.tobytes(), penalty.tobytes()))
    levels = view_levels(compatible, zone_ok, penalty)
    return RequestView(compatible, zone_ok, penalty, transfer, cross, signature, levels,
                       bool((compatible & cross).any()))


def view_levels(compatible: np.ndarray, zone_ok: np.ndarray, penalty: np.ndarray
                ) -> tuple[np.ndarray, ...]:
    """``RequestView.levels``: allowed rows split by penalty, lowest first."""
    rows = np.flatnonzero(compatible & zone_ok)
    return tuple(rows[penalty[rows] == p] for p in np.unique(penalty[rows]))


def part_value(weight: int, request: Request, penalty: int) -> int:
    """Value of one part of ``request`` on a node with ``penalty``."""
    return effective_milli(request) * (VALUE_SCALE * weight - int(penalty))


def derive_mix(requests: Sequence[Request],
               given: tuple[tuple[tuple[int, int], float], ...] = ()
               ) -> tuple[tuple[tuple[int, int], float], ...]:
    """The task-size mix: ``given`` if any, else the (gpus, gpu_milli) shares of ``requests``."""
    if given:
        return given
    counts = Counter((r.gpus, r.gpu_milli) for r in requests if r.gpus > 0)
    total = sum(counts.values())
    if not total:
        return ()
    return tuple(sorted(((k, v / total) for k, v in counts.items())))
