"""The gpu-pool store: the SQL database behind the scheduler (PostgreSQL or SQLite).

Public API: :func:`resolve_db_url` (where the store is), :class:`Store` (everything else),
:class:`ApplyResult` (what :meth:`Store.apply_plan` did) and :class:`Event` (one row of the
event log). Modules, one concern each: ``connection`` (URLs, engines), ``migrate`` (the
``sql/`` migrations), ``codec`` (rows to domain objects), ``checks`` (named-field refusals
of objects built in code), ``fleet`` (teams, nodes, GPUs), ``quotas``, ``requests``,
``allocations``, ``apply`` (plans), ``ledger``, ``events``, ``store`` (the facade).

Invariants the database itself enforces (see ``sql/002_guard.*.sql``): no GPU is held past
1000 milli by active allocations; a whole GPU is held by one active allocation at most;
the ledger is append-only. CPU and RAM per node are guarded by the apply step (under the
PostgreSQL advisory lock), not by a database constraint.
"""

from __future__ import annotations

from gpu_pool.store.apply import ApplyResult
from gpu_pool.store.connection import display_url, resolve_db_url
from gpu_pool.store.events import Event
from gpu_pool.store.store import Store

__all__ = ["ApplyResult", "Event", "Store", "display_url", "resolve_db_url"]
