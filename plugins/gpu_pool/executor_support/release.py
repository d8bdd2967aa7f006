"""Giving a GPU task's GPUs back the moment its remote job ends, billed to that moment.

The remote job's monitor writes when the job ended (``ended``, by the node's clock; see
:mod:`gpu_pool.remote.job`). Whoever watches the job — the trigger in the triggerer, or the
same loop inside the task process when the operator does not defer — sees the end within a
tenth of a second and calls :func:`release_ended_job`: the request's allocations end at that
time, with the job's outcome and metrics in their ledger rows. The executor's own release
when the task instance ends comes later and finds nothing left to do (releases are
idempotent); it stays as the backstop for a watcher that could not reach the store.

``ended_at`` is trusted only between the allocation's start and now: a node clock ahead or
behind never bills a negative or future time.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from gpu_pool.model import Outcome, Policy

SECTION = "gpu_pool"


def store_from_airflow(*, create: bool = True) -> Any:
    """The store the executor uses: ``[gpu_pool] store_url``, else the usual resolution
    (``GPU_POOL_DB_URL``, the Airflow connection ``gpu_pool_db``, the SQLite default).
    ``create=False`` (a watcher releasing GPUs) refuses to make one where none exists."""
    from airflow.configuration import conf

    from gpu_pool.store import Store, resolve_db_url

    return Store.from_url(resolve_db_url(conf.get(SECTION, "store_url", fallback=None)),
                          create=create)


def billed_end(ended_at: float | None, started: datetime, now: datetime) -> datetime:
    """The end to bill: the node's ``ended_at`` kept between the start and now."""
    if ended_at is None:
        return now
    return min(max(datetime.fromtimestamp(ended_at, UTC), started), now)


def release_ended_job(store: Any, request: str, outcome: Outcome, ended_at: float | None,
                      metrics: Mapping[str, float] | None = None, *,
                      now: datetime | None = None, policy: Policy | None = None
                      ) -> datetime | None:
    """End ``request``'s active allocations at the job's end; returns that time, or None
    when nothing was active (already released, preempted or reclaimed)."""
    active = [a for a in store.allocations_of(request) if a.state.value == "active"]
    if not active:
        return None
    end = billed_end(ended_at, max(a.started_at for a in active), now or datetime.now(UTC))
    entries = store.release_request(
        request, outcome, actor=f"remote-job@{socket.gethostname()}",
        reason=f"remote job ended ({outcome.value})", now=end, policy=policy or Policy(),
        metrics=metrics)
    return end if entries else None
