"""Factories for engine tests: nodes, requests, quotas, allocations and snapshots."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpu_pool.engine.types import Snapshot
from gpu_pool.model import (
    Allocation,
    Dataset,
    Gpu,
    Headroom,
    Lending,
    Node,
    NodeState,
    Policy,
    PriorityClass,
    Purpose,
    Quota,
    Request,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MEM = {"A100": 80 * 1024, "H100": 80 * 1024, "L4": 24 * 1024, "T4": 16 * 1024,
       "V100": 32 * 1024}


def make_node(name: str, model: str = "A100", gpus: int = 8, *, cpu: int = 64_000,
              memory: int = 512 * 1024, zone: str = "z1", state: NodeState = NodeState.UP,
              unhealthy: tuple[int, ...] = (), bandwidth: float = 1000.0) -> Node:
    return Node(name, tuple(Gpu(i, model, MEM[model], healthy=i not in unhealthy)
                            for i in range(gpus)), cpu, memory, zone=zone, state=state,
                bandwidth_mb_s=bandwidth)


def make_request(name: str, gpus: int = 1, *, milli: int = 1000, nodes: int = 1,
                 team: str = "ml", purpose: Purpose = Purpose.TRAINING,
                 priority: PriorityClass = PriorityClass.NORMAL,
                 models: tuple[str, ...] = (), min_memory: int = 0, cpu: int = 0,
                 memory: int = 0, data_zone: str | None = None, size_gib: float = 0.0,
                 ready: bool = True, preemptible: bool = False,
                 waited: timedelta = timedelta(0),
                 time_limit: timedelta | None = None) -> Request:
    ds = Dataset(f"s3://data/{name}", data_zone, size_gib) if data_zone or size_gib else None
    return Request(name, team, purpose, priority, gpus=gpus, gpu_milli=milli, nodes=nodes,
                   gpu_models=frozenset(models), min_gpu_memory_mib=min_memory,
                   cpu_milli=cpu, memory_mib=memory, dataset=ds, data_ready=ready,
                   preemptible=preemptible, submitted_at=NOW - waited,
                   time_limit=time_limit)


def make_quota(team: str = "ml", gpus: float = 8, *, purpose: Purpose = Purpose.TRAINING,
               model: str | None = None, borrow: float = 0.0,
               valid_from: datetime = NOW - timedelta(days=1),
               expires_at: datetime = NOW + timedelta(days=30)) -> Quota:
    return Quota(team, purpose, gpus, valid_from, expires_at, gpu_model=model,
                 borrow_limit_gpus=borrow)


def make_allocation(request: str, node: Node, indices: tuple[int, ...], *, milli: int = 1000,
                    team: str = "ml", purpose: Purpose = Purpose.TRAINING,
                    priority: PriorityClass = PriorityClass.NORMAL, cpu: int = 0,
                    memory: int = 0, preemptible: bool = False,
                    borrowed_from: str | None = None, ran: timedelta = timedelta(hours=1),
                    preemptions: int = 0, grace: timedelta | None = None,
                    ends_in: timedelta | None = None) -> Allocation:
    """``ends_in``: its time limit ends this long after NOW (None: no time limit)."""
    return Allocation(request, node.name, indices, milli, cpu, memory, team, purpose, priority,
                      node.gpu_model, NOW - ran,
                      ends_by=None if ends_in is None else NOW + ends_in,
                      preemptible=preemptible,
                      id=f"alloc-{request}-{node.name}", borrowed_from=borrowed_from,
                      preemptions=preemptions, grace=grace)


def make_snapshot(nodes, requests, *, allocations=(), quotas=(), policy: Policy | None = None,
                  now: datetime = NOW, mix=(), lending=()) -> Snapshot:
    return Snapshot(tuple(nodes), tuple(allocations), tuple(requests), tuple(quotas),
                    policy or Policy(), now, tuple(mix), lending=tuple(lending))


def random_snapshot(rng, *, nodes: int = 4, requests: int = 8, max_gpus: int = 4,
                    extras: bool = False) -> Snapshot:
    """A small random snapshot: mixed models, shares, gangs, some allocations.

    ``extras`` adds what the brute-force oracle leaves out but the properties must survive:
    quotas (some expired), datasets in other zones, down or draining nodes, unhealthy GPUs,
    data not ready, headroom for critical work.
    """
    models = ["A100", "T4", "L4"]
    fleet = []
    for i in range(nodes):
        state = NodeState.UP
        if extras and rng.random() < 0.15:
            state = rng.choice([NodeState.DOWN, NodeState.DRAINING])
        unhealthy = (0,) if extras and rng.random() < 0.15 else ()
        fleet.append(make_node(f"n{i}", rng.choice(models), rng.randint(1, max_gpus),
                               cpu=rng.choice([8000, 16_000, 32_000]),
                               memory=rng.choice([64, 128]) * 1024, zone=rng.choice(["z1", "z2"]),
                               state=state, unhealthy=unhealthy))
    allocations = []
    for node in fleet:
        healthy = [g.index for g in node.gpus if g.healthy]
        if healthy and rng.random() < 0.4:
            j = rng.choice(healthy)
            allocations.append(make_allocation(f"old-{node.name}", node, (j,),
                                               milli=rng.choice([300, 500, 1000]),
                                               team=rng.choice(["ml", "cv"]), cpu=2000))
    reqs = []
    for i in range(requests):
        kind = rng.random()
        if kind < 0.3:
            gpus, milli, parts = 1, rng.choice([250, 400, 500, 700]), 1
        elif kind < 0.85:
            gpus, milli, parts = rng.randint(1, max_gpus), 1000, 1
        else:
            gpus, milli, parts = rng.randint(1, 2), 1000, 2
        model_set = () if rng.random() < 0.6 else (rng.choice(models),)
        priority = rng.choice(list(PriorityClass))
        zone = rng.choice([None, "z1", "z2"]) if extras else None
        reqs.append(make_request(
            f"r{i}", gpus, milli=milli, nodes=parts, models=model_set, priority=priority,
            team=rng.choice(["ml", "cv"]), cpu=rng.choice([0, 2000, 8000]),
            memory=rng.choice([0, 16 * 1024]),
            data_zone=zone, size_gib=rng.choice([1.0, 5000.0]) if zone else 0.0,
            ready=not (extras and rng.random() < 0.1),
            preemptible=extras and rng.random() < 0.2))
    quotas = ()
    policy = Policy()
    if extras:
        quotas = (make_quota("ml", rng.choice([1, 2, 4, 8])),
                  make_quota("cv", rng.choice([1, 3]), model="T4"),
                  make_quota("cv", 4, expires_at=NOW - timedelta(hours=1)))
        headroom = rng.choice([(), (), (Headroom(2, "A100"),),
                               (Headroom(1, "T4", "core"), Headroom(3, None, "core"))])
        policy = Policy(critical_headroom_gpus=rng.choice([0, 0, 2]),
                        max_transfer_seconds=3600.0, headroom=headroom)
    return make_snapshot(fleet, reqs, allocations=allocations, quotas=quotas, policy=policy)


TEAMS = ("cv", "nlp", "speech")


def random_lending_snapshot(rng, *, nodes: int = 4, requests: int = 10) -> Snapshot:
    """Teams with guarantees and borrow limits, lending consents (some refusing, some
    capped), running work within guarantees and on borrowed capacity (some of it too young
    or preempted too often to preempt again, some gangs), and a queue of mixed priority,
    partly preemptible. No headroom or reservations: every GPU is there to share."""
    fleet = [make_node(f"n{i}", "A100", rng.choice([2, 4, 8])) for i in range(nodes)]
    total = sum(n.gpu_count for n in fleet)
    quotas = [make_quota(t, rng.randint(0, max(total // 3, 1)), borrow=rng.choice([0, 2, 4, 8]))
              for t in TEAMS]
    lending = []
    for t in TEAMS:
        pick = rng.random()
        if pick < 0.25:
            lending.append(Lending(t, frozenset()))
        elif pick < 0.5:
            lending.append(Lending(t, frozenset(rng.sample([x for x in TEAMS if x != t], 1)),
                                   limit_gpus=rng.choice([None, 1, 2, 4])))
        elif pick < 0.7:
            lending.append(Lending(t, None, limit_gpus=rng.choice([1, 2, 4])))
    allocations = []
    free = {n.name: list(range(n.gpu_count)) for n in fleet}
    for i in range(rng.randint(0, nodes * 3)):
        node = rng.choice(fleet)
        if not free[node.name]:
            continue
        take = min(len(free[node.name]), rng.choice([1, 2, 4]))
        cols = tuple(free[node.name][:take])
        del free[node.name][:take]
        team = rng.choice(TEAMS)
        borrowed = rng.choice([None, None, "", *[t for t in TEAMS if t != team]])
        allocations.append(make_allocation(
            f"run{i}", node, cols, team=team, priority=rng.choice(list(PriorityClass)),
            preemptible=borrowed is not None or rng.random() < 0.5, borrowed_from=borrowed,
            ran=rng.choice([timedelta(minutes=5), timedelta(hours=1), timedelta(hours=3)]),
            preemptions=rng.choice([0, 0, 1, 2])))
    if len(fleet) > 1 and rng.random() < 0.5:  # a borrowed gang across two nodes
        a, b = rng.sample(fleet, 2)
        if free[a.name] and free[b.name]:
            for node in (a, b):
                allocations.append(make_allocation(
                    "gang", node, (free[node.name].pop(0),), team="speech",
                    priority=PriorityClass.BATCH, preemptible=True, borrowed_from="cv",
                    ran=rng.choice([timedelta(minutes=5), timedelta(hours=2)])))
    reqs = [make_request(f"r{i}", rng.choice([1, 1, 2, 4]), team=rng.choice(TEAMS),
                         priority=rng.choice(list(PriorityClass)),
                         preemptible=rng.random() < 0.6, waited=timedelta(minutes=i))
            for i in range(requests)]
    policy = Policy(max_reservations=0, borrowing=rng.random() < 0.9,
                    reclaim_guarantees=rng.random() < 0.9, lend_idle_off_peak=False,
                    critical_preempts_borrowers=rng.random() < 0.5)
    return make_snapshot(fleet, reqs, allocations=allocations, quotas=quotas, policy=policy,
                         lending=lending)
