"""Inputs and outputs of the placement engine.

A :class:`Snapshot` is everything the engine may look at: nodes (with their full capacity),
the active allocations (from which free capacity and quota usage are derived — never stored
as counters), the pending requests, quotas, policy and ``now``. A :class:`Plan` is what it
decided: placements (one :class:`Placement` per request, with one :class:`NodeAssignment`
per node of a gang), preemptions, and a :class:`PendingReason` for every request left waiting.

Reasons are data: a code a machine can act on and a sentence a person can read
("needs 4 A100 on one node; largest free block is 3").
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from gpu_pool.model import Allocation, Lending, Node, Policy, Quota, Request


@dataclass(frozen=True)
class Snapshot:
    nodes: tuple[Node, ...]
    allocations: tuple[Allocation, ...]  # active ones only
    requests: tuple[Request, ...]  # pending ones only
    quotas: tuple[Quota, ...]
    policy: Policy
    now: datetime
    # Task-size mix seen so far, for fragmentation-aware placement (FGD): (gpus, gpu_milli)
    # -> relative frequency. Empty: the engine derives it from the pending requests.
    workload_mix: tuple[tuple[tuple[int, int], float], ...] = ()
    # Fair share: each team's decayed past GPU-hours (Policy.fair_share_half_life).
    team_usage: Mapping[str, float] = field(default_factory=dict)
    # Lending consents on record (a team without one lends to every team, no limit).
    lending: tuple[Lending, ...] = ()
    # Run time / time limit of recently finished tasks: start estimates expect running
    # and waiting work to end as such work did (gpu_pool.engine.estimate).
    runtime_ratios: tuple[float, ...] = ()


class ReasonCode(enum.StrEnum):
    """Why a request is not placed this cycle. Ordered roughly from hopeless to transient."""

    NEVER_FITS = "never_fits"
    DATA_NOT_READY = "data_not_ready"
    QUOTA_EXPIRED = "quota_expired"
    QUOTA_EXHAUSTED = "quota_exhausted"
    HEADROOM_RESERVED = "headroom_reserved"
    WAITING_FOR_CAPACITY = "waiting_for_capacity"
    OUTRANKED = "outranked"
    DATA_ZONE = "waiting_for_data_zone"
    # It fits only on nodes reserved for a starving request (gpu_pool.engine.reserve).
    NODE_RESERVED = "node_reserved"
    # Set by the store when a plan preempts a running request, until the next plan gives
    # it a reason of its own (the sentence says who preempted it and why).
    PREEMPTED = "preempted"
    # Its team is inside a critical-only freeze window (gpu_pool.store.governance).
    FROZEN = "frozen"


@dataclass(frozen=True)
class PendingReason:
    request_name: str
    code: ReasonCode
    message: str


@dataclass(frozen=True)
class NodeAssignment:
    """One node's part of a placement: which GPUs, how much of each, CPU and RAM."""

    node: str
    gpu_indices: tuple[int, ...]
    gpu_milli: int  # per GPU index
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True)
class Placement:
    request_name: str
    assignments: tuple[NodeAssignment, ...]  # one per node; several for a gang
    cross_zone: bool = False  # the request's data must move to another zone
    transfer_seconds: float = 0.0
    # Cross-zone only: the wait in the home zone the move is expected to save.
    expected_wait_saved_s: float = 0.0
    # The team whose idle guaranteed GPUs it borrows ("": unguaranteed capacity; None: none).
    borrowed_from: str | None = None
    off_peak: bool = False  # beyond quota in an off-peak window
    # Why it was placed this way when that is not plain ("borrowed 4 GPUs idle in team
    # cv's quota"); empty for a placement within quota in the home zone.
    note: str = ""


@dataclass(frozen=True)
class Preemption:
    """An active allocation the plan ends to make room for more urgent work."""

    allocation_id: str
    request_name: str
    for_request: str
    message: str
    grace_s: float = 0.0  # SIGTERM to SIGKILL
    # critical: for critical work; reclaim: a team takes back its guarantee; peak: the
    # off-peak window the placement was lent in ended.
    kind: str = "critical"


class SolveStatus(enum.StrEnum):
    OPTIMAL = "optimal"  # proven optimal by the solver
    FEASIBLE = "feasible"  # solver improved on greedy, not proven optimal
    GREEDY = "greedy"  # the greedy plan (solver skipped, timed out or failed)
    TRIVIAL = "trivial"  # nothing to place


@dataclass(frozen=True)
class SolveStats:
    status: SolveStatus
    wall_seconds: float
    objective: float
    greedy_objective: float
    upper_bound: float | None = None  # proven bound on the objective, when the solver has one
    detail: str = ""


@dataclass(frozen=True)
class Reservation:
    """Nodes closed to new work this cycle so that a starving request can start there
    (:mod:`gpu_pool.engine.reserve`): ``since`` is when it began to starve (submitted +
    ``Policy.reserve_after``); ``expected_start`` when the work on those nodes ends by
    the declared time limits (``ends_by``) and the request fits there (None: something
    there has no time limit, so no start can be promised). Until then, work whose own
    time limit ends by ``expected_start`` may start there (backfill): it cannot delay it."""

    request_name: str
    nodes: tuple[str, ...]
    since: datetime
    expected_start: datetime | None = None


@dataclass(frozen=True)
class Plan:
    placements: tuple[Placement, ...]
    pending: tuple[PendingReason, ...]
    preemptions: tuple[Preemption, ...] = ()
    stats: SolveStats = field(
        default_factory=lambda: SolveStats(SolveStatus.TRIVIAL, 0.0, 0.0, 0.0)
    )
    # Starving requests that hold nodes this cycle (none unless one waited past
    # Policy.reserve_after and does not fit now).
    reservations: tuple[Reservation, ...] = ()
    # Estimated start per request waiting for capacity (gpu_pool.engine.estimate); a
    # request missing here has no estimate (held by something else, or no known end).
    estimates: Mapping[str, datetime] = field(default_factory=dict)

    def placement_of(self, request_name: str) -> Placement | None:
        for p in self.placements:
            if p.request_name == request_name:
                return p
        return None

    def reason_of(self, request_name: str) -> PendingReason | None:
        for r in self.pending:
            if r.request_name == request_name:
                return r
        return None
