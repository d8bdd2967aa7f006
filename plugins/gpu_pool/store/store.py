"""The :class:`Store`: the one object callers hold to read and change the gpu-pool database.

Terms
-----
read transaction
    A short transaction that only reads (REPEATABLE READ on PostgreSQL, so a snapshot is
    one consistent picture; a deferred ``BEGIN`` on SQLite).
write transaction
    ``BEGIN IMMEDIATE`` on SQLite (writers queue on the busy timeout instead of failing
    on lock upgrade); READ COMMITTED on PostgreSQL, where guarded writes and the guard
    triggers keep it correct.

Invariants
----------
* Every public method runs in its own transaction(s) and returns domain objects from
  :mod:`gpu_pool.model` (or :class:`~gpu_pool.store.events.Event`,
  :class:`~gpu_pool.store.apply.ApplyResult`), never rows.
* Heavy work (planning) happens outside: :meth:`load_snapshot` reads, the engine plans,
  :meth:`apply_plan` writes.
* A server that cannot be reached, or a schema older than ``sql/``, raises
  :class:`~gpu_pool.errors.StoreError` with the URL (password hidden) and what to do;
  bad input raises :class:`~gpu_pool.errors.SpecError`; an unknown name raises
  :class:`~gpu_pool.errors.NotFoundError`. No driver traceback leaves this class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError, SQLAlchemyError

from gpu_pool import limits
from gpu_pool.errors import ConflictError, NotFoundError, SpecError, StoreError
from gpu_pool.model import (
    Allocation,
    LedgerEntry,
    Lending,
    Node,
    NodeState,
    Outcome,
    Policy,
    Quota,
    Request,
    RequestState,
    Team,
)
from gpu_pool.store import (
    allocations,
    apply,
    events,
    fleet,
    governance,
    jobs,
    ledger,
    lending,
    migrate,
    quotas,
    requests,
)
from gpu_pool.store import policy as policy_versions
from gpu_pool.store.checks import enum_value
from gpu_pool.store.connection import WRITE_OPTION, display_url, make_engine, sqlite_path

if TYPE_CHECKING:  # the engine (OR-Tools, numpy) costs seconds to import; types only
    from gpu_pool.engine.types import Plan, Snapshot

Clock = Callable[[], datetime]


def utcnow() -> datetime:
    return datetime.now(UTC)


class Store:
    """The gpu-pool store over one SQLAlchemy engine (see the module docstring)."""

    def __init__(self, engine: Engine, url: str, *, clock: Clock = utcnow,
                 serialize_apply: bool = True) -> None:
        self.engine = engine
        self.url = url
        self.clock = clock
        # Off only in tests that prove the database guard holds without the advisory lock.
        self.serialize_apply = serialize_apply
        self._schema_ok = False

    @classmethod
    def from_url(cls, url: str, *, create: bool = True, **kwargs: Any) -> Store:
        """Connect (checking the server answers); the schema is checked on first use.

        ``create=False`` refuses a URL where no store exists yet — a SQLite file that is
        not there, a database without gpu-pool's schema — with a :class:`SpecError` that
        says how to create one; nothing is created. ``create=True`` makes a SQLite file's
        folder when it is missing.
        """
        where = display_url(url)
        make = ("an existing gpu-pool store; create one with "
                f"`gpu-pool --db {where} db migrate`")
        sqlite_file = sqlite_path(url)
        if sqlite_file is not None:
            if not create and not sqlite_file.is_file():
                raise SpecError("db", where, f"{make} (no file {sqlite_file})")
            if create:
                try:
                    sqlite_file.parent.mkdir(parents=True, exist_ok=True)
                except OSError as error:
                    raise StoreError(f"store at {where}: cannot create its folder "
                                     f"({error.strerror or error})") from None
        engine = make_engine(url)
        store = cls(engine, url, **kwargs)
        try:
            with engine.connect() as conn, conn.begin():
                conn.execute(text("SELECT 1"))
                if not create and migrate.applied_versions(conn) is None:
                    raise SpecError("db", where, f"{make} (the database has no gpu-pool "
                                    "schema)")
        except SQLAlchemyError as error:
            engine.dispose()
            raise store._unreachable(error) from None
        except SpecError:
            engine.dispose()
            raise
        return store

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- transactions -------------------------------------------------------------------

    def _unreachable(self, error: BaseException) -> StoreError:
        orig = getattr(error, "orig", None) or error
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        return StoreError(f"store at {display_url(self.url)}: cannot reach it ({first})")

    @contextmanager
    def _tx(self, write: bool, *, check_schema: bool = True) -> Iterator[Connection]:
        try:
            with self.engine.connect() as conn:
                if write:
                    conn.execution_options(**{WRITE_OPTION: True})
                elif self.dialect == "postgresql":
                    conn.execution_options(isolation_level="REPEATABLE READ")
                if check_schema and not self._schema_ok:
                    self._check_schema(conn)
                with conn.begin():
                    yield conn
        except IntegrityError as error:
            raise _conflict(f"store at {display_url(self.url)}: refused a write that would "
                            "break an invariant", error) from None
        except DBAPIError as error:
            if _pgcode(error) in _LOST_RACE_CODES:
                raise _conflict(f"store at {display_url(self.url)}: lost a race with another "
                                "writer", error) from None
            if error.connection_invalidated or _is_connection_error(error):
                raise self._unreachable(error) from None
            raise StoreError(f"store at {display_url(self.url)}: {_first_line(error)}") from None

    def _check_schema(self, conn: Connection) -> None:
        with conn.begin():
            missing = migrate.missing_versions(conn)
        if missing:
            raise StoreError(f"store at {display_url(self.url)}: not migrated (missing "
                             f"{', '.join(missing)}); run `gpu-pool db migrate`")
        self._schema_ok = True

    def _read(self) -> Any:
        return self._tx(False)

    def _write(self) -> Any:
        return self._tx(True)

    # -- schema -------------------------------------------------------------------------

    def migrate(self) -> list[str]:
        """Apply every ``sql/`` version not applied yet; returns those applied now."""
        try:
            applied = migrate.migrate(self.engine)
        except DBAPIError as error:
            raise self._unreachable(error) from None
        self._schema_ok = True
        return applied

    # -- teams and nodes ----------------------------------------------------------------

    def upsert_team(self, team: Team, actor: str) -> Team:
        with self._write() as conn:
            return fleet.upsert_team(conn, team, actor, self.clock())

    def list_teams(self) -> list[Team]:
        with self._read() as conn:
            return fleet.list_teams(conn)

    def import_nodes(self, nodes: list[Node], actor: str, replace: bool = False) -> None:
        with self._write() as conn:
            # A node labelled team=<team> is that team's: frozen with it.
            old = {n.name: n for n in fleet.list_nodes(conn)}
            teams = sorted({t for n in nodes for t in (
                n.labels.get("team"), getattr(old.get(n.name), "labels", {}).get("team")) if t})
            governance.check_not_frozen(conn, teams, self.clock(), "changing its nodes")
            fleet.import_nodes(conn, list(nodes), actor, replace, self.clock())

    def list_nodes(self) -> list[Node]:
        with self._read() as conn:
            return fleet.list_nodes(conn)

    def get_node(self, name: str) -> Node | None:
        with self._read() as conn:
            return fleet.get_node(conn, name)

    def set_node_state(self, name: str, state: NodeState, actor: str,
                       reason: str | None = None) -> bool:
        """Drain, undrain or down a node; False when it was already in ``state``."""
        state = enum_value(state, NodeState, "state")
        with self._write() as conn:
            return fleet.change_node_state(conn, name, state, actor, reason, self.clock())

    def record_gpu_readings(self, node: str, readings: Iterable[Any], at: datetime,
                            actor: str = "probe") -> int:
        with self._write() as conn:
            return fleet.record_gpu_readings(conn, node, readings, at, actor)

    # -- quotas -------------------------------------------------------------------------

    def set_quota(self, quota: Quota, actor: str) -> Quota:
        with self._write() as conn:
            return quotas.set_quota(conn, quota, actor, self.clock())

    def set_quotas(self, items: Sequence[Quota], actor: str
                   ) -> list[tuple[Quota, Quota | None]]:
        """Set every quota in one transaction (all or none); for each, (saved, the quota it
        replaced or None)."""
        done = []
        with self._write() as conn:
            for quota in items:
                before = quotas.replaced_quota(conn, quota)
                done.append((quotas.set_quota(conn, quota, actor, self.clock()), before))
        return done

    def list_quotas(self) -> list[Quota]:
        with self._read() as conn:
            return quotas.list_quotas(conn)

    def quota_usage(self, now: datetime) -> dict[str, float]:
        with self._read() as conn:
            return quotas.quota_usage(conn, now)

    # -- lending ------------------------------------------------------------------------

    def set_lending(self, consent: Lending, actor: str) -> Lending:
        """Record a team's lending consent (replacing its earlier one), with its event."""
        with self._write() as conn:
            return lending.set_lending(conn, consent, actor, self.clock())

    def lending(self) -> list[Lending]:
        """The consents on record, by team (a team without one lends to every team)."""
        with self._read() as conn:
            return lending.list_lending(conn)

    def revoke_lending(self, team: str, actor: str) -> Lending | None:
        """Back to the default (every team, no limit); the consent revoked, or None."""
        with self._write() as conn:
            return lending.revoke_lending(conn, team, actor, self.clock())

    # -- requests -----------------------------------------------------------------------

    def submit_request(self, request: Request, actor: str, now: datetime | None = None, *,
                       external: Mapping[str, Any] | None = None,
                       policy: Policy | None = None, **link: Any) -> Request:
        """Record a pending request. ``external`` (or the same keys given directly, as the
        executor does: dag_id, task_id, run_id, map_index, try_number, executor_key) links
        it to its Airflow task instance."""
        linked = requests.check_external({**dict(external or {}), **link})
        with self._write() as conn:
            return requests.submit_request(conn, request, actor, now or self.clock(), linked,
                                           policy)

    def submit_requests(self, items: Sequence[Request], actor: str,
                        now: datetime | None = None) -> list[Request]:
        """Record several pending requests in one transaction: all of them, or none."""
        unlinked = requests.check_external({})
        with self._write() as conn:
            at = now or self.clock()
            return [requests.submit_request(conn, r, actor, at, unlinked, None) for r in items]

    def get_request(self, name: str) -> Request | None:
        with self._read() as conn:
            return requests.get_request(conn, name)

    def request_state(self, name: str) -> RequestState | None:
        with self._read() as conn:
            return requests.request_state(conn, name)

    def finished_outcomes(self, names: Iterable[str]) -> dict[str, Outcome]:
        """For those of ``names`` that finished: the outcome their allocations ended with."""
        with self._read() as conn:
            return requests.finished_outcomes(conn, names)

    def request_external(self, name: str) -> dict[str, Any] | None:
        """The Airflow task instance fields a request was submitted with."""
        with self._read() as conn:
            row = conn.execute(text("SELECT * FROM requests WHERE name = :n"),
                               {"n": name}).mappings().first()
        return None if row is None else {k: row[k] for k in requests.EXTERNAL_FIELDS}

    def request_reason(self, name: str) -> tuple[str, str] | None:
        """(code, message) the last plan gave for a pending request, if any."""
        with self._read() as conn:
            row = conn.execute(text("SELECT reason_code, reason_message FROM requests "
                                    "WHERE name = :n"), {"n": name}).first()
        return None if row is None or row[0] is None else (row[0], row[1])

    def estimated_start(self, name: str) -> datetime | None:
        """When the last placement cycle expects pending request ``name`` to start."""
        with self._read() as conn:
            return requests.estimated_start(conn, name)

    def pending_requests(self) -> list[Request]:
        with self._read() as conn:
            return requests.pending_requests(conn)

    def cancel_request(self, name: str, actor: str, reason: str | None = None,
                       now: datetime | None = None,
                       policy: Policy | None = None) -> list[LedgerEntry]:
        """Cancel a pending or running request (a running one's GPUs are released)."""
        return self.release_request(name, Outcome.CANCELLED, actor, reason, now, policy)

    def set_data_ready(self, name: str, ready: bool, actor: str) -> bool:
        with self._write() as conn:
            return requests.set_data_ready(conn, name, ready, actor, self.clock())

    def release_request(self, name: str, outcome: Outcome, actor: str,
                        reason: str | None = None, now: datetime | None = None,
                        policy: Policy | None = None,
                        metrics: Mapping[str, float] | None = None) -> list[LedgerEntry]:
        """End a request and its allocations; idempotent (a second call returns [])."""
        outcome = enum_value(outcome, Outcome, "outcome")
        with self._write() as conn:
            return requests.release_request(conn, name, outcome, actor, reason,
                                            now or self.clock(), policy or Policy(), metrics)

    # -- placement ----------------------------------------------------------------------

    def load_snapshot(self, policy: Policy, now: datetime) -> Snapshot:
        """Nodes, active allocations, pending requests, quotas and each team's decayed
        use (fair share, :mod:`gpu_pool.store.usage`), read in one transaction."""
        from gpu_pool.engine.types import Snapshot
        from gpu_pool.store import usage

        with self._read() as conn:
            counts = allocations.preemption_counts(conn)
            active = tuple(a if not counts.get(a.request_name) else replace(
                a, preemptions=counts[a.request_name])
                for a in allocations.active_allocations(conn))
            pending = [r if not counts.get(r.name) else replace(
                r, preemptions=counts[r.name]) for r in requests.pending_requests(conn)]
            return Snapshot(
                nodes=tuple(fleet.list_nodes(conn)),
                allocations=active,
                requests=tuple(pending),
                quotas=tuple(quotas.list_quotas(conn)),
                policy=policy,
                now=now,
                team_usage=usage.team_usage(conn, active, now, policy.fair_share_half_life),
                lending=tuple(lending.list_lending(conn)),
                runtime_ratios=allocations.runtime_ratios(conn) if policy.start_estimates
                else (),
            )

    def apply_plan(self, plan: Plan, now: datetime, actor: str,
                   policy: Policy | None = None) -> apply.ApplyResult:
        """Apply ``plan`` with guarded writes; lost races are dropped, not raised."""
        return apply.apply_plan(self._write, plan, now, actor, policy or Policy(),
                                serialize=self.serialize_apply)

    def active_allocations(self) -> list[Allocation]:
        with self._read() as conn:
            return allocations.active_allocations(conn)

    def allocations_of(self, name: str) -> list[Allocation]:
        with self._read() as conn:
            return allocations.allocations_of(conn, name)

    # -- books --------------------------------------------------------------------------

    def ledger(self, since: datetime | None = None,
               until: datetime | None = None) -> list[LedgerEntry]:
        with self._read() as conn:
            return ledger.read(conn, since, until)

    def team_usage(self, now: datetime, half_life: timedelta) -> dict[str, float]:
        """Each team's decayed GPU-hours at ``now`` (fair share, :mod:`.usage`)."""
        from gpu_pool.store import usage

        with self._read() as conn:
            active = allocations.active_allocations(conn)
            return usage.team_usage(conn, active, now, half_life)

    def events(self, since: datetime | None = None, subject: str | None = None,
               limit: int | None = None) -> list[events.Event]:
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise SpecError("limit", limit, "a whole number of events, 1 or more")
        with self._read() as conn:
            return events.read(conn, since, subject, limit)


    # -- governance (gpu_pool.store.governance) -----------------------------------------

    def add_member(self, team: str, username: str, actor: str,
                   role: str = "member") -> governance.Member:
        with self._write() as conn:
            return governance.add_member(conn, team, username, role, actor, self.clock())

    def remove_member(self, team: str, username: str, actor: str) -> governance.Member:
        with self._write() as conn:
            return governance.remove_member(conn, team, username, actor, self.clock())

    def members(self, team: str | None = None) -> list[governance.Member]:
        with self._read() as conn:
            return governance.members(conn, team)

    def is_lead(self, team: str, username: str) -> bool:
        with self._read() as conn:
            return governance.is_lead(conn, team, username)

    def check_charge(self, team: str, people: Iterable[str], *,
                     require_membership: bool = False) -> None:
        """Refuse (SpecError) to charge ``team`` unless one of ``people`` is its member."""
        with self._read() as conn:
            governance.check_charge(conn, team, list(people),
                                    require_membership=require_membership)

    def set_freeze(self, team: str, until: datetime, reason: str, actor: str, *,
                   starts_at: datetime | None = None,
                   critical_only: bool = False) -> governance.Freeze:
        now = self.clock()
        with self._write() as conn:
            return governance.set_freeze(conn, team, starts_at or now, until, reason,
                                         critical_only, actor, now)

    def lift_freeze(self, freeze_id: str, actor: str) -> governance.Freeze:
        with self._write() as conn:
            return governance.lift_freeze(conn, freeze_id, actor, self.clock())

    def critical_only_freezes(self, now: datetime) -> dict[str, governance.Freeze]:
        """Team -> its active critical-only freeze: only its critical work starts."""
        with self._read() as conn:
            return governance.critical_only_freezes(conn, now)

    def get_freeze(self, freeze_id: str) -> governance.Freeze:
        with self._read() as conn:
            return governance.get_freeze(conn, freeze_id)

    def freezes(self, team: str | None = None) -> list[governance.Freeze]:
        """Every freeze (a freeze that ended by itself gets its ``freeze.ended`` event)."""
        with self._write() as conn:
            governance.record_ended(conn, self.clock())
            return governance.list_freezes(conn, team)

    def save_template(self, name: str, fields: Mapping[str, Any], actor: str, *,
                      team: str | None = None,
                      comment: str | None = None) -> governance.Template:
        with self._write() as conn:
            return governance.save_template(conn, name, team, fields, actor, self.clock(),
                                            comment)

    def template(self, name: str, version: int | None = None) -> governance.Template:
        with self._read() as conn:
            return governance.get_template(conn, name, version)

    def templates(self) -> list[governance.Template]:
        with self._read() as conn:
            return governance.list_templates(conn)

    def template_history(self, name: str) -> list[governance.Template]:
        with self._read() as conn:
            governance.get_template(conn, name)  # NotFoundError for an unknown name
            return governance.template_history(conn, name)

    def restore_template(self, name: str, version: int, actor: str,
                         comment: str | None = None) -> governance.Template:
        with self._write() as conn:
            return governance.restore_template(conn, name, version, actor, self.clock(),
                                               comment)

    def approve_template(self, name: str, team: str, actor: str) -> bool:
        with self._write() as conn:
            return governance.approve_template(conn, name, team, actor, self.clock())

    def template_for(self, name: str, team: str) -> governance.Template:
        with self._read() as conn:
            return governance.template_for(conn, name, team)

    def audit(self, *, team: str | None = None, kind: str | None = None,
              actor: str | None = None, since: datetime | None = None,
              until: datetime | None = None, limit: int | None = None) -> list[events.Event]:
        """Change events (not the placement traffic), oldest first, filtered."""
        with self._read() as conn:
            return events.audit(conn, team=team, kind=kind, actor=actor, since=since,
                                until=until, limit=limit)


    # -- the sharing policy (gpu_pool.store.policy) --------------------------------------

    def load_policy(self) -> Policy:
        """The policy in force: the latest version's, or ``Policy()`` when none was set."""
        with self._read() as conn:
            return policy_versions.policy_of(policy_versions.latest(conn))

    def policy_version(self) -> int:
        """The latest version's number; 0 while the defaults are in force."""
        with self._read() as conn:
            return policy_versions.latest_number(conn)

    def set_policy(self, document: str, actor: str, comment: str | None = None, *,
                   restored_from: int | None = None) -> int:
        """Record ``document`` as the next version (validated first; an unchanged policy is
        refused); returns its number."""
        from gpu_pool.policy_file import check_document
        from gpu_pool.spec import parse_text

        check_document(document)
        actor = parse_text(actor, "actor")
        if comment is not None:
            comment = parse_text(comment, "comment")
        with self._write() as conn:
            return policy_versions.save(conn, document, actor, self.clock(), comment,
                                        restored_from)

    def policy_history(self, limit: int | None = None) -> list[policy_versions.PolicyVersion]:
        with self._read() as conn:
            return policy_versions.history(conn, limit)

    def policy_document(self, version: int) -> str:
        """The document of ``version`` (0: the defaults, an empty document)."""
        return self._policy_version_row(version).document if version else ""

    def restore_policy(self, version: int, actor: str, comment: str | None = None) -> int:
        """A new version whose document is ``version``'s."""
        old = self._policy_version_row(version)
        return self.set_policy(old.document, actor, comment, restored_from=old.version)

    def policy_sources(self) -> tuple[policy_versions.PolicyVersion | None,
                                      dict[str, policy_versions.PolicyVersion | None]]:
        """The latest version and, per policy key, the version its value comes from
        (None: the default)."""
        with self._read() as conn:
            return policy_versions.sources(conn)

    def _policy_version_row(self, version: int) -> policy_versions.PolicyVersion:
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise SpecError("version", version, "a policy version number, 1 or more")
        with self._read() as conn:
            row = policy_versions.get(conn, version)
            known = [f"v{v.version}" for v in policy_versions.history(conn, 20)]
        if row is None:
            raise NotFoundError("policy version", f"v{version}", known)
        return row

    # -- remote jobs (see :mod:`gpu_pool.store.jobs`) ----------------------------------------

    def record_jobs(self, request_name: str, specs: Sequence[Mapping[str, str]],
                    grace_s: float | None = None) -> str | None:
        """Record a task's remote jobs; the stop reason if its GPUs are already gone."""
        with self._write() as conn:
            return jobs.record_jobs(conn, request_name, specs, grace_s, self.clock())

    def jobs_of(self, request_name: str) -> list[jobs.JobRecord]:
        with self._read() as conn:
            return jobs.jobs_of(conn, request_name)

    def stops_due(self, limit: int = 100) -> list[jobs.JobRecord]:
        with self._read() as conn:
            return jobs.stops_due(conn, limit)

    def mark_stop_sent(self, job_ids: Iterable[str]) -> int:
        with self._write() as conn:
            return jobs.mark_stop_sent(conn, job_ids, self.clock())

    def jobs_stopping_on(self, node: str, gpu_indices: Sequence[int],
                         within: timedelta = limits.MAX_GRACE + timedelta(minutes=10)
                         ) -> list[jobs.JobRecord]:
        """Jobs on ``node`` preempted off any of ``gpu_indices`` in the last ``within``
        (:func:`gpu_pool.store.jobs.stopping_on`)."""
        with self._read() as conn:
            return jobs.stopping_on(conn, node, gpu_indices, self.clock() - within)

    def preemption_notes(self) -> dict[str, str]:
        """Pending requests whose jobs were preempted: who preempted them, and why."""
        with self._read() as conn:
            return jobs.preemption_notes(conn)

def _conflict(message: str, error: BaseException) -> ConflictError:
    """A ConflictError whose ``detail`` is the database's own one-line reason."""
    conflict = ConflictError(f"{message} ({_first_line(error)})")
    conflict.detail = _first_line(error)
    return conflict


def _first_line(error: BaseException) -> str:
    orig = getattr(error, "orig", None) or error
    return (str(orig).strip().splitlines() or [type(orig).__name__])[0]


# PostgreSQL: serialization failure, deadlock detected, lock not available.
_LOST_RACE_CODES = ("40001", "40P01", "55P03")


def _pgcode(error: DBAPIError) -> str | None:
    return getattr(getattr(error, "orig", None), "pgcode", None)


def _is_connection_error(error: DBAPIError) -> bool:
    orig = getattr(error, "orig", None)
    return type(orig).__name__ in ("OperationalError", "InterfaceError") and (
        "connect" in str(orig).lower() or "server closed" in str(orig).lower())
