"""The sharing policy's versions: every document ever set, who set it, when and why.

Terms
-----
version
    1, 2, 3 ... one row of ``policy_versions`` per document set; the latest is the policy
    in force, and a store without any is on the defaults (``Policy()``, version 0).
restore
    A new version whose document is an older version's (``restored_from`` names it):
    history only grows.
source of a value
    The oldest version from which, without a break, the latest document sets that key to
    the value in force (``None``: the key is left out, the default applies).

Invariants: a document is validated (:func:`gpu_pool.policy_file.parse_policy`) before any
write; a document that would not change the policy in force is refused; the version row
and its ``policy.set`` event (the unified diff from the previous version in its data) are
written in one transaction. Rows are never updated.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from gpu_pool.errors import SpecError
from gpu_pool.model import Policy
from gpu_pool.policy_file import KEYS, load_document, parse_policy, policy_values
from gpu_pool.store import events
from gpu_pool.store.codec import db_time, py_time

SUBJECT = "policy"
# Sources are traced back at most this many versions (a history of years stays cheap).
SOURCE_DEPTH = 200


@dataclass(frozen=True)
class PolicyVersion:
    version: int
    document: str
    actor: str
    created_at: datetime
    comment: str | None = None
    restored_from: int | None = None

    @property
    def label(self) -> str:
        """``v3 by alice at 2026-12-01 12:00 UTC``: how a value's source is shown."""
        return f"v{self.version} by {self.actor} at {self.created_at:%Y-%m-%d %H:%M} UTC"


def _row(r: Any) -> PolicyVersion:
    return PolicyVersion(version=int(r["version"]), document=r["document"], actor=r["actor"],
                         created_at=py_time(r["created_at"]), comment=r["comment"],
                         restored_from=r["restored_from"])


def latest(conn: Connection) -> PolicyVersion | None:
    row = conn.execute(text("SELECT * FROM policy_versions ORDER BY version DESC LIMIT 1")
                       ).mappings().first()
    return None if row is None else _row(row)


def latest_number(conn: Connection) -> int:
    return int(conn.execute(text("SELECT COALESCE(MAX(version), 0) FROM policy_versions")
                            ).scalar_one())


def get(conn: Connection, version: int) -> PolicyVersion | None:
    row = conn.execute(text("SELECT * FROM policy_versions WHERE version = :v"),
                       {"v": int(version)}).mappings().first()
    return None if row is None else _row(row)


def history(conn: Connection, limit: int | None = None) -> list[PolicyVersion]:
    """Versions oldest first; with ``limit``, the latest ``limit`` of them."""
    sql = "SELECT * FROM policy_versions ORDER BY version DESC"
    params: dict[str, Any] = {}
    if limit is not None:
        sql += " LIMIT :limit"
        params["limit"] = int(limit)
    return [_row(r) for r in reversed(conn.execute(text(sql), params).mappings().all())]


def policy_of(version: PolicyVersion | None) -> Policy:
    return Policy() if version is None else parse_policy(version.document,
                                                         f"policy v{version.version}")


def unified_diff(old: str, new: str, old_label: str, new_label: str) -> str:
    return "".join(difflib.unified_diff(old.splitlines(keepends=True),
                                        new.splitlines(keepends=True), old_label, new_label))


def diff_counts(diff: str) -> tuple[int, int]:
    """(+ lines, - lines) of a unified diff, headers left out."""
    lines = diff.splitlines()
    added = sum(1 for line in lines if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in lines if line.startswith("-") and not line.startswith("---"))
    return added, removed


def save(conn: Connection, document: str, actor: str, now: datetime, comment: str | None,
         restored_from: int | None = None) -> int:
    """Record ``document`` (already validated by the caller) as the next version."""
    new_policy = parse_policy(document)
    previous = latest(conn)
    try:
        unchanged = previous is not None and policy_of(previous) == new_policy
    except SpecError:  # an old document a stricter release refuses: anything valid replaces it
        unchanged = False
    if previous is None and new_policy == Policy():
        unchanged = True
    if unchanged:
        now_in_force = "the defaults" if previous is None else f"v{previous.version}"
        raise SpecError("policy", "an unchanged policy", "a document that changes the policy "
                        f"in force ({now_in_force} says the same)")
    number = (previous.version if previous is not None else 0) + 1
    conn.execute(
        text("INSERT INTO policy_versions (version, document, actor, created_at, comment, "
             "restored_from) VALUES (:v, :d, :a, :at, :c, :r)"),
        {"v": number, "d": document, "a": actor, "at": db_time(now), "c": comment,
         "r": restored_from})
    diff = unified_diff(previous.document if previous is not None else "", document,
                        f"v{number - 1}", f"v{number}")
    pairs = [(k, (a, b)) for k, (a, b) in _pairs(policy_values(_safe_policy(previous)),
                                                 policy_values(new_policy)) if a != b]
    changed = [k for k, _ in pairs]
    reason = comment or (f"restored v{restored_from}" if restored_from else None)
    events.record(conn, now, SUBJECT, SUBJECT, "policy.set", actor, reason,
                  {"version": number, "restored_from": restored_from, "changed": changed,
                   "diff": diff, "before": {k: a for k, (a, _) in pairs},
                   "after": {k: b for k, (_, b) in pairs}})
    return number


def _safe_policy(version: PolicyVersion | None) -> Policy:
    try:
        return policy_of(version)
    except SpecError:
        return Policy()


def _pairs(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, tuple[Any, Any]]]:
    return [(k, (old[k], new[k])) for k in KEYS]


def sources(conn: Connection) -> tuple[PolicyVersion | None, dict[str, PolicyVersion | None]]:
    """The latest version and, per key, the version its value in force comes from."""
    versions = history(conn, SOURCE_DEPTH)
    if not versions:
        return None, dict.fromkeys(KEYS)
    parsed = []
    for v in versions:
        try:
            parsed.append((load_document(v.document), policy_values(policy_of(v))))
        except SpecError:
            parsed.append(({}, {}))
    data, values = parsed[-1]
    out: dict[str, PolicyVersion | None] = {}
    for key in KEYS:
        if key not in data:
            out[key] = None
            continue
        source = versions[-1]
        for v, (older_data, older_values) in zip(reversed(versions[:-1]),
                                                 reversed(parsed[:-1]), strict=True):
            if key not in older_data or older_values.get(key) != values[key]:
                break
            source = v
        out[key] = source
    return versions[-1], out
