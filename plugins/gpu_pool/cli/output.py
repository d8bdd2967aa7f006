"""Printing results: human tables by default, JSON for machines.

``emit(args, rows, columns)`` prints either a fixed-width table of ``columns`` or, with
``--json``, the rows as a JSON list. Values are rendered by :func:`plain`, which knows the
domain's enums, datetimes and durations, so tables and JSON say the same thing.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TextIO


def plain(value: Any) -> Any:
    """A JSON-friendly rendering of a domain value."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, frozenset | set):
        return sorted(plain(v) for v in value)
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return value


def human(value: Any) -> str:
    """A short cell for a table."""
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    if isinstance(value, timedelta):
        return format_duration(value)
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, frozenset | set | tuple | list):
        return ",".join(str(human(v)) for v in sorted(value, key=str)) or "-"
    if isinstance(value, enum.Enum):
        return str(value.value)
    return str(value)


def format_duration(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{sign}{days}d{hours}h"
    if hours:
        return f"{sign}{hours}h{minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"


def table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str], out: TextIO) -> None:
    cells = [[human(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    out.write("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()
              + "\n")
    for r in cells:
        out.write("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() + "\n")


def emit(as_json: bool, rows: Sequence[Mapping[str, Any]], columns: Sequence[str], *,
         empty: str = "nothing to show", out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if as_json:
        out.write(json.dumps([plain(r) for r in rows], indent=2) + "\n")
    elif rows:
        table(rows, columns, out)
    else:
        out.write(empty + "\n")


def emit_object(as_json: bool, obj: Mapping[str, Any], *, out: TextIO | None = None) -> None:
    out = out or sys.stdout
    if as_json:
        out.write(json.dumps(plain(obj), indent=2) + "\n")
    else:
        width = max((len(k) for k in obj), default=0)
        for key, value in obj.items():
            out.write(f"{key.ljust(width)}  {human(value)}\n")
