"""Quota alerts: expiry warnings, runs that would outlive their quota, GPU-hour budgets,
and the notice before the peak to owners of off-peak work still running.

Terms
-----
coverage end
    How long a team keeps quota for a (purpose, GPU model): the expiry of the quota active
    now, pushed further by every matching quota that starts no later than the current end (a
    renewal). Extending a quota's ``expires_at`` or adding its successor moves it: that is
    how renewing stops the warnings.
threshold crossed
    For ``alert_days`` (15, 7, 1): days left ≤ d. A run that first sees 5 days left sends
    the 7-day notice and records the 15-day one as covered, so 15 never follows 7.
budget used
    GPU-hours of the quota's team, purpose and model inside the quota's validity window:
    finished ledger entries (the part inside the window) plus active allocations so far.
off-peak notice
    While off-peak, once the next peak (:meth:`OffPeak.peak_starts`) is at most
    ``Policy.off_peak_notice`` away: one notice per team with off-peak allocations
    (``Allocation.off_peak``) still running, listing its tasks, the peak (fleet time) and
    what happens then: preemptible ones are preempted with their grace, the others must
    end by their time limit before it. Keyed by (team, peak): once per team and peak.
    The alert run must come at least once inside the notice window (the maintenance DAG
    runs every 15 minutes; the default notice is 30 minutes).

:func:`plan_alerts` is pure (no I/O, no clock). :func:`run_alerts` claims each notice in the
store before sending it (see :mod:`gpu_pool.ops.records`), so reruns never repeat one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpu_pool.model import Allocation, LedgerEntry, Policy, Quota, Request, Team
from gpu_pool.notify.channels import DeliveryError, Notice, TeamChannels
from gpu_pool.ops.config import OpsConfig
from gpu_pool.ops.records import NoticeKey, OpsRecords, iso

DAY = timedelta(days=1)


@dataclass(frozen=True)
class Alert:
    key: NoticeKey
    notice: Notice
    covers: tuple[NoticeKey, ...] = ()  # looser thresholds crossed at once: recorded, not sent


def quota_ref(q: Quota) -> str:
    return q.id or f"{q.team}/{q.purpose}/{q.gpu_model or 'any'}/{iso(q.valid_from)}"


def _scope(q: Quota) -> str:
    return f"{q.team}/{q.purpose}/{q.gpu_model or 'any GPU model'}"


def coverage_end(quotas: Iterable[Quota], start: Quota | None, now: datetime,
                 matches: Callable[[Quota], bool]) -> datetime | None:
    """End of unbroken quota coverage from ``now`` among the quotas ``matches`` accepts."""
    pool = [q for q in quotas if matches(q)]
    active = [q for q in pool if q.active_at(now)]
    if start is not None:
        active = [start]
    if not active:
        return None
    end = max(q.expires_at for q in active)
    grew = True
    while grew:
        grew = False
        for q in pool:
            if q.valid_from <= end < q.expires_at:
                end, grew = q.expires_at, True
    return end


def _same_scope(q: Quota) -> Callable[[Quota], bool]:
    return lambda o: (o.team, o.purpose, o.gpu_model) == (q.team, q.purpose, q.gpu_model)


def _overlap_hours(a: datetime, b: datetime, lo: datetime, hi: datetime) -> float:
    return max(0.0, (min(b, hi) - max(a, lo)).total_seconds() / 3600.0)


def budget_used(q: Quota, ledger: Iterable[LedgerEntry], allocations: Iterable[Allocation],
                now: datetime) -> float:
    hi = min(now, q.expires_at)
    used = sum(e.gpus * _overlap_hours(e.started_at, e.ended_at, q.valid_from, hi)
               for e in ledger if q.matches(e.team, e.purpose, e.gpu_model))
    used += sum(a.gpu_milli_total / 1000 * _overlap_hours(a.started_at, now, q.valid_from, hi)
                for a in allocations if q.matches(a.team, a.purpose, a.gpu_model))
    return used


def _expected_end(a: Allocation) -> datetime | None:
    return a.ends_by


def plan_alerts(quotas: Sequence[Quota], ledger: Sequence[LedgerEntry],
                allocations: Sequence[Allocation], pending: Sequence[Request],
                config: OpsConfig, now: datetime, policy: Policy | None = None) -> list[Alert]:
    """Every notice due at ``now``; ``policy`` (default :class:`Policy`) gives the off-peak
    windows and notice."""
    alerts: list[Alert] = []
    for q in quotas:
        alerts.extend(_expiry_alerts(q, quotas, allocations, config, now))
        alerts.extend(_budget_alerts(q, ledger, allocations, config, now))
    alerts.extend(_run_past_expiry(quotas, allocations, pending, now))
    alerts.extend(off_peak_alerts(allocations, policy or Policy(), now))
    return alerts


def off_peak_alerts(allocations: Sequence[Allocation], policy: Policy,
                    now: datetime) -> list[Alert]:
    """The off-peak notice (module docstring): one alert per team, or none."""
    from zoneinfo import ZoneInfo

    if not policy.off_peak.contains(now):
        return []
    peak = policy.off_peak.peak_starts(now)
    if peak is None or peak - now > policy.off_peak_notice:
        return []
    zone = policy.off_peak.timezone
    local = peak.astimezone(ZoneInfo(zone))
    at = f"{local:%H:%M} {zone}"
    by_team: dict[str, dict[str, Allocation]] = {}
    for a in allocations:
        if a.off_peak:
            by_team.setdefault(a.team, {}).setdefault(a.request_name, a)  # a gang: once
    alerts = []
    minutes = max(math.ceil((peak - now).total_seconds() / 60), 0)
    for team in sorted(by_team):
        tasks = by_team[team]
        lines = []
        for name in sorted(tasks):
            a = tasks[name]
            if a.preemptible:
                grace = a.grace if a.grace is not None else policy.preemption_grace
                fate = f"preempted at {local:%H:%M} with {grace.total_seconds():g} s grace"
            else:
                end = f" (its time limit ends {a.ends_by:%H:%M} UTC)" if a.ends_by else ""
                fate = f"not preemptible: must end before the peak{end}"
            lines.append(f"  - {name} on {a.node}: {fate}")
        body = (f"The off-peak window ends at {at} (in {minutes} min, "
                f"{peak:%Y-%m-%d %H:%M} UTC). These tasks of team {team} run beyond its "
                "quota off-peak; at the peak the preemptible ones get SIGTERM, then SIGKILL "
                "after their grace. Checkpoint now or let them be requeued.\n"
                + "\n".join(lines))
        notice = Notice(team=team, kind="off_peak_ending",
                        subject=f"[gpu-pool] {team}: {len(tasks)} off-peak "
                                f"{'tasks end' if len(tasks) != 1 else 'task ends'} at the "
                                f"peak, {at}",
                        body=body, facts=(("peak", iso(peak) or ""), ("tasks", str(len(tasks))),
                                          ("task_names", ",".join(sorted(tasks)))))
        alerts.append(Alert(NoticeKey("off_peak_ending", team, 0, iso(peak) or ""), notice))
    return alerts


def _expiry_alerts(q: Quota, quotas: Sequence[Quota], allocations: Sequence[Allocation],
                   config: OpsConfig, now: datetime) -> list[Alert]:
    end = coverage_end(quotas, q, now, _same_scope(q))
    if end is None or end > q.expires_at:
        return []  # renewed or extended: no warning
    ref = iso(q.expires_at) or ""
    subject = quota_ref(q)
    if q.active_at(now):
        left = (q.expires_at - now) / DAY
        crossed = sorted(d for d in config.alert_days if left <= d)
        if not crossed:
            return []
        running = [a.request_name for a in allocations
                   if q.matches(a.team, a.purpose, a.gpu_model)]
        when = f"within {math.ceil(left)} days" if left > 1 else "within a day"
        body = (f"Quota {_scope(q)} ({q.gpus:g} GPUs) expires {when}, at "
                f"{q.expires_at:%Y-%m-%d %H:%M} UTC. After that gpu-pool refuses new work for "
                f"{q.team}/{q.purpose} on it unless the quota is renewed or extended.")
        if running:
            body += f" Running now under it: {', '.join(sorted(running))}."
        notice = Notice(team=q.team, kind="quota_expiring",
                        subject=f"[gpu-pool] {q.team}: quota {q.purpose} expires {when}",
                        body=body, facts=(("quota", subject), ("expires_at", ref),
                                          ("threshold_days", str(crossed[0])),
                                          ("running", str(len(running)))))
        keys = [NoticeKey("quota_expiring", subject, d, ref) for d in crossed]
        return [Alert(keys[0], notice, tuple(keys[1:]))]
    if q.expires_at <= now < q.expires_at + config.expired_notice_days * DAY:
        live = [o for o in quotas if o.active_at(now) and _same_scope(q)(o)]
        if live:
            return []
        body = (f"Quota {_scope(q)} expired at {q.expires_at:%Y-%m-%d %H:%M} UTC. New work for "
                f"{q.team}/{q.purpose} on it is refused from now on; renew the quota to admit "
                "it again.")
        notice = Notice(team=q.team, kind="quota_expired",
                        subject=f"[gpu-pool] {q.team}: quota {q.purpose} expired, new work "
                                "refused",
                        body=body, facts=(("quota", subject), ("expired_at", ref)))
        return [Alert(NoticeKey("quota_expired", subject, 0, ref), notice)]
    return []


def _budget_alerts(q: Quota, ledger: Sequence[LedgerEntry], allocations: Sequence[Allocation],
                   config: OpsConfig, now: datetime) -> list[Alert]:
    if not q.gpu_hour_budget or not q.active_at(now):
        return []
    used = budget_used(q, ledger, allocations, now)
    pct = 100.0 * used / q.gpu_hour_budget
    crossed = sorted((p for p in config.budget_alert_pcts if pct >= p), reverse=True)
    if not crossed:
        return []
    subject, ref = quota_ref(q), iso(q.valid_from) or ""
    tail = (" The budget is spent: further GPU-hours go over budget." if crossed[0] >= 100
            else "")
    notice = Notice(
        team=q.team, kind="budget",
        subject=f"[gpu-pool] {q.team}: {crossed[0]}% of the {q.purpose} GPU-hour budget used",
        body=(f"Quota {_scope(q)} has used {used:.1f} of {q.gpu_hour_budget:g} GPU-hours "
              f"({pct:.0f}%) since {q.valid_from:%Y-%m-%d}.{tail}"),
        facts=(("quota", subject), ("used_gpu_hours", f"{used:.2f}"),
               ("budget_gpu_hours", f"{q.gpu_hour_budget:g}"), ("threshold_pct", str(crossed[0]))))
    keys = [NoticeKey("budget", subject, p, ref) for p in crossed]
    return [Alert(keys[0], notice, tuple(keys[1:]))]


def _run_past_expiry(quotas: Sequence[Quota], allocations: Sequence[Allocation],
                     pending: Sequence[Request], now: datetime) -> list[Alert]:
    alerts: list[Alert] = []
    for a in allocations:
        end = _expected_end(a)
        cover = coverage_end(quotas, None, now, lambda q, a=a: q.matches(a.team, a.purpose,
                                                                           a.gpu_model))
        if end is not None and cover is not None and end > cover:
            alerts.append(_past_expiry_alert(a.request_name, a.team, f"{a.team}/{a.purpose}",
                                             end, cover, "is running"))
    for r in pending:
        span = r.estimated_runtime or r.time_limit
        if span is None:
            continue
        end = now + span

        def fits(q: Quota, r: Request = r) -> bool:
            return q.team == r.team and q.purpose == r.purpose and (
                q.gpu_model is None or not r.gpu_models or q.gpu_model in r.gpu_models)

        cover = coverage_end(quotas, None, now, fits)
        if cover is not None and end > cover:
            alerts.append(_past_expiry_alert(r.name, r.team, f"{r.team}/{r.purpose}", end, cover,
                                             "is queued"))
    return alerts


def _past_expiry_alert(name: str, team: str, scope: str, end: datetime, cover: datetime,
                       doing: str) -> Alert:
    body = (f"Task {name} {doing} and is expected to end at {end:%Y-%m-%d %H:%M} UTC, but quota "
            f"{scope} ends at {cover:%Y-%m-%d %H:%M} UTC. Renew or extend the quota now, or the "
            "run may be cut off or never admitted.")
    notice = Notice(team=team, kind="run_past_expiry",
                    subject=f"[gpu-pool] {team}: {name} would outlive its quota", body=body,
                    facts=(("task", name), ("expected_end", iso(end) or ""),
                           ("quota_ends", iso(cover) or "")))
    return Alert(NoticeKey("run_past_expiry", name, 0, iso(cover) or ""), notice)


@dataclass(frozen=True)
class AlertRun:
    sent: tuple[tuple[NoticeKey, tuple[str, ...]], ...] = ()
    already: tuple[NoticeKey, ...] = ()
    failed: tuple[tuple[NoticeKey, str], ...] = ()
    partial: tuple[str, ...] = field(default=())


def deliver_alerts(alerts: Sequence[Alert], teams: Sequence[Team], records: OpsRecords,
                   channels: TeamChannels, now: datetime) -> AlertRun:
    """Claim, send and mark each alert; already-claimed keys are skipped."""
    by_team = {t.name: t for t in teams}
    sent, already, failed, partial = [], [], [], []
    for alert in alerts:
        if not records.claim(alert.key, alert.notice.team, alert.notice.subject, now):
            already.append(alert.key)
            continue
        team = by_team.get(alert.notice.team)
        try:
            done = channels.deliver(alert.notice, team.notify_email if team else None,
                                    team.notify_webhook if team else None)
        except DeliveryError as error:
            records.unclaim(alert.key)
            failed.append((alert.key, str(error)))
            continue
        records.mark_sent(alert.key, done.channels, now)
        partial.extend(done.errors)
        for key in alert.covers:
            records.claim(key, alert.notice.team, alert.notice.subject, now, status="covered")
        sent.append((alert.key, done.channels))
    return AlertRun(tuple(sent), tuple(already), tuple(failed), tuple(partial))
