"""The reclaim sweep: free GPUs held by dead tasks, flag idle holds, report foreign processes.

Terms
-----
liveness
    The Airflow state of each allocation's task (request name → state string, ``None``
    when unknown). Only a *dead* state releases: ``success``, ``failed``,
    ``upstream_failed``, ``skipped``, ``removed`` (the task instance or its DAG run is
    gone) and ``up_for_retry`` (that try is over; the next try asks again). Every other
    state — running, queued, deferred, scheduled, restarting, unknown — keeps the GPUs:
    a sweep never releases a live task.
grace
    An allocation younger than ``reclaim_grace_minutes`` is left alone whatever its task's
    state says: the executor may have bound GPUs a moment before the task starts.
idle
    Every GPU of an allocation read below ``idle_util_pct`` in every sample of the last
    ``idle_minutes``, with samples spanning at least 80% of that window (a probe gap is not
    evidence of idleness).
foreign process
    A process on a GPU that no active allocation holds: someone bypassed the scheduler.

:func:`plan_sweep` is pure. :func:`apply_sweep` performs the plan through the store and
writes one reclaim record per action.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpu_pool.model import Allocation, Outcome
from gpu_pool.notify.channels import DeliveryError, Notice, TeamChannels
from gpu_pool.ops.config import OpsConfig
from gpu_pool.ops.records import NoticeKey, OpsRecords, ReclaimRecord, iso

DEAD_STATES = frozenset({"success", "failed", "upstream_failed", "skipped", "removed",
                         "up_for_retry"})
IDLE_COVERAGE = 0.8


@dataclass(frozen=True)
class GpuSample:
    node: str
    gpu_index: int
    at: datetime
    utilization_pct: float
    memory_used_mib: float | None = None


@dataclass(frozen=True)
class GpuProcess:
    node: str
    gpu_index: int
    pid: int
    name: str = ""
    used_memory_mib: float = 0.0


@dataclass(frozen=True)
class DeadHold:
    request_name: str
    allocations: tuple[Allocation, ...]
    state: str


@dataclass(frozen=True)
class IdleHold:
    request_name: str
    allocations: tuple[Allocation, ...]
    idle_since: datetime
    max_utilization_pct: float


@dataclass(frozen=True)
class SweepPlan:
    dead: tuple[DeadHold, ...]
    idle: tuple[IdleHold, ...]
    foreign: tuple[GpuProcess, ...]
    kept: tuple[str, ...]  # request names judged alive (or too young to judge)


def _gpus(allocs: Sequence[Allocation]) -> float:
    return sum(a.gpu_milli_total for a in allocs) / 1000


def find_foreign(processes: Sequence[GpuProcess],
                 allocations: Sequence[Allocation]) -> tuple[GpuProcess, ...]:
    held = {(a.node, i) for a in allocations for i in a.gpu_indices}
    return tuple(p for p in processes if (p.node, p.gpu_index) not in held)


def _idle_window(allocs: Sequence[Allocation], samples: Sequence[GpuSample],
                 config: OpsConfig, now: datetime) -> tuple[datetime, float] | None:
    """(window start, peak utilisation) when every GPU of the hold was idle all window."""
    window = timedelta(minutes=config.idle_minutes)
    start = now - window
    if config.idle_minutes <= 0 or any(a.started_at > start for a in allocs):
        return None
    peak = 0.0
    for a in allocs:
        for index in a.gpu_indices:
            seen = [s for s in samples
                    if s.node == a.node and s.gpu_index == index and start <= s.at <= now]
            if len(seen) < 2:
                return None
            span = max(s.at for s in seen) - min(s.at for s in seen)
            if span < window * IDLE_COVERAGE:
                return None
            top = max(s.utilization_pct for s in seen)
            if top >= config.idle_util_pct:
                return None
            peak = max(peak, top)
    return start, peak


def plan_sweep(allocations: Sequence[Allocation], states: Mapping[str, str | None],
               samples: Sequence[GpuSample], processes: Sequence[GpuProcess],
               config: OpsConfig, now: datetime) -> SweepPlan:
    by_request: dict[str, list[Allocation]] = {}
    for a in allocations:
        by_request.setdefault(a.request_name, []).append(a)
    grace = timedelta(minutes=config.reclaim_grace_minutes)
    dead, idle, kept = [], [], []
    for name, allocs in sorted(by_request.items()):
        group = tuple(sorted(allocs, key=lambda a: (a.node, a.gpu_indices)))
        state = states.get(name)
        young = any(a.started_at > now - grace for a in group)
        if state in DEAD_STATES and not young:
            dead.append(DeadHold(name, group, state))
            continue
        kept.append(name)
        found = _idle_window(group, samples, config, now)
        if found is not None:
            idle.append(IdleHold(name, group, found[0], found[1]))
    return SweepPlan(tuple(dead), tuple(idle), find_foreign(processes, allocations), tuple(kept))


@dataclass(frozen=True)
class SweepResult:
    plan: SweepPlan
    records: tuple[ReclaimRecord, ...]
    notices_failed: tuple[str, ...] = ()


def _record(action: str, name: str, group: Sequence[Allocation], reason: str, actor: str,
            now: datetime, idle_hours: float = 0.0) -> ReclaimRecord:
    since = min(a.started_at for a in group)
    return ReclaimRecord(
        at=now, action=action, node="+".join(sorted({a.node for a in group})), reason=reason,
        actor=actor, request_name=name, team=group[0].team,
        gpu_indices=tuple(i for a in group for i in a.gpu_indices), gpus=_gpus(group),
        held_since=since, held_seconds=(now - since).total_seconds(), idle_gpu_hours=idle_hours)


def apply_sweep(plan: SweepPlan, store: Any, records: OpsRecords, channels: TeamChannels | None,
                teams: Mapping[str, Any], config: OpsConfig, actor: str,
                now: datetime) -> SweepResult:
    """Release dead holds, warn about (or end) idle ones, record foreign processes.

    Each idle hold and each foreign process is acted on once (a notice key), so a sweep
    every few minutes does not repeat itself."""
    done: list[ReclaimRecord] = []
    failed: list[str] = []
    for hold in plan.dead:
        reason = f"task is {hold.state} in Airflow; its GPUs were still held"
        store.release_request(hold.request_name, Outcome.RECLAIMED, actor=actor,
                              reason=f"reclaim sweep: {reason}", now=now)
        done.append(records.add_reclaim(
            _record("released", hold.request_name, hold.allocations, reason, actor, now)))
    for hold in plan.idle:
        idle_hours = _gpus(hold.allocations) * (now - hold.idle_since).total_seconds() / 3600
        key = NoticeKey("idle_gpus", hold.request_name, 0,
                        iso(min(a.started_at for a in hold.allocations)) or "")
        reason = (f"GPUs below {config.idle_util_pct:g}% utilisation (peak "
                  f"{hold.max_utilization_pct:g}%) for {config.idle_minutes} minutes")
        ending = config.idle_action == "end"
        notice = Notice(
            team=hold.allocations[0].team, kind="idle_gpus",
            subject=f"[gpu-pool] {hold.request_name}: "
                    f"{'GPUs reclaimed' if ending else 'GPUs idle'}",
            body=(f"Task {hold.request_name} holds {_gpus(hold.allocations):g} GPUs on "
                  f"{', '.join(sorted({a.node for a in hold.allocations}))} that have been "
                  f"idle: {reason}. "
                  + ("gpu-pool ended the task and freed the GPUs." if ending else
                     "Release them if the task is done, or they may be reclaimed.")),
            facts=(("task", hold.request_name), ("idle_since", iso(hold.idle_since) or ""),
                   ("action", "ended" if ending else "warned")))
        if not ending and not records.claim(key, notice.team, notice.subject, now):
            continue
        if ending:
            store.release_request(hold.request_name, Outcome.RECLAIMED, actor=actor,
                                  reason=f"reclaim sweep: {reason}", now=now)
            records.claim(key, notice.team, notice.subject, now)
        done.append(records.add_reclaim(_record(
            "idle_ended" if ending else "idle_warned", hold.request_name, hold.allocations,
            reason, actor, now, idle_hours)))
        team = teams.get(notice.team)
        if channels is not None and team is not None:
            try:
                sent = channels.deliver(notice, team.notify_email, team.notify_webhook)
                records.mark_sent(key, sent.channels, now)
            except DeliveryError as error:
                failed.append(str(error))
    for proc in plan.foreign:
        key = NoticeKey("foreign_process", f"{proc.node}/{proc.gpu_index}/{proc.pid}", 0, "")
        if not records.claim(key, "", f"foreign process {proc.pid} on {proc.node}", now,
                             status="sent"):
            continue
        done.append(records.add_reclaim(ReclaimRecord(
            at=now, action="foreign_process", node=proc.node, actor=actor,
            gpu_indices=(proc.gpu_index,),
            reason=(f"process {proc.pid} ({proc.name or '?'}, {proc.used_memory_mib:g} MiB) "
                    f"on GPU {proc.gpu_index}, which no gpu-pool allocation holds"))))
    return SweepResult(plan, tuple(done), tuple(failed))
