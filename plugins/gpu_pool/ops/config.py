"""Settings of the fleet chores, read from a mapping (the Airflow Variable ``gpu_pool_ops``,
a JSON object, or CLI flags) and validated at the boundary.

Keys (all optional)
-------------------
alert_days            days before a quota's expiry at which its team is warned ([15, 7, 1])
budget_alert_pcts     GPU-hour budget percentages that warn ([80, 90, 100])
expired_notice_days   a quota that lapsed less than this many days ago gets one "expired"
                      notice (7)
idle_util_pct         a GPU below this utilisation counts as idle (5.0)
idle_minutes          how long an allocation's GPUs must all stay idle to be flagged (60)
idle_action           ``warn`` (notify the team) or ``end`` (release the GPUs too) ("warn")
reclaim_grace_minutes allocations younger than this are never reclaimed: their task may not
                      have reached RUNNING yet (10)
catchup_max_periods   at most this many missed snapshot periods per run (400)
smtp_conn_id / s3_conn_id  Airflow connection ids ("gpu_pool_smtp" / "gpu_pool_s3")
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from gpu_pool.errors import SpecError

VARIABLE = "gpu_pool_ops"
IDLE_ACTIONS = ("warn", "end")


@dataclass(frozen=True)
class OpsConfig:
    alert_days: tuple[int, ...] = (15, 7, 1)
    budget_alert_pcts: tuple[int, ...] = (80, 90, 100)
    expired_notice_days: int = 7
    idle_util_pct: float = 5.0
    idle_minutes: int = 60
    idle_action: str = "warn"
    reclaim_grace_minutes: int = 10
    catchup_max_periods: int = 400
    smtp_conn_id: str = "gpu_pool_smtp"
    s3_conn_id: str = "gpu_pool_s3"

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any] | None) -> OpsConfig:
        raw = dict(raw or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise SpecError(f"{VARIABLE}.{unknown[0]}", raw[unknown[0]],
                            f"one of the keys {', '.join(sorted(known))}")
        values: dict[str, Any] = {}
        for name, top in (("alert_days", 3650), ("budget_alert_pcts", 1000)):
            if name in raw:
                values[name] = _positive_ints(name, raw[name], top)
        for name, low, top in (("expired_notice_days", 0, 3650), ("idle_minutes", 0, 525_600),
                               ("reclaim_grace_minutes", 0, 525_600),
                               ("catchup_max_periods", 1, 36_500)):
            if name in raw:
                values[name] = _int_in(name, raw[name], low, top)
        if "idle_util_pct" in raw:
            value = raw["idle_util_pct"]
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    0 <= value <= 100):
                raise SpecError(f"{VARIABLE}.idle_util_pct", value, "a number from 0 to 100")
            values["idle_util_pct"] = float(value)
        if "idle_action" in raw:
            if raw["idle_action"] not in IDLE_ACTIONS:
                raise SpecError(f"{VARIABLE}.idle_action", raw["idle_action"],
                                " or ".join(IDLE_ACTIONS))
            values["idle_action"] = raw["idle_action"]
        for name in ("smtp_conn_id", "s3_conn_id"):
            if name in raw:
                if not isinstance(raw[name], str) or not raw[name]:
                    raise SpecError(f"{VARIABLE}.{name}", raw[name], "an Airflow connection id")
                values[name] = raw[name]
        return cls(**values)

    @classmethod
    def from_json(cls, text: str | None) -> OpsConfig:
        if not text:
            return cls()
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            raise SpecError(VARIABLE, text, f"a JSON object ({error.msg})") from None
        except RecursionError:
            raise SpecError(VARIABLE, text, "a JSON object of plain settings") from None
        if not isinstance(raw, dict):
            raise SpecError(VARIABLE, raw, "a JSON object")
        return cls.from_mapping(raw)


def _positive_ints(name: str, value: Any, top: int) -> tuple[int, ...]:
    if not isinstance(value, list | tuple) or not value or len(value) > 100 or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 < v <= top for v in value):
        raise SpecError(f"{VARIABLE}.{name}", value,
                        f"a non-empty list of integers from 1 to {top:,}")
    return tuple(sorted(set(value), reverse=True))


def _int_in(name: str, value: Any, low: int, top: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= top:
        raise SpecError(f"{VARIABLE}.{name}", value, f"an integer from {low} to {top:,}")
    return value
