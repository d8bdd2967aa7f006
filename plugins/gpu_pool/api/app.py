"""The gpu-pool FastAPI app: the REST API under ``/api`` and the fleet page at ``/``.

Airflow's api-server mounts it at ``/gpu-pool`` (see :mod:`gpu_pool.plugin`). Every API
endpoint requires an authenticated Airflow user (``requires_authenticated()``: a Bearer
token or the ``_token`` cookie of the Airflow UI); the two that change the fleet also need
:func:`gpu_pool.api.auth.require_fleet_admin`, and the store records who made each change in
its event rows. The page is static HTML/JS/CSS that calls the same API.

Errors: bad parameters and bodies are 422 with a ``detail`` sentence naming the parameter,
the value given and what is valid; an unknown name is 404; a lost write race 409; an
unreachable store 503. No traceback reaches the client.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from airflow.api_fastapi.core_api.security import get_user, requires_authenticated
from fastapi import Depends, FastAPI, HTTPException, Query, Request, status
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from gpu_pool.api import queries, views
from gpu_pool.api.auth import actor_name, can_admin, require_fleet_admin
from gpu_pool.api.schemas import (
    AllocationOut,
    ApprovalIn,
    AuditEventOut,
    EventOut,
    FleetOut,
    FreezeIn,
    FreezeOut,
    LedgerEntryOut,
    MemberIn,
    MemberOut,
    MeOut,
    NodeStateChange,
    NodeStateChanged,
    PlacementOut,
    PolicyOut,
    QueueOut,
    QuotaChange,
    QuotaOut,
    QuotasOut,
    TemplateOut,
    UsageOut,
)
from gpu_pool.errors import ConflictError, NotFoundError, SpecError, StoreError
from gpu_pool.model import NodeState, Policy
from gpu_pool.ops import crosszone
from gpu_pool.spec import as_utc, parse_name, parse_quota, parse_text
from gpu_pool.store import Store, resolve_db_url
from gpu_pool.store.codec import py_time

UI_DIR = Path(__file__).resolve().parent.parent / "ui"
CurrentUser = Annotated[Any, Depends(get_user)]
AdminUser = Annotated[Any, Depends(require_fleet_admin)]


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _aware(when: datetime | None, field: str) -> datetime | None:
    if when is None:
        return None
    return as_utc(when, field, "a time that stays within the years 1 to 9999 in UTC, like "
                  "'2026-12-31T18:00:00Z'")


def _validation_message(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
        where = ".".join(loc) or "body"
        given = err.get("input")
        shown = "" if isinstance(given, dict) or given is None else f"got {given!r}; "
        parts.append(f"{where}: {shown}{err.get('msg', 'invalid')}")
    return "; ".join(parts)


def create_app(store_factory: Callable[[], Store] | None = None,
               clock: Callable[[], datetime] = _utcnow, policy: Policy | None = None) -> FastAPI:
    """The app; the store is opened on first use (``resolve_db_url``: env, connection, file)."""
    app = FastAPI(title="gpu-pool", version="0.1.0",
                  description="The GPU fleet: nodes and GPUs, the queue with reasons, quotas, "
                              "allocations, the ledger and usage.")
    state: dict[str, Any] = {}

    def store() -> Store:
        if "store" not in state:
            state["store"] = (store_factory or (lambda: Store.from_url(resolve_db_url())))()
        return state["store"]

    def in_force() -> Policy:
        """``policy`` when one was given (tests), else the store's latest, read per request
        so a `gpu-pool policy set` shows at once."""
        return policy if policy is not None else store().load_policy()

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": _validation_message(exc)}, status_code=422)

    @app.exception_handler(SpecError)
    async def _spec(_: Request, exc: SpecError) -> JSONResponse:
        return JSONResponse({"detail": str(exc), "field": exc.field}, status_code=422)

    @app.exception_handler(NotFoundError)
    async def _missing(_: Request, exc: NotFoundError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=404)

    @app.exception_handler(ConflictError)
    async def _conflict(_: Request, exc: ConflictError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=409)

    @app.exception_handler(StoreError)
    async def _store_down(_: Request, exc: StoreError) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503)

    auth = [Depends(requires_authenticated())]

    def known_team(team: str | None, param: str = "team") -> None:
        if team is None:
            return
        teams = sorted(t.name for t in store().list_teams())
        if team not in teams:
            raise SpecError(param, team, "a known team: " + (", ".join(teams) or "none"))

    @app.get("/api/me", dependencies=auth, response_model=MeOut, tags=["meta"])
    def me(user: CurrentUser) -> MeOut:
        return MeOut(user=actor_name(user), can_admin=can_admin(user))

    @app.get("/api/fleet", dependencies=auth, response_model=FleetOut, tags=["fleet"])
    def get_fleet() -> FleetOut:
        return views.fleet(store(), clock(), policy)

    @app.get("/api/queue", dependencies=auth, response_model=QueueOut, tags=["queue"])
    def get_queue(team: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                  limit: Annotated[int | None, Query(ge=1, le=100_000)] = None) -> QueueOut:
        known_team(team)
        return views.queue(store(), clock(), team=team, limit=limit, policy=policy)

    @app.get("/api/quotas", dependencies=auth, response_model=QuotasOut, tags=["quotas"])
    def get_quotas() -> QuotasOut:
        return views.quotas(store(), in_force(), clock())

    @app.put("/api/quotas", response_model=QuotaOut, tags=["quotas"],
             dependencies=auth)
    def put_quota(change: QuotaChange, user: AdminUser) -> QuotaOut:
        now = clock()
        data = change.model_dump()
        data["valid_from"] = _aware(change.valid_from, "valid_from") or now
        data["expires_at"] = _aware(change.expires_at, "expires_at")
        s = store()
        current = in_force()
        quota = parse_quota(data, policy=current, known_teams={t.name for t in s.list_teams()})
        saved = s.set_quota(quota, actor=actor_name(user))
        return next(q for q in views.quotas(s, current, now).quotas if q.id == saved.id)

    @app.get("/api/policy", dependencies=auth, response_model=PolicyOut, tags=["meta"])
    def get_policy() -> PolicyOut:
        """The sharing policy in force: each value and its source, the version, the history."""
        return views.policy(store())

    @app.get("/api/allocations", dependencies=auth, response_model=list[AllocationOut],
             tags=["allocations"])
    def get_allocations(team: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                        node: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                        ) -> list[AllocationOut]:
        known_team(team)
        s = store()
        if node is not None and s.get_node(node) is None:
            raise NotFoundError("node", node, [n.name for n in s.list_nodes()])
        active = [a for a in s.active_allocations()
                  if (team is None or a.team == team) and (node is None or a.node == node)]
        links = views.request_links(s, [a.request_name for a in active])
        return [views.allocation_out(a, links) for a in active]

    @app.get("/api/ledger", dependencies=auth, response_model=list[LedgerEntryOut],
             tags=["ledger"])
    def get_ledger(since: datetime | None = None, until: datetime | None = None,
                   team: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                   ) -> list[LedgerEntryOut]:
        since, until = _aware(since, "since"), _aware(until, "until")
        if since and until and until <= since:
            raise SpecError("until", until.isoformat(),
                            f"a time after since ({since.isoformat()})")
        known_team(team)
        return [LedgerEntryOut(
            allocation_id=e.allocation_id, request=e.request_name, team=e.team,
            purpose=str(e.purpose), node=e.node, gpu_model=e.gpu_model, gpus=e.gpus,
            started_at=e.started_at, ended_at=e.ended_at, gpu_hours=round(e.gpu_hours, 4),
            cost=round(e.cost, 4), outcome=str(e.outcome), borrowed_from=e.borrowed_from,
            off_peak=e.off_peak, transfer_s=e.transfer_s,
            expected_wait_saved_s=crosszone.finite(e.expected_wait_saved_s))
            for e in store().ledger(since=since, until=until) if team in (None, e.team)]

    @app.get("/api/usage", dependencies=auth, response_model=UsageOut, tags=["ledger"])
    def get_usage(window: Literal["day", "week"] = "day") -> UsageOut:
        return views.usage(store(), in_force(), clock(), window)

    @app.get("/api/events", dependencies=auth, response_model=list[EventOut], tags=["meta"])
    def get_events(subject: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                   limit: Annotated[int, Query(ge=1, le=10_000)] = 200) -> list[EventOut]:
        return [EventOut(at=e.at, subject_kind=e.subject_kind, subject=e.subject, kind=e.kind,
                         actor=e.actor, reason=e.reason)
                for e in store().events(subject=subject, limit=limit)]

    @app.get("/api/placement", dependencies=auth, response_model=PlacementOut, tags=["queue"])
    def get_placement(request: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                      dag_id: Annotated[str | None, Query(min_length=1, max_length=250)] = None,
                      task_id: Annotated[str | None, Query(min_length=1, max_length=250)] = None,
                      run_id: Annotated[str | None, Query(min_length=1, max_length=250)] = None,
                      map_index: Annotated[int | None, Query(ge=-1, le=1_000_000)] = None,
                      ) -> PlacementOut:
        """Where a request (by name, or by its Airflow task instance) is placed, or why not."""
        s = store()
        if request is not None:
            rows = queries.request_rows(s.engine, names=[request])
            if not rows:
                raise NotFoundError("request", request)
            row = rows[0]
        elif dag_id is not None and task_id is not None:
            row = queries.request_by_task(s.engine, dag_id, task_id, run_id, map_index)
            if row is None:
                raise NotFoundError("GPU request of task", f"{dag_id}.{task_id}")
        else:
            raise SpecError("request", None, "a request name, or dag_id and task_id (with "
                            "run_id and map_index to pick one task instance)")
        links = {row["name"]: row}
        return PlacementOut(
            request=row["name"], team=row["team"], state=row["state"],
            reason_code=row["reason_code"], reason_message=row["reason_message"],
            estimated_start=py_time(row.get("estimated_start")) if row["state"] == "pending"
            else None,
            task=views.task_link(row),
            allocations=[views.allocation_out(a, links) for a in s.allocations_of(row["name"])
                         if str(a.state) == "active"])

    @app.post("/api/nodes/{name}/state", response_model=NodeStateChanged, tags=["fleet"],
              dependencies=auth)
    def post_node_state(name: str, change: NodeStateChange,
                        user: AdminUser) -> NodeStateChanged:
        who = actor_name(user)
        reason = None if change.reason is None else parse_text(change.reason, "reason")
        changed = store().set_node_state(parse_name(name), NodeState(change.state), actor=who,
                                         reason=reason)
        return NodeStateChanged(node=name, state=change.state, changed=changed, actor=who)

    # -- governance: members, freezes, templates, the audit --------------------------

    def require_lead_or_admin(user: Any, team: str, what: str) -> str:
        """The actor's name, if they lead ``team`` or may administer the fleet; else 403."""
        who = actor_name(user)
        if can_admin(user) or store().is_lead(team, who):
            return who
        raise HTTPException(status.HTTP_403_FORBIDDEN,
                            f"user {who!r} may not {what}: it takes a lead of team {team} or "
                            "a fleet admin (role op or admin under the SimpleAuthManager)")

    def freeze_out(f: Any) -> FreezeOut:
        return FreezeOut(id=f.id, team=f.team, state=f.state(clock()), starts_at=f.starts_at,
                         ends_at=f.ends_at, reason=f.reason, critical_only=f.critical_only,
                         set_by=f.set_by, lifted_by=f.lifted_by)

    def template_out(t: Any) -> TemplateOut:
        return TemplateOut(name=t.name, version=t.version, team=t.team, fields=dict(t.fields),
                           created_by=t.created_by, created_at=t.created_at, comment=t.comment,
                           restored_from=t.restored_from, approved_for=list(t.approved_for))

    @app.get("/api/teams/{team}/members", dependencies=auth, response_model=list[MemberOut],
             tags=["governance"])
    def get_members(team: str) -> list[MemberOut]:
        known_team(team)
        return [MemberOut(team=m.team, user=m.username, role=m.role, added_by=m.added_by,
                          added_at=m.added_at) for m in store().members(team)]

    @app.post("/api/teams/{team}/members", dependencies=auth, response_model=MemberOut,
              tags=["governance"])
    def post_member(team: str, member: MemberIn, user: AdminUser) -> MemberOut:
        m = store().add_member(team, member.user, actor_name(user), role=member.role)
        return MemberOut(team=m.team, user=m.username, role=m.role, added_by=m.added_by,
                         added_at=m.added_at)

    @app.get("/api/freezes", dependencies=auth, response_model=list[FreezeOut],
             tags=["governance"])
    def get_freezes(team: Annotated[str | None, Query(min_length=1, max_length=200)] = None
                    ) -> list[FreezeOut]:
        known_team(team)
        return [freeze_out(f) for f in store().freezes(team)]

    @app.post("/api/teams/{team}/freezes", dependencies=auth, response_model=FreezeOut,
              tags=["governance"])
    def post_freeze(team: str, freeze: FreezeIn, user: CurrentUser) -> FreezeOut:
        known_team(team)
        who = require_lead_or_admin(user, team, f"freeze team {team}")
        return freeze_out(store().set_freeze(team, _aware(freeze.until, "until"),
                                             freeze.reason, who,
                                             starts_at=_aware(freeze.starts_at, "starts_at"),
                                             critical_only=freeze.critical_only))

    @app.post("/api/freezes/{freeze_id}/lift", dependencies=auth, response_model=FreezeOut,
              tags=["governance"])
    def lift_freeze(freeze_id: str, user: CurrentUser) -> FreezeOut:
        s = store()
        team = s.get_freeze(freeze_id).team
        who = require_lead_or_admin(user, team, f"lift a freeze of team {team}")
        return freeze_out(s.lift_freeze(freeze_id, who))

    @app.get("/api/templates", dependencies=auth, response_model=list[TemplateOut],
             tags=["governance"])
    def get_templates() -> list[TemplateOut]:
        return [template_out(t) for t in store().templates()]

    @app.get("/api/templates/{name}/history", dependencies=auth,
             response_model=list[TemplateOut], tags=["governance"])
    def get_template_history(name: str) -> list[TemplateOut]:
        return [template_out(t) for t in store().template_history(name)]

    @app.post("/api/templates/{name}/approvals", dependencies=auth,
              response_model=TemplateOut, tags=["governance"])
    def post_approval(name: str, approval: ApprovalIn, user: CurrentUser) -> TemplateOut:
        s = store()
        owner = s.template(name).team
        who = require_lead_or_admin(user, owner, f"approve the use of template {name}")
        s.approve_template(name, approval.team, who)
        return template_out(s.template(name))

    @app.get("/api/audit", dependencies=auth, response_model=list[AuditEventOut],
             tags=["governance"])
    def get_audit(team: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                  kind: Annotated[str | None, Query(min_length=1, max_length=100)] = None,
                  actor: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
                  since: datetime | None = None, until: datetime | None = None,
                  limit: Annotated[int, Query(ge=1, le=10_000)] = 500) -> list[AuditEventOut]:
        """Every change — quota, node, template, approval, freeze, member, policy, lending:
        who, when, before, after."""
        known_team(team)
        found = store().audit(team=team, kind=kind, actor=actor, since=_aware(since, "since"),
                              until=_aware(until, "until"), limit=limit)
        return [AuditEventOut(at=e.at, kind=e.kind, subject=e.subject, actor=e.actor,
                              reason=e.reason, before=e.data.get("before"),
                              after=e.data.get("after"), data=dict(e.data)) for e in found]

    @app.get("/", include_in_schema=False)
    def page() -> FileResponse:
        return FileResponse(UI_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=UI_DIR), name="static")

    return app
