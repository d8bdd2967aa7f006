"""What each API endpoint shows, built from the store: fleet, queue, quotas, usage.

These functions take a :class:`~gpu_pool.store.Store`, a policy and ``now`` (an injected
clock, so tests control time) and return the response models of :mod:`gpu_pool.api.schemas`.
They only read.

Invariants
----------
* The queue is in the order the engine considers requests: priority class first (most
  urgent first), then submission time — the greedy pass's order. Each item carries the
  reason the last placement cycle persisted for it (the store's ``reason_code`` /
  ``reason_message``), never a reason made up here.
* GPU status is derived from active allocations and the last probe reading each time; no
  counter is kept.
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

from gpu_pool.api import queries
from gpu_pool.api.schemas import (
    AllocationOut,
    CrossZoneMoveOut,
    FairShareOut,
    FleetOut,
    FleetSummary,
    GpuOut,
    HolderOut,
    NodeGroupOut,
    NodeOut,
    PolicyOut,
    PolicySettingOut,
    PolicyVersionOut,
    QueueItemOut,
    QueueOut,
    QuotaOut,
    QuotasOut,
    ReadinessOut,
    TaskLinkOut,
    TeamUsageOut,
    UsageBucketOut,
    UsageOut,
)
from gpu_pool.model import Allocation, Gpu, Node, NodeState, Policy, PriorityClass, Quota
from gpu_pool.ops import crosszone
from gpu_pool.store import Store
from gpu_pool.store.codec import py_time

# A held GPU whose last reading is below this is shown as idle (the reclaim sweep's concern).
IDLE_UTILIZATION_PCT = 5.0
WINDOWS = {"day": (timedelta(days=1), 3600), "week": (timedelta(days=7), 6 * 3600)}


def task_link(row: dict[str, Any] | None) -> TaskLinkOut | None:
    """The Airflow task instance of a request row, with the Airflow UI path to it."""
    if not row or not row.get("dag_id") or not row.get("task_id"):
        return None
    url = None
    if row.get("run_id"):
        url = (f"/dags/{quote(row['dag_id'], safe='')}/runs/{quote(row['run_id'], safe='')}"
               f"/tasks/{quote(row['task_id'], safe='')}")
        if row.get("map_index") is not None and row["map_index"] >= 0:
            url += f"/mapped/{row['map_index']}"
    return TaskLinkOut(dag_id=row["dag_id"], task_id=row["task_id"], run_id=row.get("run_id"),
                       map_index=row.get("map_index"), try_number=row.get("try_number"),
                       airflow_url=url)


def allocation_out(a: Allocation, links: dict[str, dict[str, Any]]) -> AllocationOut:
    return AllocationOut(
        id=a.id, request=a.request_name, team=a.team, purpose=str(a.purpose),
        priority=str(a.priority), node=a.node, gpu_model=a.gpu_model,
        gpu_indices=list(a.gpu_indices), share_milli=a.gpu_milli, started_at=a.started_at,
        ends_by=a.ends_by, preemptible=a.preemptible, task=task_link(links.get(a.request_name)),
        borrowed_from=a.borrowed_from, off_peak=a.off_peak)


def request_links(store: Store, names: list[str]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in queries.request_rows(store.engine, names=sorted(set(names)))}


def _gpu_status(node: Node, gpu: Gpu, held: int) -> str:
    if node.state is NodeState.DOWN:
        return "down"
    if node.state is NodeState.DRAINING:
        return "draining"
    if not gpu.healthy:
        return "unhealthy"
    if held == 0:
        return "free"
    if gpu.utilization_pct is not None and gpu.utilization_pct < IDLE_UTILIZATION_PCT:
        return "idle"
    return "held" if held >= 1000 else "partial"


def fair_share(store: Store, policy: Policy | None, now: datetime,
               teams: list[str] | None = None) -> tuple[dict[str, float], list[FairShareOut]]:
    """Each team's decayed use (:mod:`gpu_pool.store.usage`) and the ranked rows, for
    every team on record (and ``teams``); nothing when fair share is off."""
    from gpu_pool.store.usage import ranks

    pol = policy or Policy()
    if pol.fair_share_half_life <= timedelta(0):
        return {}, []
    used = store.team_usage(now, pol.fair_share_half_life)
    names = {t.name for t in store.list_teams()} | set(teams or ())
    rank = ranks(used, names)
    return used, [FairShareOut(team=t, decayed_gpu_hours=round(used.get(t, 0.0), 3),
                               rank=rank[t]) for t in sorted(rank, key=rank.__getitem__)]


def holder_out(a: Allocation, links: dict[str, Any]) -> HolderOut:
    """One holder of a GPU, with the sharing marks (borrowed from whom, off-peak)."""
    return HolderOut(allocation_id=a.id, request=a.request_name, team=a.team,
                     purpose=str(a.purpose), priority=str(a.priority),
                     share_milli=a.gpu_milli, since=a.started_at, until=a.ends_by,
                     task=task_link(links.get(a.request_name)),
                     borrowed_from=a.borrowed_from, off_peak=a.off_peak)


def fleet(store: Store, now: datetime, policy: Policy | None = None) -> FleetOut:
    nodes = store.list_nodes()
    active = store.active_allocations()
    links = request_links(store, [a.request_name for a in active])
    reasons = queries.node_state_reasons(store.engine)
    holders: dict[tuple[str, int], list[HolderOut]] = defaultdict(list)
    held: dict[tuple[str, int], int] = defaultdict(int)
    for a in active:
        holder = holder_out(a, links)
        for idx in a.gpu_indices:
            holders[(a.node, idx)].append(holder)
            held[(a.node, idx)] += a.gpu_milli
    groups: dict[tuple[str, str | None], list[NodeOut]] = defaultdict(list)
    counts: dict[str, int] = defaultdict(int)
    for node in sorted(nodes, key=lambda n: n.name):
        gpus = []
        for g in node.gpus:
            key = (node.name, g.index)
            status = _gpu_status(node, g, held[key])
            counts[status] += 1
            gpus.append(GpuOut(index=g.index, model=g.model, memory_mib=g.memory_mib,
                               healthy=g.healthy, utilization_pct=g.utilization_pct,
                               status=status, held_milli=held[key], holders=holders[key]))
        groups[(node.zone, node.gpu_model)].append(NodeOut(
            name=node.name, zone=node.zone, tier=str(node.tier), state=str(node.state),
            state_reason=reasons.get(node.name), gpu_model=node.gpu_model,
            cpu_milli=node.cpu_milli, memory_mib=node.memory_mib, gpus=gpus))
    return FleetOut(
        at=now,
        summary=FleetSummary(nodes=len(nodes), gpus=sum(n.gpu_count for n in nodes),
                             by_status=dict(sorted(counts.items()))),
        groups=[NodeGroupOut(zone=z, gpu_model=m, nodes=ns)
                for (z, m), ns in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))],
        fair_share=fair_share(store, policy, now)[1],
    )


def _shape(row: dict[str, Any]) -> str:
    if row["nodes"] > 1:
        return f"{row['nodes']} nodes x {row['gpus']} GPUs"
    if row["gpu_milli"] < 1000:
        return f"{row['gpu_milli'] / 10:g}% of 1 GPU"
    return f"{row['gpus']} GPU" + ("s" if row["gpus"] != 1 else "")


def queue(store: Store, now: datetime, team: str | None = None,
          limit: int | None = None, policy: Policy | None = None) -> QueueOut:
    rows = queries.request_rows(store.engine, state="pending")
    far = datetime.max.replace(tzinfo=now.tzinfo)
    rows.sort(key=lambda r: (PriorityClass(r["priority"]).rank, r["submitted_at"] or far,
                             r["name"]))
    teams = sorted({r["team"] for r in rows})
    used, shares = fair_share(store, policy, now, teams)
    items = []
    for position, r in enumerate(rows, start=1):
        if team is not None and r["team"] != team:
            continue
        submitted = r["submitted_at"]
        items.append(QueueItemOut(
            position=position, name=r["name"], team=r["team"], purpose=r["purpose"],
            priority=r["priority"], shape=_shape(r),
            gpus=r["nodes"] * r["gpus"] * r["gpu_milli"] / 1000.0,
            gpu_models=sorted(json.loads(r["gpu_models"] or "[]")),
            submitted_at=submitted,
            waited_s=(now - submitted).total_seconds() if submitted else None,
            reason_code=r["reason_code"], reason_message=r["reason_message"],
            estimated_start=py_time(r.get("estimated_start")),
            data_ready=bool(r["data_ready"]), dataset=r["dataset_uri"], task=task_link(r),
            team_decayed_gpu_hours=round(used.get(r["team"], 0.0), 3)))
    if limit is not None:
        items = items[:limit]
    return QueueOut(at=now, total=len(rows), teams=teams, items=items, fair_share=shares)


def alert_level(quota: Quota, now: datetime, alert_days: tuple[int, ...]) -> str:
    if now < quota.valid_from:
        return "future"
    left = quota.expires_at - now
    if left <= timedelta(0):
        return "expired"
    days = sorted(alert_days, reverse=True)  # e.g. 15, 7, 1
    levels = ("amber", "red", "final")
    level = "ok"
    for threshold, name in zip(days, levels, strict=False):
        if left <= timedelta(days=threshold):
            level = name
    return level


def quotas(store: Store, policy: Policy, now: datetime) -> QuotasOut:
    all_quotas = store.list_quotas()
    usage = store.quota_usage(now)
    since = min((q.valid_from for q in all_quotas), default=now)
    ledger = store.ledger(since=since)
    active = store.active_allocations()
    out = []
    for q in all_quotas:
        used = sum(e.gpu_hours for e in ledger if e.started_at >= q.valid_from
                   and q.matches(e.team, e.purpose, e.gpu_model))
        used += sum(a.gpu_milli_total / 1000.0
                    * max((now - max(a.started_at, q.valid_from)).total_seconds(), 0.0) / 3600
                    for a in active if q.matches(a.team, a.purpose, a.gpu_model))
        out.append(QuotaOut(
            id=q.id, team=q.team, purpose=str(q.purpose), gpu_model=q.gpu_model, gpus=q.gpus,
            in_use=usage.get(q.id or "", 0.0), borrow_limit_gpus=q.borrow_limit_gpus,
            gpu_hour_budget=q.gpu_hour_budget, budget_used_gpu_hours=round(used, 3),
            valid_from=q.valid_from, expires_at=q.expires_at,
            expires_in_s=(q.expires_at - now).total_seconds(),
            alert=alert_level(q, now, policy.alert_days)))
    return QuotasOut(at=now, alert_days=list(policy.alert_days), quotas=out)


def cross_zone_moves(store: Store, policy: Policy, since: datetime,
                     now: datetime) -> list[CrossZoneMoveOut]:
    """Allocations started since ``since`` outside their dataset's zone, with the transfer
    and expected saving the engine recorded (an allocation without the record: the transfer
    from the size over the zone link or the node's bandwidth, no expected saving) and
    whether the move paid, measured up to ``now`` (:mod:`gpu_pool.ops.crosszone`)."""
    rows = queries.cross_zone_moves(store.engine, since)
    if not rows:
        return []
    first = min(m.started_at for m in rows)
    held = crosszone.by_node(crosszone.holds_of(store.ledger(since=first),
                                                store.active_allocations()))
    nodes = store.list_nodes()
    zone_of = {n.name: n.zone for n in nodes}
    out = []
    for m in rows:
        parts = [a for a in store.allocations_of(m.request) if a.started_at >= since
                 and zone_of.get(a.node) == m.to_zone]
        recorded = max((a.transfer_s for a in parts), default=0.0)
        if recorded > 0:
            transfer = recorded
            expected = crosszone.finite(max(a.expected_wait_saved_s for a in parts))
        else:
            bandwidth = policy.zone_links.get((m.from_zone, m.to_zone), m.bandwidth_mb_s)
            transfer = m.size_gib * 1024 / bandwidth if bandwidth else 0.0
            expected = None
        start = min((a.started_at for a in parts), default=m.started_at)
        try_parts = [a for a in parts if a.started_at == start]
        need = max((a.gpu_milli_total / 1000 for a in try_parts), default=0.0)
        model = try_parts[0].gpu_model if try_parts else None
        room, saved, paid = crosszone.judge(m.from_zone, model, need, max(len(try_parts), 1),
                                            start, transfer, nodes, held, now)
        out.append(CrossZoneMoveOut(
            request=m.request, team=m.team, dataset=m.dataset, from_zone=m.from_zone,
            to_zone=m.to_zone, size_gib=m.size_gib, transfer_s=round(transfer, 1),
            started_at=m.started_at, expected_wait_saved_s=expected, home_room_at=room,
            actual_wait_saved_s=round(saved, 1), paid=paid))
    return out


def usage(store: Store, policy: Policy, now: datetime, window: str) -> UsageOut:
    span, bucket_s = WINDOWS[window]
    step = timedelta(seconds=bucket_s)
    start = (now - span).replace(minute=0, second=0, microsecond=0)
    buckets = []
    windows = queries.allocation_windows(store.engine, start, now)
    t = start
    while t < now:
        end = min(t + step, now)
        held = 0.0
        for w in windows:
            lo, hi = max(w.started_at, t), min(w.ended_at or now, end)
            if hi > lo:
                held += w.gpu_milli / 1000.0 * (hi - lo) / (end - t)
        buckets.append(UsageBucketOut(start=t, gpus_held=round(held, 3),
                                      off_peak=policy.off_peak.contains(t)))
        t = end
    peak = [b.gpus_held for b in buckets if not b.off_peak]
    off = [b.gpus_held for b in buckets if b.off_peak]
    per_team: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for e in store.ledger(since=start):
        per_team[e.team][0] += e.gpu_hours
        per_team[e.team][1] += e.cost
    moves = cross_zone_moves(store, policy, start, now)
    pending = store.pending_requests()
    ready = sum(1 for r in pending if r.data_ready)
    return UsageOut(
        at=now, window=window, bucket_s=bucket_s,
        capacity_gpus=sum(n.gpu_count for n in store.list_nodes()), buckets=buckets,
        peak_avg_gpus=round(sum(peak) / len(peak), 3) if peak else 0.0,
        off_peak_avg_gpus=round(sum(off) / len(off), 3) if off else 0.0,
        teams=[TeamUsageOut(team=t, gpu_hours=round(v[0], 3), cost=round(v[1], 2))
               for t, v in sorted(per_team.items())],
        cross_zone=moves, cross_zone_transfer_s=round(sum(m.transfer_s for m in moves), 1),
        cross_zone_summary=crosszone.summary(moves),
        readiness=ReadinessOut(waiting=len(pending), ready=ready, not_ready=len(pending) - ready),
    )


POLICY_HISTORY = 50  # versions the policy view lists, latest last


def policy(store: Store) -> PolicyOut:
    """The policy in force, every value with its source, and the latest versions."""
    from gpu_pool.policy_file import policy_values

    latest, sources = store.policy_sources()
    values = policy_values(store.load_policy())
    defaults = policy_values(Policy())
    return PolicyOut(
        version=0 if latest is None else latest.version,
        set_by=None if latest is None else latest.actor,
        set_at=None if latest is None else latest.created_at,
        comment=None if latest is None else latest.comment,
        values=[PolicySettingOut(key=k, value=v, source="default" if sources[k] is None
                                 else sources[k].label, is_default=v == defaults[k])
                for k, v in values.items()],
        history=[PolicyVersionOut(version=v.version, actor=v.actor, created_at=v.created_at,
                                  comment=v.comment, restored_from=v.restored_from)
                 for v in store.policy_history(POLICY_HISTORY)])
