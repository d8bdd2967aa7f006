"""The sharing policy as a document the operator writes, reads back and versions.

Terms
-----
policy document
    A YAML mapping (or an already-loaded mapping) whose keys are the fields of
    :class:`~gpu_pool.model.Policy`. A key left out keeps its default: an empty document is
    ``Policy()``. Durations are ``"90s"``, ``"10m"``, ``"2h"``, ``"7d"`` (combinations like
    ``"1h30m"`` too) or a number of seconds; those that can be switched off take ``0``.
key path
    Where a value sits in the document, dotted with list positions:
    ``off_peak.windows[1].start``. Every refusal names one.
source
    Where a value in force comes from: ``default`` (the key is not in the document) or
    ``document`` (the store says which version, :mod:`gpu_pool.store.policy`).

Rules and invariants
--------------------
* Unknown keys, wrong types and values past :mod:`gpu_pool.limits` are refused with a
  :class:`~gpu_pool.errors.SpecError` naming the key path, the value and what is valid;
  time zones are checked with :mod:`zoneinfo`; weights fall strictly from critical to batch;
  a headroom rule's GPU model is one the policy knows.
* Never a half-valid policy: every key is parsed first, then :class:`Policy` is built once.
* ``parse_policy(dump_policy(p)) == p`` for every policy ``p`` this module can produce
  (the round trip is exact; ``full=False`` writes only the keys that differ from defaults).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import yaml

from gpu_pool import limits
from gpu_pool.errors import SpecError
from gpu_pool.model import (
    DEFAULT_PRIORITY_WEIGHTS,
    GpuModelInfo,
    Headroom,
    OffPeak,
    OffPeakWindow,
    Policy,
    PriorityClass,
)
from gpu_pool.spec import (
    parse_bool,
    parse_duration,
    parse_int,
    parse_memory_mib,
    parse_name,
    parse_number,
    parse_yaml,
)

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_DAY_NAMES = {name: i for i, name in enumerate(DAYS)} | {
    full: i for i, full in enumerate(("monday", "tuesday", "wednesday", "thursday", "friday",
                                      "saturday", "sunday"))}
_DAYS_HINT = "days like [mon, tue] or ranges like 'mon-fri' (mon, tue, wed, thu, fri, sat, sun)"
_HOUR = re.compile(r"^\s*(\d{1,2})(?::(\d{2}))?\s*$")
_HOUR_HINT = ("a whole hour of the day like '20:00' or '08:00' (00:00 to 23:00; quote it in "
              "YAML)")
_ZERO = re.compile(r"^0+(?:\.0+)?[smhd]?$")
_WINDOW_KEYS = ("start", "end", "days")
_OFF_PEAK_KEYS = ("timezone", "windows")
_HEADROOM_KEYS = ("gpus", "gpu_model", "node_group")
_LINK_KEYS = ("from", "to", "mb_per_s")
_MODEL_KEYS = ("name", "memory_gib", "memory_mib", "price_per_gpu_hour")


# -- small parsers ----------------------------------------------------------------------


def _mapping(value: Any, key: str, known: Sequence[str]) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SpecError(key, value, "a mapping with the keys " + ", ".join(known))
    for name in value:
        if name not in known:
            raise SpecError(f"{key}.{name}" if key else str(name), value[name],
                            "one of the keys " + ", ".join(known))
    return value


def _list(value: Any, key: str, what: str) -> list[Any]:
    if not isinstance(value, list | tuple):
        raise SpecError(key, value, f"a list of {what}")
    if len(value) > limits.MAX_POLICY_ENTRIES:
        raise SpecError(key, f"{len(value)} entries",
                        f"a list of at most {limits.MAX_POLICY_ENTRIES:,} {what}")
    return list(value)


def _required(entry: Mapping[str, Any], name: str, key: str, expected: str) -> Any:
    if entry.get(name) is None:
        raise SpecError(f"{key}.{name}", None, expected)
    return entry[name]


def _duration(value: Any, key: str, *, zero_ok: bool) -> timedelta:
    if zero_ok:
        if isinstance(value, timedelta) and value == timedelta(0):
            return timedelta(0)
        if isinstance(value, int | float) and not isinstance(value, bool) and value == 0:
            return timedelta(0)
        if isinstance(value, str) and _ZERO.match(value.strip().lower()):
            return timedelta(0)
    try:
        return parse_duration(value, key)
    except SpecError as error:
        if not zero_ok:
            raise
        raise SpecError(key, value, "0 (off) or " + error.expected) from None


def _seconds(value: Any, key: str) -> float:
    if isinstance(value, str):
        return parse_duration(value, key).total_seconds()
    return parse_number(value, key, minimum=0.0, strict=True,
                        maximum=limits.MAX_DURATION.total_seconds())


def _hour(value: Any, key: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        # YAML 1.1 reads an unquoted 20:00 as the base-60 number 1200.
        text = str(value // 60 if value > 23 and value % 60 == 0 else value)
    elif isinstance(value, str):
        text = value
    else:
        raise SpecError(key, value, _HOUR_HINT)
    match = _HOUR.match(text)
    if not match or int(match[1]) > 23 or (match[2] is not None and match[2] != "00"):
        raise SpecError(key, value, _HOUR_HINT)
    return int(match[1])


def _days(value: Any, key: str) -> frozenset[int]:
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items:
        raise SpecError(key, value, _DAYS_HINT)
    days: set[int] = set()
    for i, item in enumerate(items):
        text = str(item).strip().lower() if isinstance(item, str) else None
        first, _, last = (text or "").partition("-")
        if text is None or first not in _DAY_NAMES or (last and last not in _DAY_NAMES):
            raise SpecError(f"{key}[{i}]", item, _DAYS_HINT)
        a, b = _DAY_NAMES[first], _DAY_NAMES[last or first]
        days.update(range(a, b + 1) if a <= b else (*range(a, 7), *range(0, b + 1)))
    return frozenset(days)


def _timezone(value: Any, key: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    expected = "an IANA time zone like 'Europe/Berlin', 'America/New_York' or 'UTC'"
    if not isinstance(value, str) or not value.strip() or len(value) > 100:
        raise SpecError(key, value, expected)
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise SpecError(key, value, expected) from None
    return value


def _int_list(value: Any, key: str, top: int, what: str) -> tuple[int, ...]:
    out: list[int] = []
    for i, item in enumerate(_list(value, key, what)):
        number = parse_int(item, f"{key}[{i}]", minimum=1, maximum=top)
        if number in out:
            raise SpecError(f"{key}[{i}]", item, f"{what} listed once each")
        out.append(number)
    return tuple(out)


# -- one parser per key -------------------------------------------------------------------


def _priority_weights(value: Any, key: str) -> dict[PriorityClass, int]:
    classes = [c.value for c in PriorityClass]
    given = _mapping(value, key, classes)
    weights = dict(DEFAULT_PRIORITY_WEIGHTS)
    for name, weight in given.items():
        weights[PriorityClass(name)] = parse_int(weight, f"{key}.{name}", minimum=1,
                                                 maximum=limits.MAX_PRIORITY_WEIGHT)
    ordered = list(PriorityClass)
    for above, below in zip(ordered, ordered[1:], strict=False):
        if weights[below] >= weights[above]:
            raise SpecError(f"{key}.{below.value}", weights[below],
                            f"a weight below {above.value}'s {weights[above]:,} (weights "
                            "fall strictly from critical to batch)")
    return weights


def _headroom(value: Any, key: str) -> tuple[Headroom, ...]:
    rules = []
    for i, entry in enumerate(_list(value, key, "headroom rules")):
        at = f"{key}[{i}]"
        entry = _mapping(entry, at, _HEADROOM_KEYS)
        gpus = parse_int(_required(entry, "gpus", at, "whole GPUs kept free"), f"{at}.gpus",
                         minimum=1, maximum=limits.MAX_QUOTA_GPUS)
        model = entry.get("gpu_model")
        group = entry.get("node_group")
        rules.append(Headroom(
            gpus=gpus,
            gpu_model=None if model is None else parse_name(model, f"{at}.gpu_model"),
            node_group=None if group is None else parse_name(group, f"{at}.node_group")))
    return tuple(rules)


def _off_peak(value: Any, key: str) -> OffPeak:
    given = _mapping(value, key, _OFF_PEAK_KEYS)
    default = OffPeak()
    timezone = default.timezone
    if given.get("timezone") is not None:
        timezone = _timezone(given["timezone"], f"{key}.timezone")
    windows = default.windows
    if "windows" in given:
        windows = tuple(_window(entry, f"{key}.windows[{i}]") for i, entry in
                        enumerate(_list(given["windows"], f"{key}.windows", "windows")))
    return OffPeak(windows=windows, timezone=timezone)


def _window(entry: Any, at: str) -> OffPeakWindow:
    entry = _mapping(entry, at, _WINDOW_KEYS)
    start = _hour(_required(entry, "start", at, _HOUR_HINT), f"{at}.start")
    end = _hour(_required(entry, "end", at, _HOUR_HINT), f"{at}.end")
    days = frozenset(range(7)) if entry.get("days") is None else _days(entry["days"],
                                                                        f"{at}.days")
    return OffPeakWindow(start_hour=start, end_hour=end, days=days)


def _zone_links(value: Any, key: str) -> dict[tuple[str, str], float]:
    links: dict[tuple[str, str], float] = {}
    for i, entry in enumerate(_list(value, key, "zone links")):
        at = f"{key}[{i}]"
        entry = _mapping(entry, at, _LINK_KEYS)
        source = parse_name(_required(entry, "from", at, "a zone name"), f"{at}.from")
        target = parse_name(_required(entry, "to", at, "a zone name"), f"{at}.to")
        if source == target:
            raise SpecError(f"{at}.to", target, "a zone other than 'from' (within a zone the "
                            "node's own bandwidth_mb_s applies)")
        if (source, target) in links:
            raise SpecError(at, f"{source} -> {target}", "each zone pair listed once")
        links[(source, target)] = parse_number(
            _required(entry, "mb_per_s", at, "megabytes per second"), f"{at}.mb_per_s",
            minimum=0.0, strict=True, maximum=limits.MAX_BANDWIDTH_MB_S)
    return links


def _gpu_models(value: Any, key: str) -> tuple[GpuModelInfo, ...]:
    models: list[GpuModelInfo] = []
    memory_hint = "the model's memory: memory_gib (like 80) or memory_mib (like 81920)"
    for i, entry in enumerate(_list(value, key, "GPU models")):
        at = f"{key}[{i}]"
        entry = _mapping(entry, at, _MODEL_KEYS)
        name = parse_name(_required(entry, "name", at, "a GPU model name like 'H100'"),
                          f"{at}.name")
        if any(m.name.upper() == name.upper() for m in models):
            raise SpecError(f"{at}.name", name, "each GPU model listed once")
        if ("memory_gib" in entry) == ("memory_mib" in entry):
            raise SpecError(at, name, "exactly one of " + memory_hint)
        if "memory_gib" in entry:
            gib = parse_number(entry["memory_gib"], f"{at}.memory_gib", minimum=0.0,
                               strict=True, maximum=limits.MAX_MEMORY_MIB / 1024)
            mib = int(round(gib * 1024))
        else:
            mib = parse_memory_mib(entry["memory_mib"], f"{at}.memory_mib")
        if mib <= 0:
            raise SpecError(f"{at}.memory_mib", entry.get("memory_mib", entry.get(
                "memory_gib")), "more than 0 MiB")
        price = parse_number(entry.get("price_per_gpu_hour", 0.0), f"{at}.price_per_gpu_hour",
                             maximum=limits.MAX_GPU_PRICE)
        models.append(GpuModelInfo(name, mib, price))
    if not models:
        raise SpecError(key, value, "a list of at least one GPU model")
    return tuple(models)


def _int_in(low: int, top: int) -> Callable[[Any, str], int]:
    return lambda value, key: parse_int(value, key, minimum=low, maximum=top)


def _number_in(top: float, *, strict: bool = False, below: bool = False
               ) -> Callable[[Any, str], float]:
    def parse(value: Any, key: str) -> float:
        number = parse_number(value, key, minimum=0.0, strict=strict, maximum=top)
        if below and number >= top:
            raise SpecError(key, value, f"a share from 0 up to, not including, {top:g}")
        return number
    return parse


def _duration_key(*, zero_ok: bool) -> Callable[[Any, str], timedelta]:
    return lambda value, key: _duration(value, key, zero_ok=zero_ok)


PARSERS: dict[str, Callable[[Any, str], Any]] = {
    "priority_weights": _priority_weights,
    "critical_headroom_gpus": _int_in(0, limits.MAX_QUOTA_GPUS),
    "headroom": _headroom,
    "off_peak": _off_peak,
    "lend_idle_off_peak": parse_bool,
    "off_peak_notice": _duration_key(zero_ok=True),
    "borrowing": parse_bool,
    "reclaim_guarantees": parse_bool,
    "critical_borrows": parse_bool,
    "critical_preempts_borrowers": parse_bool,
    "preemption_grace": _duration_key(zero_ok=True),
    "min_runtime_before_preemption": _duration_key(zero_ok=True),
    "max_preemptions_per_task": _int_in(0, limits.MAX_PREEMPTIONS_PER_TASK),
    "max_transfer_seconds": _seconds,
    "cross_zone_margin": _number_in(limits.MAX_CROSS_ZONE_MARGIN),
    "zone_links": _zone_links,
    "aging_half_life": _duration_key(zero_ok=True),
    "fair_share_half_life": _duration_key(zero_ok=True),
    "alert_days": lambda v, k: _int_list(v, k, limits.MAX_DURATION.days, "days"),
    "budget_alert_pcts": lambda v, k: _int_list(v, k, limits.MAX_BUDGET_ALERT_PCT,
                                                "percentages"),
    "gpu_models": _gpu_models,
    "solver_time_limit_s": _number_in(limits.MAX_SOLVER_SECONDS, strict=True),
    "solver_workers": _int_in(1, limits.MAX_SOLVER_WORKERS),
    "solver_seed": _int_in(0, limits.MAX_SOLVER_SEED),
    "solver_relative_gap": _number_in(1.0, below=True),
    "reserve_after": _duration_key(zero_ok=True),
    "max_reservations": _int_in(0, limits.MAX_RESERVATIONS),
    "start_estimates": _int_in(0, limits.MAX_START_ESTIMATES),
}
KEYS = tuple(PARSERS)


# -- documents ----------------------------------------------------------------------------


def load_document(document: str | Mapping[str, Any] | None, source: str = "policy"
                  ) -> dict[str, Any]:
    """The mapping of a policy document (YAML text or a mapping); ``None`` or an empty
    text is the empty document. Only the top-level shape is checked here."""
    data = parse_yaml(document, source) if isinstance(document, str) else document
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise SpecError("policy", type(data).__name__, "a mapping of policy keys ("
                        + ", ".join(KEYS) + ")", where=source)
    return dict(data)


def parse_policy(document: str | Mapping[str, Any] | None, source: str = "policy") -> Policy:
    """The :class:`Policy` a document describes (defaults for the keys it leaves out)."""
    data = load_document(document, source)
    values: dict[str, Any] = {}
    try:
        for key, value in data.items():
            if key not in PARSERS:
                raise SpecError(str(key), value, "one of the policy keys " + ", ".join(KEYS))
            values[key] = PARSERS[key](value, key)
        known = {m.name for m in values.get("gpu_models", Policy().gpu_models)}
        for i, rule in enumerate(values.get("headroom", ())):
            if rule.gpu_model is not None and rule.gpu_model not in known:
                raise SpecError(f"headroom[{i}].gpu_model", rule.gpu_model,
                                "a GPU model of gpu_models: " + ", ".join(sorted(known)))
        return Policy(**values)
    except SpecError as error:
        raise error.located(source) if source != "policy" and error.where is None \
            else error from None


def check_document(text: str, source: str = "policy") -> Policy:
    """``text`` parsed, after a size check (the same bound as every input file)."""
    if len(text.encode("utf-8", "surrogatepass")) > limits.MAX_INPUT_FILE_BYTES:
        raise SpecError("policy", f"{len(text):,} characters", "a document of at most 64 MiB",
                        where=source)
    return parse_policy(text, source)


def format_duration(delta: timedelta) -> str:
    """The shortest exact text of a duration: ``"7d"``, ``"2h"``, ``"90s"``, ``"0s"``."""
    if delta == timedelta(0):
        return "0s"
    if delta.microseconds:
        return f"{delta.total_seconds():.6f}".rstrip("0") + "s"
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _hour_text(hour: int) -> str:
    return f"{hour:02d}:00"


def _model_entry(info: GpuModelInfo) -> dict[str, Any]:
    memory = ({"memory_gib": info.memory_mib // 1024} if info.memory_mib % 1024 == 0
              else {"memory_mib": info.memory_mib})
    return {"name": info.name, **memory, "price_per_gpu_hour": float(info.price_per_gpu_hour)}


def plain_value(key: str, value: Any) -> Any:
    """``value`` of policy key ``key`` as it is written in a document."""
    if isinstance(value, timedelta):
        return format_duration(value)
    if key == "priority_weights":
        return {PriorityClass(c).value: int(w) for c, w in
                sorted(value.items(), key=lambda item: PriorityClass(item[0]).rank)}
    if key == "headroom":
        return [{k: v for k, v in (("gpus", h.gpus), ("gpu_model", h.gpu_model),
                                   ("node_group", h.node_group)) if v is not None}
                for h in value]
    if key == "off_peak":
        return {"timezone": value.timezone, "windows": [
            {"start": _hour_text(w.start_hour), "end": _hour_text(w.end_hour),
             "days": [DAYS[d] for d in sorted(w.days)]} for w in value.windows]}
    if key == "zone_links":
        return [{"from": a, "to": b, "mb_per_s": float(v)} for (a, b), v in value.items()]
    if key == "gpu_models":
        return [_model_entry(m) for m in value]
    if isinstance(value, tuple):
        return list(value)
    return value


def policy_values(policy: Policy) -> dict[str, Any]:
    """Every key of ``policy`` as a document writes it."""
    return {key: plain_value(key, getattr(policy, key)) for key in KEYS}


def dump_policy(policy: Policy, *, full: bool = False) -> str:
    """A YAML document for ``policy``: the keys that differ from the defaults (every key
    with ``full``). ``parse_policy`` of it gives ``policy`` back."""
    values = policy_values(policy)
    if not full:
        defaults = policy_values(Policy())
        values = {k: v for k, v in values.items() if v != defaults[k]}
    if not values:
        return "{}\n"
    return yaml.safe_dump(values, sort_keys=False, default_flow_style=False,
                          allow_unicode=True)


@dataclass(frozen=True)
class Setting:
    """One value in force: its key, its value as written, and where it comes from."""

    key: str
    value: Any
    source: str  # "default" or the document's source (a version, a file)

    @property
    def is_default(self) -> bool:
        return self.source == "default"


def explain(document: str | Mapping[str, Any] | None, source: str = "document"
            ) -> list[Setting]:
    """Every value the document puts in force, each with its source: ``default`` for a key
    the document leaves out, ``source`` for one it sets."""
    data = load_document(document)
    values = policy_values(parse_policy(data))
    return [Setting(key, values[key], source if key in data else "default") for key in KEYS]


def merge_assignments(document: str | Mapping[str, Any] | None,
                      assignments: Sequence[str]) -> dict[str, Any]:
    """The document with ``key=value`` assignments applied (``value`` read as YAML, so
    ``headroom=[{gpus: 2}]`` works; ``off_peak.timezone=UTC`` sets one nested key). The
    result is validated by the caller, as a whole."""
    data = load_document(document)
    for text in assignments:
        key, sep, raw = text.partition("=")
        path = key.strip().split(".")
        if not sep or not all(path):
            raise SpecError("assignment", text, "key=value, like headroom=[{gpus: 2}] or "
                            "off_peak.timezone=Europe/Berlin")
        if path[0] not in PARSERS:
            raise SpecError(key.strip(), raw, "one of the policy keys " + ", ".join(KEYS))
        value = parse_yaml(raw, key.strip()) if raw.strip() else None
        target: dict[str, Any] = data
        for part in path[:-1]:
            inner = target.get(part)
            target[part] = dict(inner) if isinstance(inner, Mapping) else {}
            target = target[part]
        target[path[-1]] = value
    return data


def changed_keys(old: Policy, new: Policy) -> list[str]:
    """The keys whose value differs between two policies."""
    return [f.name for f in dataclasses.fields(Policy)
            if f.name in PARSERS and getattr(old, f.name) != getattr(new, f.name)]


def policy_in_force(store: Any, path: str | None, actor: str) -> Policy:
    """The policy a scheduler runs with: ``path`` (``[gpu_pool] policy_file``), when set,
    is read and validated (a bad file raises :class:`SpecError`, naming the file) and, when
    it says something other than the store's latest version, recorded as a new version by
    ``actor``; then the store's latest version is returned."""
    from contextlib import suppress

    from gpu_pool.errors import ConflictError
    from gpu_pool.spec import read_input_file

    if path is not None and str(path).strip():
        text = read_input_file(path, "policy_file")
        policy = check_document(text, str(path))
        if policy != store.load_policy():
            # ConflictError: another scheduler recorded a version at the same moment.
            with suppress(ConflictError):
                store.set_policy(text, actor, f"from {path}"[:limits.MAX_TEXT])
    return store.load_policy()
