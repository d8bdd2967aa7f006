"""Lending consents in the store: which teams may borrow a team's idle guaranteed GPUs.

Terms
-----
consent
    One ``team_lending`` row per team that set one: ``lend_to`` NULL (every team) or a JSON
    list of team names (``[]``: nobody), ``limit_gpus`` NULL (no cap) or the most GPUs it
    lends at once. A team without a row lends to every team without limit (the default
    :class:`~gpu_pool.model.Lending`); revoking a consent deletes the row (back to default).

Invariants: every change writes a ``lending.set`` or ``lending.revoked`` event in its
transaction, naming who allowed whom and the value it replaced; the lender and every
borrower named are known teams (else :class:`~gpu_pool.errors.SpecError`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from gpu_pool import limits
from gpu_pool.errors import SpecError
from gpu_pool.model import Lending
from gpu_pool.store import events
from gpu_pool.store.codec import db_time, py_time
from gpu_pool.store.fleet import team_names


def lending_from_row(r: Mapping[str, Any]) -> Lending:
    to = None if r["lend_to"] is None else frozenset(json.loads(r["lend_to"]))
    cap = None if r["limit_gpus"] is None else float(r["limit_gpus"])
    return Lending(r["team"], to, cap, set_by=r["set_by"], set_at=py_time(r["set_at"]))


def summary(lending: Lending | None) -> dict[str, Any] | None:
    """A consent as event data (None: no record, the default)."""
    if lending is None:
        return None
    return {"to": None if lending.to is None else sorted(lending.to),
            "limit_gpus": lending.limit_gpus}


def describe(lending: Lending | None) -> str:
    """In words: 'every team', 'nobody', 'nlp, speech', with the limit."""
    if lending is None or lending.to is None:
        who = "every team"
    else:
        who = ", ".join(sorted(lending.to)) or "nobody"
    if lending is not None and lending.limit_gpus is not None and (lending.to is None
                                                                   or lending.to):
        who += f", at most {lending.limit_gpus:g} GPUs at once"
    return who


def _check(conn: Connection, lending: Lending) -> None:
    teams = team_names(conn)
    hint = "a known team: " + (", ".join(teams) or "none yet (create one with "
                               "`gpu-pool team add`)")
    if lending.team not in teams:
        raise SpecError("team", lending.team, hint)
    for name in sorted(lending.to or ()):
        if name not in teams:
            raise SpecError("to", name, hint)
        if name == lending.team:
            raise SpecError("to", name, f"teams other than {lending.team} itself")
    cap = lending.limit_gpus
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int | float)
                            or not 0 <= cap <= limits.MAX_QUOTA_GPUS):
        raise SpecError("limit", cap, f"a number of GPUs from 0 to {limits.MAX_QUOTA_GPUS:,}")


def get(conn: Connection, team: str) -> Lending | None:
    row = conn.execute(text("SELECT * FROM team_lending WHERE team = :t"),
                       {"t": team}).mappings().first()
    return None if row is None else lending_from_row(row)


def list_lending(conn: Connection) -> list[Lending]:
    rows = conn.execute(text("SELECT * FROM team_lending ORDER BY team")).mappings()
    return [lending_from_row(r) for r in rows]


def set_lending(conn: Connection, lending: Lending, actor: str, now: datetime) -> Lending:
    """Record ``lending`` as its team's consent (replacing any), with its event."""
    _check(conn, lending)
    before = get(conn, lending.team)
    params = {"team": lending.team,
              "to": None if lending.to is None else json.dumps(sorted(lending.to)),
              "cap": lending.limit_gpus, "by": actor, "at": db_time(now)}
    if before is None:
        conn.execute(text("INSERT INTO team_lending (team, lend_to, limit_gpus, set_by, set_at) "
                          "VALUES (:team, :to, :cap, :by, :at)"), params)
    else:
        conn.execute(text("UPDATE team_lending SET lend_to = :to, limit_gpus = :cap, "
                          "set_by = :by, set_at = :at WHERE team = :team"), params)
    saved = get(conn, lending.team)
    assert saved is not None
    events.record(conn, now, "team", lending.team, "lending.set", actor,
                  f"team {lending.team} lends to {describe(saved)}",
                  {"before": summary(before), "after": summary(saved)})
    return saved


def revoke_lending(conn: Connection, team: str, actor: str, now: datetime) -> Lending | None:
    """Back to the default (every team, no limit); the consent it replaced, or None."""
    if team not in team_names(conn):
        raise SpecError("team", team, "a known team: " + ", ".join(team_names(conn)))
    before = get(conn, team)
    if before is None:
        return None
    conn.execute(text("DELETE FROM team_lending WHERE team = :t"), {"t": team})
    events.record(conn, now, "team", team, "lending.revoked", actor,
                  f"team {team} lends to every team again (default)",
                  {"before": summary(before), "after": None})
    return before
