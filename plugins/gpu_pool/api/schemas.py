"""The JSON shapes of the gpu-pool REST API (responses and request bodies).

Every body the API accepts is a pydantic model with ``extra="forbid"``: an unknown field is
a 422 that names it. Responses are plain models; times are ISO 8601 UTC.

Terms
-----
GPU status
    ``free`` (up node, nothing held), ``held`` (held and busy, or no reading yet), ``idle``
    (held but the last probe reading is under the idle threshold), ``partial`` (shares held,
    room left), ``draining`` / ``down`` (the node's state; still shows its holders),
    ``unhealthy`` (the probe marked the device broken).
alert level of a quota
    ``ok`` more than the first alert threshold (15 days) left, ``amber`` within it, ``red``
    within the second (7 days), ``final`` within the last (1 day), ``expired`` past it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

GpuStatus = Literal["free", "held", "idle", "partial", "draining", "down", "unhealthy"]
AlertLevel = Literal["ok", "amber", "red", "final", "expired", "future"]


class TaskLinkOut(BaseModel):
    """The Airflow task instance a request stands for, and the UI path to it."""

    dag_id: str
    task_id: str
    run_id: str | None = None
    map_index: int | None = None
    try_number: int | None = None
    airflow_url: str | None = None


class HolderOut(BaseModel):
    allocation_id: str | None
    request: str
    team: str
    purpose: str
    priority: str
    share_milli: int
    since: datetime
    until: datetime | None
    task: TaskLinkOut | None = None
    # The team whose idle guaranteed GPUs it borrows ("": capacity no guarantee covers).
    borrowed_from: str | None = None
    off_peak: bool = False  # beyond quota in an off-peak window: the peak takes it back


class GpuOut(BaseModel):
    index: int
    model: str
    memory_mib: int
    healthy: bool
    utilization_pct: float | None
    status: GpuStatus
    held_milli: int
    holders: list[HolderOut]


class NodeOut(BaseModel):
    name: str
    zone: str
    tier: str
    state: str
    state_reason: str | None
    gpu_model: str | None
    cpu_milli: int
    memory_mib: int
    gpus: list[GpuOut]


class NodeGroupOut(BaseModel):
    zone: str
    gpu_model: str | None
    nodes: list[NodeOut]


class FleetSummary(BaseModel):
    nodes: int
    gpus: int
    by_status: dict[str, int]


class FairShareOut(BaseModel):
    """A team's decayed past GPU-hours (Policy.fair_share_half_life) and its rank: 1 =
    least used, first among requests of equal priority and wait."""

    team: str
    decayed_gpu_hours: float
    rank: int


class FleetOut(BaseModel):
    at: datetime
    summary: FleetSummary
    groups: list[NodeGroupOut]
    fair_share: list[FairShareOut] = []


class QueueItemOut(BaseModel):
    position: int
    name: str
    team: str
    purpose: str
    priority: str
    shape: str
    gpus: float
    gpu_models: list[str]
    submitted_at: datetime | None
    waited_s: float | None
    reason_code: str | None
    reason_message: str | None
    # When the last placement cycle expects it to start (None: no estimate; see
    # gpu_pool.engine.estimate).
    estimated_start: datetime | None = None
    data_ready: bool
    dataset: str | None
    task: TaskLinkOut | None = None
    team_decayed_gpu_hours: float = 0.0  # fair share: its team's decayed use


class QueueOut(BaseModel):
    at: datetime
    total: int
    teams: list[str]
    items: list[QueueItemOut]
    fair_share: list[FairShareOut] = []


class QuotaOut(BaseModel):
    id: str | None
    team: str
    purpose: str
    gpu_model: str | None
    gpus: float
    in_use: float
    borrow_limit_gpus: float
    gpu_hour_budget: float | None
    budget_used_gpu_hours: float
    valid_from: datetime
    expires_at: datetime
    expires_in_s: float
    alert: AlertLevel


class QuotasOut(BaseModel):
    at: datetime
    alert_days: list[int]
    quotas: list[QuotaOut]


class AllocationOut(BaseModel):
    id: str | None
    request: str
    team: str
    purpose: str
    priority: str
    node: str
    gpu_model: str | None
    gpu_indices: list[int]
    share_milli: int
    started_at: datetime
    ends_by: datetime | None
    preemptible: bool
    task: TaskLinkOut | None = None
    # The team whose idle guaranteed GPUs it borrows ("": capacity no guarantee covers;
    # null: within its own quota). Borrowed allocations may be reclaimed.
    borrowed_from: str | None = None
    off_peak: bool = False


class LedgerEntryOut(BaseModel):
    allocation_id: str
    request: str
    team: str
    purpose: str
    node: str
    gpu_model: str | None
    gpus: float
    started_at: datetime
    ended_at: datetime
    gpu_hours: float
    cost: float
    outcome: str
    borrowed_from: str | None = None
    off_peak: bool = False
    transfer_s: float = 0.0
    # Cross-zone: the home-zone wait the move was to save (null: unbounded, no known end).
    expected_wait_saved_s: float | None = 0.0


class UsageBucketOut(BaseModel):
    start: datetime
    gpus_held: float
    off_peak: bool


class TeamUsageOut(BaseModel):
    team: str
    gpu_hours: float
    cost: float


class CrossZoneMoveOut(BaseModel):
    """A move of the period: what the engine accepted and expected, and whether it paid
    (:mod:`gpu_pool.ops.crosszone`)."""

    request: str
    team: str
    dataset: str | None
    from_zone: str
    to_zone: str
    size_gib: float
    transfer_s: float
    started_at: datetime
    # The home-zone wait the engine expected the move to save; None when no hold there had
    # a known end (unbounded) or the allocation predates the record.
    expected_wait_saved_s: float | None = None
    home_room_at: datetime | None = None  # when the home zone actually had room; None: not yet
    actual_wait_saved_s: float = 0.0  # measured, or its lower bound while home_room_at is None
    paid: Literal["yes", "no", "unknown"] = "unknown"


class ReadinessOut(BaseModel):
    waiting: int
    ready: int
    not_ready: int


class UsageOut(BaseModel):
    at: datetime
    window: Literal["day", "week"]
    bucket_s: int
    capacity_gpus: int
    buckets: list[UsageBucketOut]
    peak_avg_gpus: float
    off_peak_avg_gpus: float
    teams: list[TeamUsageOut]
    cross_zone: list[CrossZoneMoveOut]
    cross_zone_transfer_s: float
    cross_zone_summary: str = ""  # "3 cross-zone moves, 1.2 h of transfer: 2 paid, 1 did not"
    readiness: ReadinessOut


class PlacementOut(BaseModel):
    request: str
    team: str
    state: str
    reason_code: str | None
    reason_message: str | None
    task: TaskLinkOut | None
    allocations: list[AllocationOut]
    estimated_start: datetime | None = None  # pending only: the last cycle's estimate


class EventOut(BaseModel):
    at: datetime
    subject_kind: str
    subject: str
    kind: str
    actor: str
    reason: str | None


class MeOut(BaseModel):
    user: str
    can_admin: bool


class QuotaChange(BaseModel):
    """Set (create or renew) the quota of one scope: team × purpose × model."""

    model_config = ConfigDict(extra="forbid")

    team: str = Field(min_length=1, max_length=200)
    purpose: Literal["training", "inference", "pretraining"]
    gpu_model: str | None = Field(default=None, max_length=100)
    gpus: float = Field(ge=0, le=1_000_000)
    borrow_limit_gpus: float = Field(default=0.0, ge=0, le=1_000_000)
    gpu_hour_budget: float | None = Field(default=None, ge=0, le=1e12)
    valid_from: datetime | None = None
    expires_at: datetime


class NodeStateChange(BaseModel):
    """Drain, undrain (up) or down one node; the reason is recorded with who did it."""

    model_config = ConfigDict(extra="forbid")

    state: Literal["up", "draining", "down"]
    reason: str | None = Field(default=None, max_length=500)


class NodeStateChanged(BaseModel):
    node: str
    state: str
    changed: bool
    actor: str


class PolicySettingOut(BaseModel):
    """One value of the sharing policy in force, as a policy document writes it."""

    key: str
    value: object
    source: str  # "default", or the version that set it: "v3 by alice at 2026-12-01 12:00 UTC"
    is_default: bool  # the value equals the default, whatever its source


class PolicyVersionOut(BaseModel):
    version: int
    actor: str
    created_at: datetime
    comment: str | None = None
    restored_from: int | None = None


class PolicyOut(BaseModel):
    """The sharing policy in force (``gpu-pool policy show``): version 0 is the defaults."""

    version: int
    set_by: str | None = None
    set_at: datetime | None = None
    comment: str | None = None
    values: list[PolicySettingOut]
    history: list[PolicyVersionOut]


# -- governance ------------------------------------------------------------------------


class MemberIn(BaseModel):
    """Add a person (an Airflow user name) to a team, or change their role."""

    model_config = ConfigDict(extra="forbid")

    user: str = Field(min_length=1, max_length=200)
    role: Literal["member", "lead"] = "member"


class MemberOut(BaseModel):
    team: str
    user: str
    role: str
    added_by: str
    added_at: datetime


class FreezeIn(BaseModel):
    """Freeze the team until ``until`` (an explicit end), from ``starts_at`` (default now)."""

    model_config = ConfigDict(extra="forbid")

    until: datetime
    reason: str = Field(min_length=1, max_length=500)
    starts_at: datetime | None = None
    critical_only: bool = False


class FreezeOut(BaseModel):
    id: str
    team: str
    state: str
    starts_at: datetime
    ends_at: datetime
    reason: str
    critical_only: bool
    set_by: str
    lifted_by: str | None


class ApprovalIn(BaseModel):
    """Let ``team`` use the template (a lead of the template's team, or an admin)."""

    model_config = ConfigDict(extra="forbid")

    team: str = Field(min_length=1, max_length=200)


class TemplateOut(BaseModel):
    name: str
    version: int
    team: str
    fields: dict[str, Any]
    created_by: str
    created_at: datetime
    comment: str | None
    restored_from: int | None
    approved_for: list[str]


class AuditEventOut(BaseModel):
    at: datetime
    kind: str
    subject: str
    actor: str
    reason: str | None
    before: Any = None
    after: Any = None
    data: dict[str, Any]
