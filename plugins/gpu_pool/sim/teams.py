"""Teams for the replay: who owns each trace task, and each team's guarantee.

The openb trace names no teams. ``--teams 4`` gives every task to one of four teams by fixed
rules on the task's own columns, so the same trace always gives the same teams.

Rules (first match wins; hour of day = the arrival's hour in the replay's wall clock,
``SIM_EPOCH`` + arrival seconds, UTC)
----------------------------------------------------------------------------------------
1. ``qos`` Guaranteed -> ``inference``, priority critical, not preemptible.
2. ``qos`` LS, a duration under 4 h and at most one GPU -> ``inference``, priority high,
   not preemptible (short latency-sensitive work on one GPU or a share: serving). Short
   multi-GPU LS tasks (8-GPU, 64-core tasks among them) are not serving: a
   non-preemptible team can never borrow, so with them its 8-GPU tasks waited for weeks
   for the whole guarantee to be idle at once.
3. A duration of 4 h or more, arriving 08:00-19:59 -> ``train`` (purpose training, priority
   normal, preemptible: daytime training runs that checkpoint).
4. A duration of 4 h or more, arriving 20:00-07:59 -> ``pretrain`` (purpose pretraining,
   priority batch, preemptible: long jobs submitted for the night).
5. The rest (short BE, Burstable, multi-GPU LS and CPU-only tasks), arriving in a *burst hour* (a trace
   hour whose arrival count is at least the 90th percentile of the hourly counts of the
   whole task list) -> ``research`` (purpose training, priority low, preemptible).
6. Everything else -> ``train`` (priority normal, preemptible).

Rule 6 catches every task: the assignment covers the trace. Nothing is random: the rules
read only ``qos``, the GPUs, the duration, the arrival time and the hourly arrival counts.

Guarantees
----------
Each team's guarantee is proportional to its 95th-percentile concurrent GPU demand when
every task runs at its own trace timestamps (sampled every 10 minutes over the busy
window), scaled so that the four guarantees add up to the fleet's GPUs, rounded to whole
GPUs by largest remainder, at least 1 each (ties: team order). Each team may borrow up to
the rest of the fleet (``borrow_limit_gpus = fleet - guarantee``); whether it does is the
policy's call (``Policy.borrowing``, ``reclaim_guarantees``, ``lend_idle_off_peak``). One
quota per team, its purpose, any GPU model, valid for the whole replay.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

import numpy as np

from gpu_pool.errors import SpecError
from gpu_pool.model import PriorityClass, Purpose, Quota

LONG_S = 4 * 3600
DAY_HOURS = range(8, 20)
BURST_PERCENTILE = 90
DEMAND_PERCENTILE = 95
SAMPLE_S = 600


@dataclass(frozen=True)
class TeamSpec:
    name: str
    purpose: Purpose
    what: str  # one line for the report


TEAMS: tuple[TeamSpec, ...] = (
    TeamSpec("inference", Purpose.INFERENCE,
             "Guaranteed (critical) and short LS (high) tasks of at most one GPU; never "
             "preemptible"),
    TeamSpec("train", Purpose.TRAINING,
             "jobs of 4 h+ arriving 08-20, and short tasks outside bursts; normal, preemptible"),
    TeamSpec("pretrain", Purpose.PRETRAINING,
             "jobs of 4 h+ arriving 20-08; batch, preemptible"),
    TeamSpec("research", Purpose.TRAINING,
             "other short tasks arriving in burst hours; low, preemptible"),
)
TEAM_NAMES = tuple(t.name for t in TEAMS)


@dataclass(frozen=True)
class Owner:
    """What the rules decide for one task."""

    team: str
    purpose: Purpose
    priority: PriorityClass
    preemptible: bool


def parse_teams(text: str | int) -> int:
    """``4``: the four built-in teams (the only team scheme so far); ``0``: no teams."""
    if str(text).strip() not in ("0", "4"):
        raise SpecError("teams", text, "4 (the built-in inference/train/pretrain/research "
                        "teams) or 0 (no teams)")
    return int(str(text).strip())


def burst_hours(arrivals: Sequence[int]) -> frozenset[int]:
    """Trace hours (arrival // 3600) whose arrival count reaches the 90th percentile."""
    counts = Counter(int(a) // 3600 for a in arrivals)
    if not counts:
        return frozenset()
    threshold = float(np.percentile(list(counts.values()), BURST_PERCENTILE))
    return frozenset(h for h, n in counts.items() if n >= threshold)


def owner_of(qos: str | None, duration: int, arrival: int, gpus: float,
             bursts: frozenset[int]) -> Owner:
    """The rules of the module docstring for one task (``gpus``: GPUs it holds)."""
    spec = {t.name: t for t in TEAMS}
    hour = (int(arrival) // 3600) % 24
    if qos == "Guaranteed":
        return Owner("inference", spec["inference"].purpose, PriorityClass.CRITICAL, False)
    if qos == "LS" and duration < LONG_S and gpus <= 1:
        return Owner("inference", spec["inference"].purpose, PriorityClass.HIGH, False)
    if duration >= LONG_S:
        if hour in DAY_HOURS:
            return Owner("train", spec["train"].purpose, PriorityClass.NORMAL, True)
        return Owner("pretrain", spec["pretrain"].purpose, PriorityClass.BATCH, True)
    if int(arrival) // 3600 in bursts:
        return Owner("research", spec["research"].purpose, PriorityClass.LOW, True)
    return Owner("train", spec["train"].purpose, PriorityClass.NORMAL, True)


def concurrent_demand(arrivals: np.ndarray, durations: np.ndarray, gpus: np.ndarray,
                      begin: float, end: float) -> np.ndarray:
    """GPUs in use every ``SAMPLE_S`` seconds over [begin, end] if every task ran at its
    own timestamps (an event sweep: exact at each sample point)."""
    grid = np.arange(begin, max(begin + 1, end), SAMPLE_S, dtype=float)
    if not len(arrivals):
        return np.zeros(len(grid))
    times = np.concatenate([arrivals, arrivals + durations]).astype(float)
    deltas = np.concatenate([gpus, -gpus])
    order = np.argsort(times, kind="stable")
    times, level = times[order], np.cumsum(deltas[order])
    # Level just after all events at or before each sample point (ends at t are gone at t).
    idx = np.searchsorted(times, grid, side="right") - 1
    return np.where(idx >= 0, level[np.clip(idx, 0, None)], 0.0)


def guarantees(demand_p95: dict[str, float], fleet_gpus: int) -> dict[str, int]:
    """Whole-GPU guarantees proportional to ``demand_p95``, adding up to ``fleet_gpus``,
    at least 1 each (largest remainder; ties in team order)."""
    names = list(demand_p95)
    if fleet_gpus < len(names):
        raise SpecError("fleet GPUs", fleet_gpus, f"at least {len(names)} GPUs for "
                        f"{len(names)} teams")
    weights = np.array([max(demand_p95[n], 0.0) for n in names], dtype=float)
    if weights.sum() <= 0:
        weights = np.ones(len(names))
    spare = fleet_gpus - len(names)  # one each first
    raw = weights / weights.sum() * spare
    whole = np.floor(raw).astype(int)
    left = spare - int(whole.sum())
    order = sorted(range(len(names)), key=lambda i: (-(raw[i] - whole[i]), i))
    for i in order[:left]:
        whole[i] += 1
    return {n: int(whole[i]) + 1 for i, n in enumerate(names)}


def team_quotas(guarantee: dict[str, int], fleet_gpus: int, valid_from, expires_at
                ) -> tuple[Quota, ...]:
    purpose = {t.name: t.purpose for t in TEAMS}
    return tuple(Quota(name, purpose[name], float(g), valid_from, expires_at,
                       borrow_limit_gpus=float(max(0, fleet_gpus - g)), id=f"quota-{name}")
                 for name, g in guarantee.items())


def quota_window(first_s: float, last_s: float, epoch) -> tuple:
    """A validity window covering the whole replay, with a day's margin either side."""
    return (epoch + timedelta(seconds=first_s) - timedelta(days=1),
            epoch + timedelta(seconds=last_s) + timedelta(days=400))
