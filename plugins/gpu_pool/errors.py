"""Errors that reach users.

Every refusal of bad input is a :class:`SpecError`: it names the field, the bad value and
what would be valid, so a CLI, a DAG import error or an HTTP 4xx can show it as it is.
Callers at the boundary (CLI, REST API, decorators) catch :class:`GpuPoolError` and print
``str(error)``; no traceback ever reaches the user.
"""

from __future__ import annotations

from typing import Any


class GpuPoolError(Exception):
    """Base class of every error gpu-pool raises on purpose."""


class SpecError(GpuPoolError, ValueError):
    """Bad input: names the field, the value given and what would be valid."""

    def __init__(self, field: str, value: Any, expected: str, *, where: str | None = None) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        self.where = where
        super().__init__(self.message)

    @property
    def message(self) -> str:
        prefix = f"{self.where}: " if self.where else ""
        return f"{prefix}{self.field}: got {shown(self.value)}; expected {self.expected}"

    def located(self, where: str) -> SpecError:
        """The same error, prefixed with where it happened (a file line, a task id)."""
        return SpecError(self.field, self.value, self.expected, where=where)


SHOWN_CHARS = 60


def shown(value: Any) -> str:
    """``repr(value)`` for a one-line message: escaped (no newline, no raw control or
    undecodable character gets through) and shortened when long, saying how long it was."""
    if isinstance(value, str | bytes) and len(value) > SHOWN_CHARS:
        unit = "characters" if isinstance(value, str) else "bytes"
        return f"{value[:SHOWN_CHARS]!r}... ({len(value):,} {unit})"
    text = repr(value)
    if len(text) > 2 * SHOWN_CHARS:
        return f"{text[:2 * SHOWN_CHARS]}... ({len(text):,} characters)"
    return text


class NotFoundError(GpuPoolError, LookupError):
    """A named thing (node, team, request) does not exist in the store."""

    def __init__(self, kind: str, name: str, known: list[str] | None = None) -> None:
        self.kind = kind
        self.name = name
        hint = ""
        if known is not None:
            listed = ", ".join(sorted(known)[:20]) or "none"
            hint = f"; known {kind}s: {listed}"
        super().__init__(f"no {kind} named {shown(name)}{hint}")


class ConflictError(GpuPoolError):
    """A write lost a race or would break an invariant the store guards (double allocation)."""


class StoreError(GpuPoolError):
    """The store cannot be reached or its schema is not what this version expects."""
