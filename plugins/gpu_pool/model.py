"""The domain model of gpu-pool: nodes, GPUs, teams, quotas, requests, allocations, ledger, policy.

Terms
-----
milli
    A thousandth of one GPU. A whole GPU is 1000 milli; a share of one GPU is 1..999 milli.
    CPU is counted in millicores (``cpu_milli``), memory in MiB (``memory_mib``).
request
    What one GPU task asks for. Exactly one of three shapes:

    * whole GPUs on one node: ``gpus=N`` (``gpu_milli`` = 1000);
    * a share of one GPU: ``gpus=1, gpu_milli=M`` with 0 < M < 1000;
    * a gang: ``nodes=K`` nodes, each with ``gpus`` whole GPUs (all or nothing).
allocation
    A request bound to a node and GPU indices (one allocation per node of a gang), with the
    milli taken on each GPU.

Invariants (checked by :mod:`gpu_pool.spec` at the boundary, relied on everywhere else)
-----------------------------------------------------------------------------------------
* Every dataclass here is frozen; collections are tuples or frozensets.
* ``Request.gpu_milli`` is 1000 unless ``gpus == 1 and nodes == 1``.
* Times are timezone-aware UTC ``datetime`` objects.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from gpu_pool.errors import SpecError

MILLI_PER_GPU = 1000


class Purpose(enum.StrEnum):
    TRAINING = "training"
    INFERENCE = "inference"
    PRETRAINING = "pretraining"


class PriorityClass(enum.StrEnum):
    """Priority classes, most urgent first. ``batch`` is preemptible batch work."""

    CRITICAL = "critical"
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"
    BATCH = "batch"

    @property
    def rank(self) -> int:
        """0 for critical, 4 for batch: lower is more urgent."""
        return list(PriorityClass).index(self)


class NodeState(enum.StrEnum):
    UP = "up"
    DRAINING = "draining"
    DOWN = "down"


class Tier(enum.StrEnum):
    CORE = "core"
    EDGE = "edge"


class RequestState(enum.StrEnum):
    PENDING = "pending"
    RUNNING = "running"  # allocated (all of a gang's allocations active)
    FINISHED = "finished"
    CANCELLED = "cancelled"
    REFUSED = "refused"


class AllocationState(enum.StrEnum):
    ACTIVE = "active"
    RELEASED = "released"
    PREEMPTED = "preempted"
    EXPIRED = "expired"


class Outcome(enum.StrEnum):
    SUCCESS = "success"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    PREEMPTED = "preempted"
    RECLAIMED = "reclaimed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class GpuModelInfo:
    """A GPU model the fleet knows: its memory and its price per GPU-hour."""

    name: str
    memory_mib: int
    price_per_gpu_hour: float = 0.0


# Models the trace simulator meets (Alibaba openb: G1..G3 undisclosed) and common cards.
DEFAULT_GPU_MODELS: tuple[GpuModelInfo, ...] = (
    GpuModelInfo("T4", 16 * 1024, 0.35),
    GpuModelInfo("A10", 24 * 1024, 0.75),
    GpuModelInfo("L4", 24 * 1024, 0.70),
    GpuModelInfo("P100", 16 * 1024, 0.45),
    GpuModelInfo("V100M16", 16 * 1024, 0.90),
    GpuModelInfo("V100M32", 32 * 1024, 1.10),
    GpuModelInfo("V100", 32 * 1024, 1.10),
    GpuModelInfo("A30", 24 * 1024, 0.90),
    GpuModelInfo("L40S", 48 * 1024, 1.40),
    GpuModelInfo("A100", 80 * 1024, 2.20),
    GpuModelInfo("A100-40G", 40 * 1024, 1.60),
    GpuModelInfo("H100", 80 * 1024, 3.50),
    GpuModelInfo("H200", 141 * 1024, 4.50),
    GpuModelInfo("G1", 16 * 1024, 0.50),
    GpuModelInfo("G2", 32 * 1024, 1.00),
    GpuModelInfo("G3", 32 * 1024, 1.20),
)


@dataclass(frozen=True)
class Gpu:
    """One device of a node."""

    index: int
    model: str
    memory_mib: int
    healthy: bool = True
    utilization_pct: float | None = None  # last probe reading, 0..100


@dataclass(frozen=True)
class Node:
    """A GPU host reachable over SSH."""

    name: str
    gpus: tuple[Gpu, ...]
    cpu_milli: int
    memory_mib: int
    zone: str = "default"
    tier: Tier = Tier.CORE
    ssh_conn_id: str | None = None
    bandwidth_mb_s: float = 1000.0  # megabytes per second to its zone's storage
    labels: Mapping[str, str] = field(default_factory=dict)
    state: NodeState = NodeState.UP

    @property
    def gpu_model(self) -> str | None:
        """The node's GPU model (a node holds one model), None for a node without GPUs."""
        return self.gpus[0].model if self.gpus else None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def schedulable(self) -> bool:
        return self.state is NodeState.UP


@dataclass(frozen=True)
class Team:
    name: str
    notify_email: str | None = None
    notify_webhook: str | None = None


@dataclass(frozen=True)
class Quota:
    """Guaranteed GPUs of a team for a purpose on a GPU model (``None`` = any model).

    ``borrow_limit_gpus`` is how many GPUs beyond the guarantee the team may borrow from idle
    capacity (borrowed work is preemptible). ``gpu_hour_budget`` caps GPU-hours per period.
    """

    team: str
    purpose: Purpose
    gpus: float
    valid_from: datetime
    expires_at: datetime
    gpu_model: str | None = None
    borrow_limit_gpus: float = 0.0
    gpu_hour_budget: float | None = None
    id: str | None = None

    def active_at(self, now: datetime) -> bool:
        return self.valid_from <= now < self.expires_at

    def matches(self, team: str, purpose: Purpose, gpu_model: str | None) -> bool:
        return (
            self.team == team
            and self.purpose == purpose
            and (self.gpu_model is None or self.gpu_model == gpu_model)
        )


@dataclass(frozen=True)
class Dataset:
    """The data a request reads: where it lives and how big it is."""

    uri: str
    zone: str | None = None
    size_gib: float = 0.0


@dataclass(frozen=True)
class Request:
    """What one GPU task asks for (see the module docstring for the three shapes)."""

    name: str
    team: str
    purpose: Purpose = Purpose.TRAINING
    priority: PriorityClass = PriorityClass.NORMAL
    gpus: int = 1  # whole GPUs per node; 1 for a share
    gpu_milli: int = MILLI_PER_GPU  # per GPU; < 1000 only for a share of one GPU
    nodes: int = 1  # > 1 for a gang
    gpu_models: frozenset[str] = frozenset()  # empty: any model
    min_gpu_memory_mib: int = 0
    cpu_milli: int = 0  # per node
    memory_mib: int = 0  # per node
    dataset: Dataset | None = None
    data_ready: bool = True
    time_limit: timedelta | None = None
    estimated_runtime: timedelta | None = None
    preemptible: bool = False
    submitted_at: datetime | None = None
    id: str | None = None
    # SIGTERM to SIGKILL when preempted (None: the policy's preemption_grace).
    grace: timedelta | None = None
    # How many times this task was preempted before (the store counts its earlier tries).
    preemptions: int = 0

    @property
    def is_share(self) -> bool:
        return self.gpu_milli < MILLI_PER_GPU

    @property
    def is_gang(self) -> bool:
        return self.nodes > 1

    @property
    def total_gpu_milli(self) -> int:
        """GPU demand of the whole request in milli (all nodes of a gang)."""
        return self.nodes * self.gpus * self.gpu_milli

    @property
    def total_gpus(self) -> float:
        return self.total_gpu_milli / MILLI_PER_GPU

    def accepts(self, gpu: Gpu) -> bool:
        """Whether a GPU of this model and memory meets the request's constraints."""
        if self.gpu_models and gpu.model not in self.gpu_models:
            return False
        return gpu.memory_mib >= self.min_gpu_memory_mib


@dataclass(frozen=True)
class Allocation:
    """A request's hold on one node: GPU indices and the milli taken on each."""

    request_name: str
    node: str
    gpu_indices: tuple[int, ...]
    gpu_milli: int  # per GPU index
    cpu_milli: int
    memory_mib: int
    team: str
    purpose: Purpose
    priority: PriorityClass
    gpu_model: str | None
    started_at: datetime
    ends_by: datetime | None = None  # start + time limit
    preemptible: bool = False
    state: AllocationState = AllocationState.ACTIVE
    id: str | None = None
    request_id: str | None = None
    # The team whose idle guaranteed GPUs this allocation borrows ("" : unguaranteed
    # capacity); None: within its own quota. Borrowed allocations may be reclaimed.
    borrowed_from: str | None = None
    # Placed beyond quota in an off-peak window: the peak reclaims it.
    off_peak: bool = False
    grace: timedelta | None = None  # the request's own grace, if it set one
    # Times its request was preempted before this allocation began (max_preemptions_per_task).
    preemptions: int = 0
    # Cross-zone: seconds to move its data here, and the home-zone wait that was to save.
    transfer_s: float = 0.0
    expected_wait_saved_s: float = 0.0

    @property
    def gpu_milli_total(self) -> int:
        return len(self.gpu_indices) * self.gpu_milli


@dataclass(frozen=True)
class LedgerEntry:
    """Append-only usage record written when an allocation ends."""

    allocation_id: str
    request_name: str
    team: str
    purpose: Purpose
    node: str
    gpu_model: str | None
    gpus: float
    started_at: datetime
    ended_at: datetime
    outcome: Outcome
    price_per_gpu_hour: float = 0.0
    metrics: Mapping[str, float] = field(default_factory=dict)
    borrowed_from: str | None = None  # as on the allocation
    off_peak: bool = False
    transfer_s: float = 0.0  # cross-zone: the transfer accepted ...
    expected_wait_saved_s: float = 0.0  # ... and the wait it was to save

    @property
    def cross_zone(self) -> bool:
        return self.transfer_s > 0

    @property
    def gpu_hours(self) -> float:
        return self.gpus * (self.ended_at - self.started_at).total_seconds() / 3600.0

    @property
    def cost(self) -> float:
        return self.gpu_hours * self.price_per_gpu_hour


@dataclass(frozen=True)
class OffPeakWindow:
    """Hours of the day, ``start_hour`` inclusive to ``end_hour`` exclusive (may wrap past
    midnight), in the fleet's time zone (:class:`OffPeak`), starting on ``days`` (0 =
    Monday .. 6 = Sunday). ``start_hour == end_hour`` is a whole day."""

    start_hour: int = 20
    end_hour: int = 8
    days: frozenset[int] = frozenset(range(7))

    def _spans(self, local: datetime) -> list[tuple[datetime, datetime]]:
        """The occurrences of this window that may contain ``local`` (naive local time)."""
        hours = (self.end_hour - self.start_hour) % 24 or 24
        spans = []
        for back in (2, 1, 0):  # a window of up to 24 h that began up to two days ago
            day = (local - timedelta(days=back)).replace(hour=0, minute=0, second=0,
                                                        microsecond=0)
            if day.weekday() in self.days:
                begin = day + timedelta(hours=self.start_hour)
                spans.append((begin, begin + timedelta(hours=hours)))
        return spans

    def contains(self, when: datetime) -> bool:
        """``when`` (aware) read in UTC; :meth:`OffPeak.contains` reads it in the fleet's zone."""
        local = when.astimezone(UTC).replace(tzinfo=None)
        return any(b <= local < e for b, e in self._spans(local))


@dataclass(frozen=True)
class OffPeak:
    """When the fleet is off-peak: one or more windows in the fleet's IANA time zone."""

    windows: tuple[OffPeakWindow, ...] = (OffPeakWindow(),)
    timezone: str = "UTC"

    def _local(self, when: datetime) -> datetime:
        from zoneinfo import ZoneInfo

        return when.astimezone(ZoneInfo(self.timezone)).replace(tzinfo=None)

    def contains(self, when: datetime) -> bool:
        local = self._local(when)
        return any(b <= local < e for w in self.windows for b, e in w._spans(local))

    def peak_starts(self, when: datetime) -> datetime | None:
        """When the off-peak period holding ``when`` ends (the next peak), as aware UTC;
        ``None`` when ``when`` is not off-peak or off-peak never ends (windows cover all
        time within a week of ``when``). Touching or overlapping windows chain."""
        from zoneinfo import ZoneInfo

        zone = ZoneInfo(self.timezone)
        local = self._local(when)
        end: datetime | None = None
        probe = local
        for _ in range(7 * 24 + 1):
            ends = [e for w in self.windows for b, e in w._spans(probe) if b <= probe < e]
            if not ends:
                break
            end = max(ends)
            probe = end
        else:
            return None
        if end is None:
            return None
        # Local wall time to UTC (a time skipped by a DST jump resolves as zoneinfo does).
        return end.replace(tzinfo=zone).astimezone(UTC)


@dataclass(frozen=True)
class Headroom:
    """Whole GPUs kept free for critical work: on nodes of ``gpu_model`` (None: any) in
    node group ``node_group`` (a node's ``group`` label, or its tier; None: any node).
    ``node`` (one node by name) is set only by a critical-only freeze, never by a policy."""

    gpus: int
    gpu_model: str | None = None
    node_group: str | None = None
    node: str | None = None

    def covers(self, node: Node) -> bool:
        if self.node is not None and node.name != self.node:
            return False
        if self.gpu_model is not None and node.gpu_model != self.gpu_model:
            return False
        if self.node_group is None:
            return True
        return node.labels.get("group", node.tier.value) == self.node_group


@dataclass(frozen=True)
class Lending:
    """A team's standing consent to lend its idle guaranteed GPUs.

    ``to``: the teams that may borrow (None: every team; empty: nobody). ``limit_gpus``:
    at most this many of its GPUs lent at once (None: all its idle guaranteed GPUs). A team
    with no record lends to every team without limit (as a Kueue cohort does); ``team
    lend`` records, changes and revokes the consent.
    """

    team: str
    to: frozenset[str] | None = None
    limit_gpus: float | None = None
    set_by: str | None = None
    set_at: datetime | None = None

    def allows(self, borrower: str) -> bool:
        return borrower != self.team and (self.to is None or borrower in self.to)


DEFAULT_PRIORITY_WEIGHTS: Mapping[PriorityClass, int] = {
    PriorityClass.CRITICAL: 10_000,
    PriorityClass.HIGH: 1_000,
    PriorityClass.NORMAL: 100,
    PriorityClass.LOW: 10,
    PriorityClass.BATCH: 1,
}


@dataclass(frozen=True)
class Policy:
    """Knobs of the placement engine and of the fleet's chores."""

    priority_weights: Mapping[PriorityClass, int] = field(
        default_factory=lambda: dict(DEFAULT_PRIORITY_WEIGHTS)
    )
    # Whole GPUs kept free fleet-wide for critical work: others may not dip below it.
    critical_headroom_gpus: int = 0
    # Headroom per GPU model and/or node group, on top of the fleet-wide one.
    headroom: tuple[Headroom, ...] = ()
    off_peak: OffPeak = field(default_factory=OffPeak)
    # Batch and pretraining work may borrow idle GPUs beyond quota off-peak; a new such
    # placement starts only if its time limit ends before the peak, or it is preemptible
    # (the peak then reclaims it with grace).
    lend_idle_off_peak: bool = True
    # Notice to the owners of off-peak work still running this long before the peak.
    off_peak_notice: timedelta = timedelta(minutes=30)
    # Teams may borrow idle guaranteed GPUs of consenting teams up to their borrow limit.
    borrowing: bool = True
    # A team below its guarantee with work queued takes back GPUs lent out (preemption).
    reclaim_guarantees: bool = True
    # Critical work is never held back by its team's quota while GPUs are idle: it
    # borrows them although it cannot be reclaimed (it is not preempted).
    critical_borrows: bool = True
    # ... and when no idle GPU fits it, once it has waited its victims' grace, preempts
    # other teams' preemptible work held beyond their own guarantees to borrow what that
    # frees (Kueue's borrowWithinCohort, gpu_pool.engine.preempt).
    critical_preempts_borrowers: bool = True
    # SIGTERM to SIGKILL for a preempted task, unless the task sets its own.
    preemption_grace: timedelta = timedelta(seconds=120)
    # A task preempted before runs at least this long again before it may be preempted
    # again (no preemption loops); a first preemption needs no minimum runtime.
    min_runtime_before_preemption: timedelta = timedelta(minutes=10)
    # A task preempted this many times is not preempted again.
    max_preemptions_per_task: int = 2
    # A request whose data would take longer than this to move waits for its own zone.
    max_transfer_seconds: float = 3600.0
    # Data moves to another zone only when the wait it saves is at least the transfer time
    # times (1 + margin).
    cross_zone_margin: float = 0.5
    # Megabytes per second between two zones' storage, ((from, to) -> MB/s); a pair not
    # listed uses the destination node's bandwidth_mb_s.
    zone_links: Mapping[tuple[str, str], float] = field(default_factory=dict)
    # Waiting this long doubles a request's weight within its class (never past the next class).
    aging_half_life: timedelta = timedelta(hours=2)
    # Fair share: a team's past GPU-hours count half after this long; within a priority
    # class, the team with less decayed use goes first. timedelta(0) turns it off.
    fair_share_half_life: timedelta = timedelta(days=7)
    alert_days: tuple[int, ...] = (15, 7, 1)
    budget_alert_pcts: tuple[int, ...] = (80, 90, 100)
    gpu_models: tuple[GpuModelInfo, ...] = DEFAULT_GPU_MODELS
    solver_time_limit_s: float = 0.2
    # CP-SAT workers: 1 runs its default search in one thread; more are subsolvers
    # interleaved deterministically (not threads racing). On the class model one search
    # does best: bench/placement_scale.py seeds 1-20 at 100 x 50, the nine cycles that
    # needed CP-SAT all ended proven optimal with 1 (plan 0.08-0.16 s), where 8 interleaved
    # ended up to 1.81% below the bound at the 0.4 s wall cap, and 2 up to 1.35%.
    solver_workers: int = 1
    solver_seed: int = 0
    # A cycle stops improving its plan once the plan is proven within this share of the
    # optimum (the relaxation's bound), as a MIP solver's relative gap: 0.005 = 0.5%.
    solver_relative_gap: float = 0.005
    # Starvation guard (see gpu_pool.engine.reserve): a request pending this long reserves
    # the node(s) it would fit soonest on, closed to everything else until it starts.
    # timedelta(0) turns the rule off.
    reserve_after: timedelta = timedelta(hours=1)
    # At most this many starving requests hold reservations per cycle (0: rule off).
    max_reservations: int = 1
    # Start estimates (gpu_pool.engine.estimate) for at most this many requests waiting
    # for capacity per cycle, first in line first (0: none).
    start_estimates: int = 200

    def __post_init__(self) -> None:
        if not isinstance(self.reserve_after, timedelta) or self.reserve_after < timedelta(0):
            raise SpecError("reserve_after", self.reserve_after,
                            "a duration of zero (off) or more, like timedelta(hours=1)")
        if (isinstance(self.max_reservations, bool) or not isinstance(self.max_reservations, int)
                or self.max_reservations < 0):
            raise SpecError("max_reservations", self.max_reservations,
                            "a whole number of 0 (off) or more")
        if (isinstance(self.start_estimates, bool) or not isinstance(self.start_estimates, int)
                or self.start_estimates < 0):
            raise SpecError("start_estimates", self.start_estimates,
                            "a whole number of 0 (no estimates) or more")
        gap = self.solver_relative_gap
        if isinstance(gap, bool) or not isinstance(gap, int | float) or not 0 <= gap < 1:
            raise SpecError("solver_relative_gap", gap,
                            "a share from 0 (always seek the optimum) up to, not including, 1")

    @property
    def reserves(self) -> bool:
        """Whether the starvation guard is on (:mod:`gpu_pool.engine.reserve`)."""
        return self.max_reservations > 0 and self.reserve_after > timedelta(0)

    def weight(self, priority: PriorityClass) -> int:
        return self.priority_weights[priority]

    def model_info(self, name: str) -> GpuModelInfo | None:
        for info in self.gpu_models:
            if info.name == name:
                return info
        return None

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(m.name for m in self.gpu_models)
