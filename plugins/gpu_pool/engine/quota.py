"""Quota groups: which quota a placement draws on, how much of it is left.

Terms
-----
group
    ``(team, purpose, model)`` or ``(team, purpose, None)`` for an any-model quota. Its
    limit is its GUARANTEE: the sum over the quotas of that key active at ``now`` of
    ``gpus``, in milli. ``borrow_limit_gpus`` is not part of the limit: it bounds what the
    group may borrow beyond it (:mod:`gpu_pool.engine.borrow`, preemptible work only).
usage
    An active allocation with ``borrowed_from`` set (borrowed capacity) counts against its
    group's borrowing (``borrowed_milli``) and against its lender's lending (``lent_milli``,
    ``""`` for capacity no guarantee covers), never against a guarantee; every other active
    allocation counts against its group's guarantee (``used_milli``).
resolution
    A part on a node of model ``m`` draws on the model-specific group ``(t, p, m)`` when an
    active quota of that key exists, else on the any-model group ``(t, p, None)``.
    With no quotas in the snapshot at all, the fleet is open: nothing is limited.
    Otherwise a request whose team and purpose match no active quota gets nothing:
    ``EXPIRED`` if a matching quota exists but is not valid at ``now`` (expired or not yet
    started), else ``NO_QUOTA``.
off-peak lending
    With ``policy.lend_idle_off_peak`` and ``now`` in ``policy.off_peak``, batch-class or
    preemptible requests may exceed their group's limit (never a missing or expired one).

lending consent
    ``consents`` holds the :class:`~gpu_pool.model.Lending` records of the snapshot; a team
    without one lends to every team without limit (:meth:`QuotaBook.consent`).

Invariant: usage is derived from the active allocations on every build, never stored.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from gpu_pool.model import (
    MILLI_PER_GPU,
    Allocation,
    Lending,
    Policy,
    PriorityClass,
    Purpose,
    Quota,
    Request,
)

UNLIMITED = -1
NO_QUOTA = -2
EXPIRED = -3

GroupKey = tuple[str, Purpose, str | None]


@dataclass(frozen=True)
class QuotaBook:
    """Limits and usage per group; ``remaining`` is a fresh array per call of :meth:`start`."""

    open_fleet: bool
    keys: tuple[GroupKey, ...]
    limit_milli: np.ndarray
    used_milli: np.ndarray
    inactive: frozenset[tuple[str, Purpose, str | None]]
    lending: bool  # off-peak lending is on now (see the module docstring)
    # Per group: the most it may borrow beyond its guarantee, and what it borrows now.
    borrow_limit_milli: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    borrowed_milli: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # Per lender team ("" : capacity no guarantee covers): GPUs lent out now, in milli.
    lent_milli: Mapping[str, int] = field(default_factory=dict)
    consents: Mapping[str, Lending] = field(default_factory=dict)

    @classmethod
    def build(cls, quotas: Sequence[Quota], allocations: Sequence[Allocation],
              policy: Policy, now: datetime, lending: Sequence[Lending] = ()) -> QuotaBook:
        off_peak = policy.lend_idle_off_peak and policy.off_peak.contains(now)
        limits: dict[GroupKey, int] = {}
        borrow: dict[GroupKey, int] = {}
        inactive: set[GroupKey] = set()
        for q in quotas:
            key = (q.team, q.purpose, q.gpu_model)
            if q.active_at(now):
                limits[key] = limits.get(key, 0) + round(q.gpus * MILLI_PER_GPU)
                borrow[key] = borrow.get(key, 0) + round(q.borrow_limit_gpus * MILLI_PER_GPU)
            else:
                inactive.add(key)
        keys = tuple(sorted(limits, key=lambda k: (k[0], k[1].value, k[2] or "")))
        lent: dict[str, int] = {}
        book = cls(
            open_fleet=not quotas,
            keys=keys,
            limit_milli=np.array([limits[k] for k in keys], dtype=np.int64),
            used_milli=np.zeros(len(keys), dtype=np.int64),
            inactive=frozenset(inactive),
            lending=off_peak,
            borrow_limit_milli=np.array([borrow[k] for k in keys], dtype=np.int64),
            borrowed_milli=np.zeros(len(keys), dtype=np.int64),
            lent_milli=lent,
            consents={c.team: c for c in lending},
        )
        index = {k: i for i, k in enumerate(keys)}
        for a in allocations:
            g = book._resolve(index, a.team, a.purpose, a.gpu_model)
            if a.borrowed_from is not None:
                lent[a.borrowed_from] = lent.get(a.borrowed_from, 0) + a.gpu_milli_total
                if g >= 0:
                    book.borrowed_milli[g] += a.gpu_milli_total
            elif g >= 0:
                book.used_milli[g] += a.gpu_milli_total
        return book

    def quota_parts(self, allocations: Sequence[Allocation]) -> tuple[tuple[int, int], ...]:
        """(group, milli) that ``allocations`` count against within guarantees (borrowed
        ones count against borrowing, not here): what their end gives back."""
        index = {k: i for i, k in enumerate(self.keys)}
        out = []
        for a in allocations:
            if a.borrowed_from is None:
                g = self._resolve(index, a.team, a.purpose, a.gpu_model)
                if g >= 0:
                    out.append((g, a.gpu_milli_total))
        return tuple(out)

    def consent(self, lender: str) -> Lending:
        """The lender's consent on record, or the default: every team, no limit."""
        return self.consents.get(lender) or Lending(lender)

    def teams(self) -> tuple[str, ...]:
        """Teams with a live guarantee, sorted."""
        return tuple(sorted({k[0] for k in self.keys}))

    def _resolve(self, index: dict[GroupKey, int], team: str, purpose: Purpose,
                 model: str | None) -> int:
        if self.open_fleet:
            return UNLIMITED
        for key in ((team, purpose, model), (team, purpose, None)):
            if key in index:
                return index[key]
        if (team, purpose, model) in self.inactive or (team, purpose, None) in self.inactive:
            return EXPIRED
        return NO_QUOTA

    def may_lend(self, request: Request) -> bool:
        """Whether off-peak lending lets ``request`` go beyond its quota now (the caller
        may narrow this further, e.g. to work that ends before the peak)."""
        return self.lending and (request.priority is PriorityClass.BATCH or request.preemptible)

    def group_of(self, request: Request, model: str | None, lent: bool | None = None) -> int:
        """Group index a part of ``request`` on ``model`` draws on, or a negative code.

        Lent requests (``lent``, by default :meth:`may_lend`) return :data:`UNLIMITED` when
        they resolve to a live group.
        """
        index = {k: i for i, k in enumerate(self.keys)}
        g = self._resolve(index, request.team, request.purpose, model)
        if g >= 0 and (self.may_lend(request) if lent is None else lent):
            return UNLIMITED
        return g

    def groups_by_row(self, request: Request, models: Sequence[str | None],
                      lent: bool | None = None) -> np.ndarray:
        """:meth:`group_of` for every row of a layout (one lookup per distinct model)."""
        if self.open_fleet:
            return np.full(len(models), UNLIMITED, dtype=np.int64)
        per_model = {m: self.group_of(request, m, lent) for m in set(models)}
        return np.array([per_model[m] for m in models], dtype=np.int64)

    def remaining(self) -> np.ndarray:
        return self.limit_milli - self.used_milli

    def describe(self, group: int) -> str:
        team, purpose, model = self.keys[group]
        return f"team {team} {purpose.value} quota on {model or 'any model'}"
