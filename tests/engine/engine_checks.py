"""Independent checks of a plan (written from the rules, not from the engine's code) and a
brute-force optimum for tiny snapshots.

The objective is restated here from its definition (gpu_pool.engine.objective docstring):
a part of request r on node n is worth ``e(r) * (1000 * w(r) - p(r, n))`` with
``p = 2 * round(100 * (m_n - m_min(r)) / m_n)`` for the card memory (datasets left out of
the brute-force instances) and ``w`` the class weight (no aging: submitted at ``now``).
"""

from __future__ import annotations

from collections import defaultdict
from itertools import combinations

from gpu_pool.engine.offpeak import OffPeakGate
from gpu_pool.engine.types import Plan, Snapshot
from gpu_pool.model import MILLI_PER_GPU, Node, PriorityClass, Request


def accepts(r: Request, node: Node) -> bool:
    if r.gpus == 0:
        return True
    gpu = node.gpus[0] if node.gpus else None
    return gpu is not None and r.accepts(gpu) and node.gpu_count >= r.gpus


def penalty(r: Request, node: Node, nodes: tuple[Node, ...]) -> int:
    ok = [n.gpus[0].memory_mib for n in nodes if n.gpus and accepts(r, n)
          and n.cpu_milli >= r.cpu_milli and n.memory_mib >= r.memory_mib]
    m_min, m = min(ok), node.gpus[0].memory_mib
    return 2 * round(100 * (m - m_min) / m)


def part_value(r: Request, node: Node, snap: Snapshot) -> int:
    e = max(r.gpus * r.gpu_milli, 1)
    return e * (1000 * snap.policy.weight(r.priority) - penalty(r, node, snap.nodes))


def plan_value(plan: Plan, snap: Snapshot) -> int:
    by_name = {r.name: r for r in snap.requests}
    nodes = {n.name: n for n in snap.nodes}
    return sum(part_value(by_name[p.request_name], nodes[a.node], snap)
               for p in plan.placements for a in p.assignments)


def quota_limits(snap: Snapshot, borrow: bool = False):
    """(team, purpose, model|None) -> guarantee milli of the active quotas (``borrow``: the
    borrow limit instead)."""
    limits: dict = defaultdict(int)
    for q in snap.quotas:
        if q.active_at(snap.now):
            limits[(q.team, q.purpose, q.gpu_model)] += round(
                (q.borrow_limit_gpus if borrow else q.gpus) * MILLI_PER_GPU)
    return limits


def check_preemptions(plan: Plan, snap: Snapshot) -> None:
    """Only eligible work is preempted (preemptible, not critical, run long enough, not
    preempted too often), gangs whole, with the right grace; reclaim takes borrowed work or
    work of teams over their guarantee (never below it), critical preemption serves
    critical requests only."""
    reqs = {r.name: r for r in snap.requests}
    by_id = {a.id: a for a in snap.allocations}
    policy = snap.policy
    gone = {p.allocation_id for p in plan.preemptions}
    guarantee: dict = defaultdict(int)
    for q in snap.quotas:
        if q.active_at(snap.now):
            guarantee[q.team] += round(q.gpus * MILLI_PER_GPU)
    # What each team holds beyond its guarantees once the plan is applied, before its
    # preemptions: its allocations and its placements (the engine counts those it placed
    # before preempting, the others only add to it).
    over: dict = defaultdict(int)
    for a in snap.allocations:
        if a.team in guarantee:
            over[a.team] += a.gpu_milli_total
    for pl in plan.placements:
        team = reqs[pl.request_name].team
        if team in guarantee:
            over[team] += sum(x.gpu_milli * len(x.gpu_indices) for x in pl.assignments)
    over = {t: held - guarantee[t] for t, held in over.items()}
    # Taken from work not marked borrowed, per team (reclaim, critical work borrowing).
    taken: dict = defaultdict(int)
    borrowing = {pl.request_name for pl in plan.placements if pl.borrowed_from is not None}
    for p in plan.preemptions:
        a = by_id[p.allocation_id]
        if p.kind == "peak":  # the peak ends preemptible off-peak work, nothing else
            assert a.off_peak and a.preemptible and not policy.off_peak.contains(snap.now)
            assert a.preemptions < policy.max_preemptions_per_task, "preempted too often"
            continue
        assert a.preemptible and a.priority is not PriorityClass.CRITICAL, "only batch preempted"
        assert a.preemptions == 0 or (
            snap.now - a.started_at >= policy.min_runtime_before_preemption), "too young"
        assert a.preemptions < policy.max_preemptions_per_task, "preempted too often"
        grace = a.grace if a.grace is not None else policy.preemption_grace
        assert p.grace_s == grace.total_seconds()
        if p.kind == "critical":
            assert reqs[p.for_request].priority is PriorityClass.CRITICAL
            if p.for_request in borrowing:  # beyond its quota: other teams' excess only
                assert policy.critical_preempts_borrowers and policy.critical_borrows
        else:
            assert p.kind == "reclaim" and policy.reclaim_guarantees, p
        if p.kind == "reclaim" or p.for_request in borrowing:
            assert a.team != reqs[p.for_request].team, "taken from its own team"
            if a.borrowed_from is None:
                taken[a.team] += a.gpu_milli_total
                assert taken[a.team] <= over.get(a.team, 0), (
                    f"{p.kind} took {a.request_name} of team {a.team}, which it left below "
                    "its guarantee: it takes borrowed work, or work beyond a guarantee")
        for b in snap.allocations:  # a gang goes whole
            if b.request_name == a.request_name:
                assert b.id in gone, f"{a.request_name}: gang preempted in part"
    assert len(gone) == len(plan.preemptions), "an allocation preempted twice"


def check_borrowing(plan: Plan, snap: Snapshot) -> None:
    """Borrowed placements: preemptible, within the group's borrow limit and the lender's
    consent and limit; none in an open fleet or with borrowing off."""
    reqs = {r.name: r for r in snap.requests}
    nodes = {n.name: n for n in snap.nodes}
    consent = {c.team: c for c in snap.lending}
    limits = quota_limits(snap, borrow=True)
    borrowed: dict = defaultdict(int)
    lent: dict = defaultdict(int)
    gone = {p.allocation_id for p in plan.preemptions}
    for a in snap.allocations:
        # A preempted borrower gives back what it borrowed (critical work may borrow it).
        if a.borrowed_from is not None and a.id not in gone:
            lent[a.borrowed_from] += a.gpu_milli_total
            key = group_key(limits, a.team, a.purpose, a.gpu_model)
            if key:
                borrowed[key] += a.gpu_milli_total
    for p in plan.placements:
        if p.borrowed_from is None:
            continue
        r = reqs[p.request_name]
        assert snap.quotas and snap.policy.borrowing, "borrowed in an open fleet / with it off"
        if (r.priority is PriorityClass.CRITICAL and snap.policy.critical_borrows
                and "not reclaimed" in p.note):
            pass  # critical work borrows though it cannot be reclaimed
        else:
            assert r.preemptible, f"{r.name}: not preemptible, yet borrowed"
            assert r.preemptions < snap.policy.max_preemptions_per_task, (
                f"{r.name}: preempted as often as a task may be, yet borrowed")
        assert p.note.startswith("borrowed "), p.note
        if p.borrowed_from:
            c = consent.get(p.borrowed_from)
            assert c is None or c.allows(r.team), f"{r.name}: no consent of {p.borrowed_from}"
            assert p.borrowed_from != r.team
        lent[p.borrowed_from] += r.total_gpu_milli
        if p.borrowed_from and consent.get(p.borrowed_from) is not None:
            cap = consent[p.borrowed_from].limit_gpus
            if cap is not None:
                assert lent[p.borrowed_from] <= round(cap * MILLI_PER_GPU), "lend limit"
        for a in p.assignments:
            key = group_key(limits, r.team, r.purpose, nodes[a.node].gpu_model)
            assert key is not None
            borrowed[key] += r.gpus * r.gpu_milli
            assert borrowed[key] <= limits[key], f"{r.name}: borrow limit of {key} exceeded"


def group_key(limits, team, purpose, model):
    for key in ((team, purpose, model), (team, purpose, None)):
        if key in limits:
            return key
    return None


def check_plan(plan: Plan, snap: Snapshot) -> None:
    """Assert every rule a plan must keep (capacity, gangs, models, quota, nodes, data)."""
    nodes = {n.name: n for n in snap.nodes}
    reqs = {r.name: r for r in snap.requests}
    used: dict[tuple[str, int], int] = defaultdict(int)
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    gone = {p.allocation_id for p in plan.preemptions}
    check_preemptions(plan, snap)
    check_borrowing(plan, snap)
    for a in snap.allocations:
        if a.id in gone:
            continue
        for i in a.gpu_indices:
            used[(a.node, i)] += a.gpu_milli
        cpu[a.node] += a.cpu_milli
        mem[a.node] += a.memory_mib
    before = dict(used)
    limits = quota_limits(snap)
    usage: dict = defaultdict(int)
    for a in snap.allocations:
        key = group_key(limits, a.team, a.purpose, a.gpu_model)
        # Borrowed work counts against borrowing; preempted work gives its quota back.
        if key and a.borrowed_from is None and a.id not in gone:
            usage[key] += a.gpu_milli_total
    names = [p.request_name for p in plan.placements] + [x.request_name for x in plan.pending]
    assert sorted(names) == sorted(reqs), "every request placed or pending, exactly once"
    touched_by: dict[tuple[str, int], set[str]] = defaultdict(set)
    gate = OffPeakGate.at(snap.policy, snap.now)
    for p in plan.placements:
        r = reqs[p.request_name]
        assert r.data_ready, f"{r.name} placed without its data"
        assert len(p.assignments) == r.nodes, f"{r.name}: gang split"
        assert len({a.node for a in p.assignments}) == r.nodes, f"{r.name}: node repeated"
        for a in p.assignments:
            node = nodes[a.node]
            assert node.schedulable, f"{r.name} on {node.name} ({node.state})"
            assert accepts(r, node), f"{r.name}: model/memory constraint broken on {node.name}"
            assert len(a.gpu_indices) == r.gpus and len(set(a.gpu_indices)) == r.gpus
            assert a.cpu_milli == r.cpu_milli and a.memory_mib == r.memory_mib
            if r.gpus:
                assert a.gpu_milli == r.gpu_milli
            healthy = {g.index for g in node.gpus if g.healthy}
            for i in a.gpu_indices:
                assert i in healthy, f"{r.name}: GPU {i} of {node.name} unhealthy or absent"
                if before.get((a.node, i), 0) == 0:
                    kind = "critical" if r.priority is PriorityClass.CRITICAL else "other"
                    touched_by[(a.node, i)].add(kind)
                used[(a.node, i)] += a.gpu_milli
            cpu[a.node] += a.cpu_milli
            mem[a.node] += a.memory_mib
            key = group_key(limits, r.team, r.purpose, node.gpu_model)
            lent = gate.lends(r)
            if snap.quotas and r.gpus:
                assert key is not None, f"{r.name} placed without an active quota"
                if not lent and p.borrowed_from is None:
                    usage[key] += r.gpus * r.gpu_milli
                    assert usage[key] <= limits[key], f"{r.name}: quota {key} exceeded"
    for (node, i), milli in used.items():
        assert milli <= MILLI_PER_GPU, f"GPU {i} of {node} over-allocated: {milli}"
    for name, node in nodes.items():
        assert cpu[name] <= node.cpu_milli and mem[name] <= node.memory_mib, name
    if snap.policy.critical_headroom_gpus:
        # A GPU whole at the start counts against the headroom when non-critical work
        # uses it and critical work does not (critical work may take the headroom).
        noncritical_whole = sum(1 for kinds in touched_by.values() if kinds == {"other"})
        whole0 = sum(1 for n in snap.nodes if n.schedulable for g in n.gpus
                     if g.healthy and before.get((n.name, g.index), 0) == 0)
        assert noncritical_whole <= max(whole0 - snap.policy.critical_headroom_gpus, 0)
    for h in snap.policy.headroom:
        # The same per model/group, over the up nodes the headroom covers.
        covered = {n.name for n in snap.nodes if n.schedulable and h.covers(n)}
        taken = sum(1 for (node, _), kinds in touched_by.items()
                    if kinds == {"other"} and node in covered)
        whole0 = sum(1 for n in snap.nodes if n.name in covered for g in n.gpus
                     if g.healthy and before.get((n.name, g.index), 0) == 0)
        assert taken <= max(whole0 - h.gpus, 0), f"headroom {h} dipped into"


def brute_force_optimum(snap: Snapshot) -> int:
    """Best plan value by exhaustive search (datasets, quotas and headroom left out)."""
    nodes = [n for n in snap.nodes if n.schedulable]
    free = {n.name: [0 if not g.healthy else MILLI_PER_GPU for g in n.gpus] for n in nodes}
    cpu = {n.name: n.cpu_milli for n in nodes}
    mem = {n.name: n.memory_mib for n in nodes}
    for a in snap.allocations:
        if a.node in free:
            for i in a.gpu_indices:
                free[a.node][i] -= a.gpu_milli
            cpu[a.node] -= a.cpu_milli
            mem[a.node] -= a.memory_mib
    reqs = [r for r in snap.requests if r.data_ready]
    best_each = []
    for r in reqs:
        vals = [part_value(r, n, snap) for n in nodes if accepts(r, n)]
        best_each.append(r.nodes * max(vals) if len(vals) >= r.nodes else 0)
    suffix = [0] * (len(reqs) + 1)
    for i in range(len(reqs) - 1, -1, -1):
        suffix[i] = suffix[i + 1] + best_each[i]
    best = [0]

    def take(n: Node, r: Request, col: int | None) -> list[int] | None:
        if cpu[n.name] < r.cpu_milli or mem[n.name] < r.memory_mib:
            return None
        f = free[n.name]
        if r.is_share:
            return [col] if col is not None and f[col] >= r.gpu_milli else None
        cols = [j for j, v in enumerate(f) if v == MILLI_PER_GPU][: r.gpus]
        return cols if len(cols) == r.gpus else None

    def apply(n: Node, r: Request, cols: list[int], sign: int) -> None:
        for j in cols:
            free[n.name][j] -= sign * r.gpu_milli
        cpu[n.name] -= sign * r.cpu_milli
        mem[n.name] -= sign * r.memory_mib

    def dfs(i: int, value: int) -> None:
        best[0] = max(best[0], value)
        if i == len(reqs) or value + suffix[i] <= best[0]:
            return
        r = reqs[i]
        ok = [n for n in nodes if accepts(r, n)]
        for combo in combinations(ok, r.nodes):
            if r.is_share:
                n = combo[0]
                seen = set()
                for j, v in enumerate(free[n.name]):
                    if v >= r.gpu_milli and v not in seen:
                        seen.add(v)
                        if take(n, r, j) is not None and cpu[n.name] >= r.cpu_milli:
                            apply(n, r, [j], +1)
                            dfs(i + 1, value + part_value(r, n, snap))
                            apply(n, r, [j], -1)
                continue
            taken = []
            for n in combo:
                cols = take(n, r, None)
                if cols is None:
                    break
                apply(n, r, cols, +1)
                taken.append((n, cols))
            if len(taken) == r.nodes:
                dfs(i + 1, value + sum(part_value(r, n, snap) for n in combo))
            for n, cols in taken:
                apply(n, r, cols, -1)
        dfs(i + 1, value)

    dfs(0, 0)
    return best[0]
