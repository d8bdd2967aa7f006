"""Validation at the boundary: plain data (CLI flags, YAML, JSON, decorator kwargs) → domain.

Every function here either returns a valid frozen domain object or raises
:class:`~gpu_pool.errors.SpecError` naming the field, the bad value and what would be
valid. Unknown keys are refused too (a typo must not become a silent default).

Units accepted
--------------
memory
    an integer number of MiB, or a string ``<number><unit>`` with unit K/M/G/T, optionally
    followed by ``i`` and/or ``B`` (``16G``, ``16GB``, ``16GiB`` are all 16 × 1024 MiB: GPU
    and host memory are sold in binary units).
cpu
    cores as a number (``8``, ``0.5``) or millicores as ``"500m"``.
durations
    a :class:`~datetime.timedelta`, a number of seconds, or ``"1d2h30m15s"``-style strings.
times
    a :class:`~datetime.datetime` or an ISO 8601 string; naive values are taken as UTC.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from gpu_pool import limits
from gpu_pool.errors import SpecError
from gpu_pool.model import (
    MILLI_PER_GPU,
    Dataset,
    Gpu,
    Lending,
    Node,
    NodeState,
    Policy,
    PriorityClass,
    Purpose,
    Quota,
    Request,
    Team,
    Tier,
)

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,249}$")
_NAME_HINT = "1-250 characters: letters, digits and . _ : / @ + - (starting with a letter or digit)"
_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT])?(i)?(B)?\s*$", re.IGNORECASE)
_MEMORY_HINT = "a size like '16GiB', '512MiB', '1T' or an integer number of MiB, at most 1 PiB"
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")
_DURATION_HINT = ("a positive duration like '6h', '90m', '1h30m', '45s' or a number of seconds, "
                  f"at most {limits.MAX_DURATION.days} days")
_UNIT_MIB = {None: 1 / 1024 / 1024, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
_LOCAL_EMAIL = re.compile(r"^[^@\s]+@[^@\s.][^@\s]*$")

REQUEST_FIELDS = (
    "name", "team", "purpose", "priority", "gpus", "gpu_share", "nodes", "gpus_per_node",
    "gpu_models", "min_gpu_memory", "cpu", "memory", "dataset", "dataset_zone",
    "dataset_size_gib", "data_ready", "time_limit", "estimated_runtime", "preemptible",
    "submitted_at", "grace",
)
NODE_FIELDS = (
    "name", "gpu_model", "gpus", "gpu_memory", "cpu", "memory", "zone", "tier", "ssh_conn_id",
    "bandwidth_mb_s", "labels", "state",
)
QUOTA_FIELDS = (
    "team", "purpose", "gpus", "gpu_model", "valid_from", "expires_at", "borrow_limit_gpus",
    "gpu_hour_budget",
)
TEAM_FIELDS = ("name", "notify_email", "notify_webhook")
_WEBHOOK = re.compile(r"^(https?://[^\s]+|conn:[A-Za-z0-9_.-]+|file:///[^\s]*)$")


def _refuse_unknown(data: Mapping[str, Any], known: Sequence[str]) -> None:
    for key in data:
        if key not in known:
            raise SpecError(str(key), data[key], "one of the fields " + ", ".join(known))


def parse_name(value: Any, field: str = "name") -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise SpecError(field, value, _NAME_HINT)
    return value


def parse_enum(value: Any, enum_type: type, field: str) -> Any:
    if value is not None:
        try:
            return enum_type(str(value).strip().lower())
        except ValueError:
            pass
    raise SpecError(field, value, "one of " + ", ".join(e.value for e in enum_type))


_INTEGER_TEXT = re.compile(r"^[+-]?\d{1,30}$")


def parse_int(value: Any, field: str, *, minimum: int | None = None, maximum: int | None = None,
              hint: str | None = None) -> int:
    """An integer within bounds (an integral float or numeric string is fine; 1.5 is not).

    Never converts a huge value to float (``float(10**400)`` overflows): long digit strings
    and big ints are compared as integers.
    """
    expected = hint or _range_hint("an integer", minimum, maximum)
    if isinstance(value, bool):
        raise SpecError(field, value, expected)
    if isinstance(value, int):
        result = value
    elif isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise SpecError(field, value, expected)
        result = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if _INTEGER_TEXT.match(text):
            result = int(text)
        else:
            try:
                number = float(text)
            except (ValueError, OverflowError):
                raise SpecError(field, value, expected) from None
            if not math.isfinite(number) or number != int(number):
                raise SpecError(field, value, expected)
            result = int(number)
    else:
        raise SpecError(field, value, expected)
    if (minimum is not None and result < minimum) or (maximum is not None and result > maximum):
        raise SpecError(field, value, expected)
    return result


def parse_number(value: Any, field: str, *, minimum: float = 0.0, maximum: float | None = None,
                 strict: bool = False) -> float:
    """A finite number ≥ minimum (> minimum when ``strict``), ≤ maximum when given."""
    bound = f"{'greater than' if strict else 'at least'} {minimum:g}"
    if maximum is not None:
        bound += f" and at most {maximum:,.10g}"
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise SpecError(field, value, f"a number {bound}") from None
    if (not math.isfinite(number) or number < minimum or (strict and number == minimum)
            or (maximum is not None and number > maximum)):
        raise SpecError(field, value, f"a number {bound}")
    return number


def _range_hint(what: str, minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"{what} from {minimum} to {maximum:,}"
    if minimum is not None:
        return f"{what} of at least {minimum}"
    if maximum is not None:
        return f"{what} of at most {maximum:,}"
    return what


def parse_text(value: Any, field: str, *, max_chars: int = limits.MAX_TEXT,
               spaces: bool = True, what: str = "text") -> str:
    """Printable text of 1 to ``max_chars`` characters (no control characters; no
    whitespace at all unless ``spaces``)."""
    expected = (f"{what} of 1 to {max_chars:,} printable characters"
                + ("" if spaces else " without spaces"))
    if not isinstance(value, str) or not value.strip() or len(value) > max_chars \
            or not value.isprintable() or (not spaces and any(c.isspace() for c in value)):
        raise SpecError(field, value, expected)
    return value


def parse_bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "1", "on"):
        return True
    if text in ("false", "no", "0", "off"):
        return False
    raise SpecError(field, value, "true or false")


def parse_memory_mib(value: Any, field: str) -> int:
    """A memory size in MiB, at most 1 PiB (see the module docstring for the units)."""
    if isinstance(value, bool):
        raise SpecError(field, value, _MEMORY_HINT)
    if isinstance(value, int):
        mib: float = value
    elif isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise SpecError(field, value, _MEMORY_HINT)
        mib = value
    else:
        match = _MEMORY.match(value) if isinstance(value, str) else None
        if not match:
            raise SpecError(field, value, _MEMORY_HINT)
        number, unit = float(match.group(1)), match.group(2)
        mib = number if unit is None else number * _UNIT_MIB[unit.upper()]
    if not 0 <= mib <= limits.MAX_MEMORY_MIB:  # inf and 1e400 too
        raise SpecError(field, value, _MEMORY_HINT)
    return int(round(mib))


_CPU_HINT = (f"cores as a number (e.g. 8 or 0.5) up to {limits.MAX_CPU_CORES:,}, or "
             "millicores like '500m'")


def parse_cpu_milli(value: Any, field: str = "cpu") -> int:
    """CPU as millicores: ``8`` cores, ``0.5`` cores, or ``"500m"``."""
    if isinstance(value, str) and value.strip().endswith("m"):
        return parse_int(value.strip()[:-1], field, minimum=0,
                         maximum=limits.MAX_CPU_CORES * 1000, hint=_CPU_HINT)
    if isinstance(value, str) and not value.strip():
        raise SpecError(field, value, _CPU_HINT)
    try:
        cores = parse_number(value, field, maximum=limits.MAX_CPU_CORES)
    except SpecError:
        raise SpecError(field, value, _CPU_HINT) from None
    return int(round(cores * 1000))


_MAX_SECONDS = limits.MAX_DURATION.total_seconds()


def parse_duration(value: Any, field: str) -> timedelta:
    """A positive duration of at most a year (see the module docstring)."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value) if not isinstance(value, int) or abs(value) < 2**63 else math.inf
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            seconds = float(text)
        except (ValueError, OverflowError):
            match = _DURATION.match(text)
            if not text or not match or not any(match.groups()):
                raise SpecError(field, value, _DURATION_HINT) from None
            d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
            seconds = ((d * 24 + h) * 60 + m) * 60 + s
    else:
        raise SpecError(field, value, _DURATION_HINT)
    # Judged as seconds before any timedelta is made: timedelta(seconds=1e20) overflows.
    if not math.isfinite(seconds) or not 0 < seconds <= _MAX_SECONDS:
        raise SpecError(field, value, _DURATION_HINT)
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def parse_grace(value: Any, field: str = "grace") -> timedelta:
    """A preemption grace (SIGTERM to SIGKILL): a duration of at most
    :data:`~gpu_pool.limits.MAX_GRACE`."""
    hint = (f"a duration from 1s to {limits.MAX_GRACE.total_seconds():g}s (e.g. 90, '2m'): "
            "how long a preempted task has between SIGTERM and SIGKILL to checkpoint")
    try:
        grace = parse_duration(value, field)
    except SpecError:
        raise SpecError(field, value, hint) from None
    if not timedelta(seconds=1) <= grace <= limits.MAX_GRACE:
        raise SpecError(field, value, hint)
    return grace


_TIME_HINT = (f"an ISO 8601 time like '2026-12-31' or '2026-12-31T18:00:00Z', from "
              f"{limits.EARLIEST:%Y} to {limits.LATEST.year - 1}")


def as_utc(when: datetime, field: str, expected: str, shown: Any = None) -> datetime:
    """``when`` in UTC (a naive time is taken as UTC). A time that leaves the calendar once
    moved ('0001-01-01T00:00+00:01' falls before the year 1) is a :class:`SpecError` on
    ``field`` showing ``shown`` (default: ``when`` in ISO 8601)."""
    try:
        return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
    except OverflowError:
        raise SpecError(field, when.isoformat() if shown is None else shown,
                        expected) from None


def parse_datetime(value: Any, field: str) -> datetime:
    """An aware UTC datetime from a datetime or an ISO 8601 string, within the years
    :data:`~gpu_pool.limits.EARLIEST` to :data:`~gpu_pool.limits.LATEST`."""
    if isinstance(value, datetime):
        result = value
    elif isinstance(value, str):
        try:
            result = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise SpecError(field, value, _TIME_HINT) from None
    else:
        raise SpecError(field, value, _TIME_HINT)
    result = as_utc(result, field, _TIME_HINT, shown=value)
    if not limits.EARLIEST <= result < limits.LATEST:
        raise SpecError(field, value, _TIME_HINT)
    return result


def parse_gpu_models(value: Any, policy: Policy, field: str = "gpu_models") -> frozenset[str]:
    """Acceptable models: a list, or a string separated by ``|`` or ``,``. Empty: any."""
    if value is None:
        return frozenset()
    items: Iterable[Any] = re.split(r"[|,]", value) if isinstance(value, str) else value
    if not isinstance(items, Iterable):
        raise SpecError(field, value, "a list of GPU models")
    known = {m.upper(): m for m in policy.model_names}
    models = set()
    for item in items:
        text = str(item).strip()
        if not text:
            continue
        if text.upper() not in known:
            raise SpecError(field, item, "a known GPU model: " + ", ".join(policy.model_names))
        models.add(known[text.upper()])
    return frozenset(models)


def parse_request(data: Mapping[str, Any], *, policy: Policy | None = None,
                  known_teams: Collection[str] | None = None,
                  nodes: Sequence[Node] | None = None, now: datetime | None = None) -> Request:
    """A :class:`Request` from plain data.

    ``gpus`` is the total number of GPUs; a gang gives ``nodes`` and ``gpus_per_node`` (or
    a ``gpus`` divisible by ``nodes``). ``gpu_share`` (1..999 thousandths) asks for a share
    of one GPU. With ``nodes`` (the fleet), a request larger than any node or gang the
    fleet could hold is refused here. With ``now`` (a user's way in), a ``submitted_at``
    further than :data:`~gpu_pool.limits.SUBMITTED_AT_SKEW` from it is refused: an old one
    would jump the queue through aging. An ``estimated_runtime`` longer than the
    ``time_limit`` is refused: the task would be killed before it could finish.
    """
    policy = policy or Policy()
    _refuse_unknown(data, REQUEST_FIELDS)
    if "name" not in data:
        raise SpecError("name", None, _NAME_HINT)
    if "team" not in data:
        raise SpecError("team", None, "the name of a team that holds quota")
    name = parse_name(data["name"])
    team = parse_name(data["team"], "team")
    if known_teams is not None and team not in known_teams:
        raise SpecError("team", team, "a known team: " + (", ".join(sorted(known_teams)) or "none yet "
                                                         "(create one with `gpu-pool team add`)"))
    purpose = parse_enum(data.get("purpose", "training"), Purpose, "purpose")
    priority = parse_enum(data.get("priority", "normal"), PriorityClass, "priority")
    node_count = parse_int(data.get("nodes", 1), "nodes", minimum=1,
                           maximum=limits.MAX_GANG_NODES)
    gpus, gpu_milli = _parse_gpu_shape(data, node_count)
    dataset = None
    if data.get("dataset") is not None:
        zone = data.get("dataset_zone")
        dataset = Dataset(
            uri=parse_text(data["dataset"], "dataset", max_chars=limits.MAX_URI, spaces=False,
                           what="a dataset URI"),
            zone=parse_name(zone, "dataset_zone") if zone is not None else None,
            size_gib=parse_number(data.get("dataset_size_gib", 0), "dataset_size_gib",
                                  maximum=limits.MAX_DATASET_GIB),
        )
    elif data.get("dataset_zone") is not None or data.get("dataset_size_gib") is not None:
        raise SpecError("dataset", None, "a dataset URI when dataset_zone or dataset_size_gib is given")
    request = Request(
        name=name,
        team=team,
        purpose=purpose,
        priority=priority,
        gpus=gpus,
        gpu_milli=gpu_milli,
        nodes=node_count,
        gpu_models=parse_gpu_models(data.get("gpu_models"), policy),
        min_gpu_memory_mib=parse_memory_mib(data.get("min_gpu_memory", 0), "min_gpu_memory"),
        cpu_milli=parse_cpu_milli(data.get("cpu", 0)),
        memory_mib=parse_memory_mib(data.get("memory", 0), "memory"),
        dataset=dataset,
        data_ready=parse_bool(data.get("data_ready", True), "data_ready"),
        time_limit=_optional(data, "time_limit", parse_duration),
        estimated_runtime=_optional(data, "estimated_runtime", parse_duration),
        preemptible=parse_bool(data.get("preemptible", priority is PriorityClass.BATCH),
                               "preemptible"),
        submitted_at=_optional(data, "submitted_at", parse_datetime),
        grace=_optional(data, "grace", parse_grace),
    )
    if (request.time_limit is not None and request.estimated_runtime is not None
            and request.estimated_runtime > request.time_limit):
        raise SpecError("estimated_runtime", data["estimated_runtime"],
                        f"at most the time_limit ({data['time_limit']}): the task would be "
                        "killed before it could finish; raise time_limit or lower the estimate")
    if now is not None and request.submitted_at is not None \
            and abs(request.submitted_at - now) > limits.SUBMITTED_AT_SKEW:
        raise SpecError("submitted_at", data["submitted_at"],
                        f"a time within 5 minutes of now ({now:%Y-%m-%dT%H:%M:%SZ}), or none: "
                        "gpu-pool sets it when the request is submitted")
    if nodes is not None:
        check_request_fits_fleet(request, nodes)
    return request


def _optional(data: Mapping[str, Any], key: str, parse: Any) -> Any:
    value = data.get(key)
    return None if value is None else parse(value, key)


def _parse_gpu_shape(data: Mapping[str, Any], node_count: int) -> tuple[int, int]:
    """(GPUs per node, milli per GPU) from gpus / gpus_per_node / gpu_share."""
    share = data.get("gpu_share")
    if share is not None:
        milli = parse_int(share, "gpu_share", minimum=1, maximum=MILLI_PER_GPU - 1,
                          hint="an integer number of thousandths of one GPU, from 1 to 999 "
                               "(250 is a quarter GPU); ask for whole GPUs with gpus")
        if node_count != 1:
            raise SpecError("gpu_share", share, "no share for a multi-node gang (nodes=1)")
        if data.get("gpus", 1) not in (1, "1") or data.get("gpus_per_node") is not None:
            raise SpecError("gpus", data.get("gpus"), "1 (or absent) with gpu_share: a share is "
                            "part of one GPU")
        return 1, milli
    top = limits.MAX_GPUS_PER_NODE
    whole = "a whole number of GPUs, at least 1 (use gpu_share for part of one GPU)"
    per_node_raw = data.get("gpus_per_node")
    if per_node_raw is not None:
        per_node = parse_int(per_node_raw, "gpus_per_node", minimum=1, maximum=top,
                             hint=f"{whole}, at most {top} per node")
        if data.get("gpus") is not None:
            total = parse_int(data["gpus"], "gpus", minimum=1, maximum=top * node_count,
                              hint=f"{whole}, at most {top * node_count} on {node_count} node(s)")
            if total != per_node * node_count:
                raise SpecError("gpus", data["gpus"], f"{per_node * node_count} "
                                f"(nodes × gpus_per_node), or leave gpus out")
        return per_node, MILLI_PER_GPU
    total = parse_int(data.get("gpus", 1), "gpus", minimum=1, maximum=top * node_count,
                      hint=f"{whole}, at most {top * node_count} on {node_count} node(s)")
    if total % node_count:
        raise SpecError("gpus", total, f"a multiple of nodes={node_count}, or give gpus_per_node")
    return total // node_count, MILLI_PER_GPU


def check_request_fits_fleet(request: Request, nodes: Sequence[Node]) -> None:
    """Refuse a request larger than any node (or gang of nodes) of the fleet could hold."""
    largest = max((n.gpu_count for n in nodes), default=0)
    if request.gpus > largest:
        where = next((n.name for n in nodes if n.gpu_count == largest), None)
        field = "gpus_per_node" if request.is_gang else "gpus"
        value = request.gpus if request.is_gang else request.total_gpus
        raise SpecError(field, int(value), f"at most {largest} per node (the largest node, "
                        f"{where!r}, has {largest} GPUs); ask for a gang with nodes=K for more"
                        if where else "no GPUs: the fleet has no GPU nodes yet")
    big_enough = sum(1 for n in nodes if n.gpu_count >= request.gpus)
    if request.nodes > big_enough:
        raise SpecError("nodes", request.nodes, f"at most {big_enough}: the fleet has "
                        f"{big_enough} nodes with {request.gpus} or more GPUs")


def parse_node(data: Mapping[str, Any], *, policy: Policy | None = None) -> Node:
    """A :class:`Node` from plain data (one entry of a nodes YAML file)."""
    policy = policy or Policy()
    _refuse_unknown(data, NODE_FIELDS)
    name = parse_name(data.get("name"), "name")
    count = parse_int(data.get("gpus", 0), "gpus", minimum=0, maximum=limits.MAX_GPUS_PER_NODE,
                      hint=f"a GPU count from 0 to {limits.MAX_GPUS_PER_NODE}")
    model = data.get("gpu_model")
    gpus: tuple[Gpu, ...] = ()
    if count:
        if model is None:
            raise SpecError("gpu_model", None, "a known GPU model for a node with GPUs: "
                            + ", ".join(policy.model_names))
        (model,) = parse_gpu_models([model], policy, "gpu_model")
        info = policy.model_info(model)
        memory = (parse_memory_mib(data["gpu_memory"], "gpu_memory") if "gpu_memory" in data
                  else info.memory_mib if info else 0)
        gpus = tuple(Gpu(index=i, model=model, memory_mib=memory) for i in range(count))
    labels = data.get("labels") or {}
    label_hint = (f"a mapping of at most {limits.MAX_LABELS} label names to plain values "
                  f"(text or numbers, {limits.MAX_LABEL_TEXT} characters at most)")
    if not isinstance(labels, Mapping) or len(labels) > limits.MAX_LABELS:
        raise SpecError("labels", labels, label_hint)
    for key, value in labels.items():
        if isinstance(value, Mapping | list) or len(str(key)) > limits.MAX_LABEL_TEXT \
                or len(str(value)) > limits.MAX_LABEL_TEXT or not str(key).strip():
            raise SpecError(f"labels.{str(key)[:40]}", value, label_hint)
    return Node(
        name=name,
        gpus=gpus,
        cpu_milli=parse_cpu_milli(data.get("cpu", 0)),
        memory_mib=parse_memory_mib(data.get("memory", 0), "memory"),
        zone=parse_name(data.get("zone", "default"), "zone"),
        tier=parse_enum(data.get("tier", "core"), Tier, "tier"),
        ssh_conn_id=parse_name(data["ssh_conn_id"], "ssh_conn_id") if data.get("ssh_conn_id") else None,
        bandwidth_mb_s=parse_number(data.get("bandwidth_mb_s", 1000.0), "bandwidth_mb_s",
                                    maximum=limits.MAX_BANDWIDTH_MB_S, strict=True),
        labels={str(k): str(v) for k, v in labels.items()},
        state=parse_enum(data.get("state", "up"), NodeState, "state"),
    )


def parse_nodes(entries: Iterable[Mapping[str, Any]], *, source: str = "nodes",
                policy: Policy | None = None) -> list[Node]:
    """Nodes from a list of mappings; a duplicate name is refused."""
    nodes: list[Node] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{source}: node #{i + 1}"
        if not isinstance(entry, Mapping):
            raise SpecError("node", entry, "a mapping with name, gpu_model, gpus, cpu, memory...",
                            where=where)
        try:
            node = parse_node(entry, policy=policy)
        except SpecError as error:
            raise error.located(where) from None
        if node.name in seen:
            raise SpecError("name", node.name, f"a name not used by another node (node #"
                            f"{seen[node.name] + 1} is already called {node.name!r})", where=where)
        seen[node.name] = i
        nodes.append(node)
    return nodes


def read_input_file(path: str | Path, field: str = "file") -> str:
    """The text of a file a user handed in, checked before any work is done with it: it
    exists, is a regular file, is readable, holds at most 64 MiB and is UTF-8."""
    name = str(path)
    try:
        info = os.stat(path)
    except (OSError, ValueError) as error:  # ValueError: a NUL in the path
        reason = getattr(error, "strerror", None) or "not a usable path"
        raise SpecError(field, name, f"an existing, readable file ({reason})") from None
    if not stat.S_ISREG(info.st_mode):
        raise SpecError(field, name, "a regular file (this is a folder or a device)")
    if info.st_size > limits.MAX_INPUT_FILE_BYTES:
        raise SpecError(field, name, f"a file of at most 64 MiB (it has {info.st_size:,} bytes)")
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise SpecError(field, name, f"a readable file ({error.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise SpecError(field, name, f"UTF-8 text (byte 0x{data[error.start]:02x} on line "
                        f"{line}, offset {error.start}, is not UTF-8)") from None


def check_output_file(path: str | Path, field: str) -> Path:
    """A file the command will write: its folder exists and is writable, and the path is
    not a folder. Checked before the work that produces it."""
    target = Path(path)
    try:
        folder = target.resolve().parent
        is_dir = target.is_dir()
        usable = folder.is_dir() and os.access(folder, os.W_OK)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        raise SpecError(field, str(path), "a usable file path") from None
    if is_dir:
        raise SpecError(field, str(path), "a file path (this is a folder)")
    if not usable:
        raise SpecError(field, str(path), f"a path in an existing, writable folder "
                        f"({folder} is not one)")
    return target


def check_output_folder(path: str | Path, field: str) -> Path:
    """A folder the command will write into, made if missing: checked before the work, it
    is a folder or can be made under a writable one."""
    target = Path(path)
    try:
        resolved = target.resolve()
        existing = next(p for p in (resolved, *resolved.parents) if p.exists())
        ok = existing.is_dir() and os.access(existing, os.W_OK)
    except (OSError, ValueError):
        raise SpecError(field, str(path), "a usable folder path") from None
    if not ok:
        raise SpecError(field, str(path), f"a folder that exists or can be made ({existing} "
                        "is not a writable folder)")
    return target


def parse_yaml(text: str, source: str) -> Any:
    """A YAML document (safe constructors only); a syntax error names line and column."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise SpecError("yaml", getattr(error, "problem", None) or str(error).splitlines()[0],
                        "valid YAML", where=where) from None
    except RecursionError:
        raise SpecError("yaml", "nested too deep", "a document of plain mappings and lists",
                        where=source) from None


def parse_nodes_document(text: str, source: str = "nodes.yaml", *,
                         policy: Policy | None = None) -> list[Node]:
    """Nodes from a YAML document: ``nodes: [ {name: ..., ...}, ... ]`` or a bare list."""
    document = parse_yaml(text, source)
    entries = document.get("nodes") if isinstance(document, Mapping) else document
    if not isinstance(entries, list):
        raise SpecError("nodes", type(document).__name__, "a list of nodes (or a mapping with "
                        "a 'nodes' list)", where=source)
    return parse_nodes(entries, source=source, policy=policy)


def parse_quota(data: Mapping[str, Any], *, policy: Policy | None = None,
                known_teams: Collection[str] | None = None) -> Quota:
    policy = policy or Policy()
    _refuse_unknown(data, QUOTA_FIELDS)
    team = parse_name(data.get("team"), "team")
    if known_teams is not None and team not in known_teams:
        raise SpecError("team", team, "a known team: " + (", ".join(sorted(known_teams)) or "none"))
    for required in ("valid_from", "expires_at"):
        if data.get(required) is None:
            raise SpecError(required, None, "an ISO 8601 time like '2026-12-31T18:00:00Z'")
    valid_from = parse_datetime(data["valid_from"], "valid_from")
    expires_at = parse_datetime(data["expires_at"], "expires_at")
    if expires_at <= valid_from:
        raise SpecError("expires_at", data["expires_at"],
                        f"a time after valid_from ({valid_from.isoformat()})")
    model = data.get("gpu_model")
    if model is not None and str(model).lower() not in ("any", ""):
        (model,) = parse_gpu_models([model], policy, "gpu_model")
    else:
        model = None
    budget = data.get("gpu_hour_budget")
    whole = f"a whole number of GPUs from 0 to {limits.MAX_QUOTA_GPUS:,}"
    return Quota(
        team=team,
        purpose=parse_enum(data.get("purpose"), Purpose, "purpose"),
        gpus=float(parse_int(data.get("gpus"), "gpus", minimum=0,
                             maximum=limits.MAX_QUOTA_GPUS, hint=whole)),
        valid_from=valid_from,
        expires_at=expires_at,
        gpu_model=model,
        borrow_limit_gpus=float(parse_int(data.get("borrow_limit_gpus", 0), "borrow_limit_gpus",
                                          minimum=0, maximum=limits.MAX_QUOTA_GPUS, hint=whole)),
        gpu_hour_budget=None if budget is None else parse_number(
            budget, "gpu_hour_budget", maximum=limits.MAX_GPU_HOURS),
    )


def parse_email(value: Any, field: str, *, local: bool = False) -> str:
    """An e-mail address; ``local`` also takes a host without a dot (``gpu-pool@localhost``,
    a sender on the relay's own machine)."""
    pattern = _LOCAL_EMAIL if local else _EMAIL
    if not isinstance(value, str) or len(value) > 254 or not pattern.match(value) \
            or not value.isprintable():
        raise SpecError(field, value, "an e-mail address like 'nlp-oncall@example.com'")
    return value


def parse_lending(team: Any, to: Any, limit: Any = None) -> Lending:
    """``gpu-pool team lend TEAM --to all|none|t1,t2 [--limit GPUS]`` as a
    :class:`Lending`: ``all`` (every team), ``none`` (nobody) or team names separated by
    commas, not the team itself; the limit in GPUs, at least 0 (none: no limit)."""
    name = parse_name(team, "team")
    hint = "all, none, or team names separated by commas, like 'nlp,speech'"
    if not isinstance(to, str) or not to.strip():
        raise SpecError("to", to, hint)
    word = to.strip().lower()
    borrowers: frozenset[str] | None
    if word == "all":
        borrowers = None
    elif word == "none":
        borrowers = frozenset()
    else:
        names = [x.strip() for x in to.split(",")]
        for x in names:
            if not x or not _NAME.match(x):
                raise SpecError("to", to, hint)
            if x == name:
                raise SpecError("to", to, f"teams other than {name} itself ({hint})")
        borrowers = frozenset(names)
    cap = None if limit is None else parse_number(limit, "limit", maximum=limits.MAX_QUOTA_GPUS)
    return Lending(name, borrowers, cap)


def parse_team(data: Mapping[str, Any]) -> Team:
    _refuse_unknown(data, TEAM_FIELDS)
    email = data.get("notify_email")
    if email is not None:
        parse_email(email, "notify_email")
    webhook = data.get("notify_webhook")
    if webhook is not None and (not isinstance(webhook, str) or len(webhook) > limits.MAX_URI
                                or not webhook.isprintable() or not _WEBHOOK.match(webhook)):
        raise SpecError("notify_webhook", webhook, "an http:// or https:// URL, "
                        "conn:<Airflow connection id> (a URL kept secret there) or "
                        "file:///<absolute path> (notices appended as JSON lines)")
    return Team(name=parse_name(data.get("name"), "name"), notify_email=email,
                notify_webhook=webhook)
