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
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import yaml

from gpu_pool.errors import SpecError
from gpu_pool.model import (
    MILLI_PER_GPU,
    Dataset,
    Gpu,
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
_MEMORY_HINT = "a size like '16GiB', '512MiB', '1T' or an integer number of MiB"
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")
_DURATION_HINT = "a positive duration like '6h', '90m', '1h30m', '45s' or a number of seconds"
_UNIT_MIB = {None: 1 / 1024 / 1024, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")

REQUEST_FIELDS = (
    "name", "team", "purpose", "priority", "gpus", "gpu_share", "nodes", "gpus_per_node",
    "gpu_models", "min_gpu_memory", "cpu", "memory", "dataset", "dataset_zone",
    "dataset_size_gib", "data_ready", "time_limit", "estimated_runtime", "preemptible",
    "submitted_at",
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


def parse_int(value: Any, field: str, *, minimum: int | None = None, maximum: int | None = None,
              hint: str | None = None) -> int:
    """An integer (an integral float or numeric string is fine; 1.5 is not)."""
    expected = hint or _range_hint("an integer", minimum, maximum)
    number: Any = value
    if isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            raise SpecError(field, value, expected) from None
    if isinstance(number, bool) or not isinstance(number, int | float) or not math.isfinite(number):
        raise SpecError(field, value, expected)
    if number != int(number):
        raise SpecError(field, value, expected)
    result = int(number)
    if (minimum is not None and result < minimum) or (maximum is not None and result > maximum):
        raise SpecError(field, value, expected)
    return result


def parse_number(value: Any, field: str, *, minimum: float = 0.0, strict: bool = False) -> float:
    """A finite number ≥ minimum (> minimum when ``strict``)."""
    bound = f"{'greater than' if strict else 'at least'} {minimum:g}"
    try:
        if isinstance(value, bool):
            raise ValueError
        number = float(value)
    except (TypeError, ValueError):
        raise SpecError(field, value, f"a number {bound}") from None
    if not math.isfinite(number) or number < minimum or (strict and number == minimum):
        raise SpecError(field, value, f"a number {bound}")
    return number


def _range_hint(what: str, minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f"{what} from {minimum} to {maximum}"
    if minimum is not None:
        return f"{what} of at least {minimum}"
    return what


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
    """A memory size in MiB (see the module docstring for the units)."""
    if isinstance(value, bool):
        raise SpecError(field, value, _MEMORY_HINT)
    if isinstance(value, int | float):
        if value < 0 or not math.isfinite(value) or value != int(value):
            raise SpecError(field, value, _MEMORY_HINT)
        return int(value)
    match = _MEMORY.match(value) if isinstance(value, str) else None
    if not match:
        raise SpecError(field, value, _MEMORY_HINT)
    number, unit = float(match.group(1)), match.group(2)
    mib = number * _UNIT_MIB[unit.upper() if unit else None]
    if unit is None:  # a bare number in a string is MiB, like an int
        mib = number
    return int(round(mib))


def parse_cpu_milli(value: Any, field: str = "cpu") -> int:
    """CPU as millicores: ``8`` cores, ``0.5`` cores, or ``"500m"``."""
    if isinstance(value, str) and value.strip().endswith("m"):
        return parse_int(value.strip()[:-1], field, minimum=0,
                         hint="cores as a number (e.g. 8 or 0.5) or millicores like '500m'")
    cores = parse_number(value, field) if not isinstance(value, str) or value.strip() else None
    if cores is None:
        raise SpecError(field, value, "cores as a number (e.g. 8 or 0.5) or millicores like '500m'")
    return int(round(cores * 1000))


def parse_duration(value: Any, field: str) -> timedelta:
    """A positive duration (see the module docstring)."""
    if isinstance(value, timedelta):
        result = value
    elif isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise SpecError(field, value, _DURATION_HINT)
        result = timedelta(seconds=value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        try:
            result = timedelta(seconds=float(text))
        except ValueError:
            match = _DURATION.match(text)
            if not text or not match or not any(match.groups()):
                raise SpecError(field, value, _DURATION_HINT) from None
            d, h, m, s = (float(g) if g else 0.0 for g in match.groups())
            result = timedelta(days=d, hours=h, minutes=m, seconds=s)
    else:
        raise SpecError(field, value, _DURATION_HINT)
    if result <= timedelta(0):
        raise SpecError(field, value, _DURATION_HINT)
    return result


def parse_datetime(value: Any, field: str) -> datetime:
    """An aware UTC datetime from a datetime or an ISO 8601 string."""
    if isinstance(value, datetime):
        result = value
    elif isinstance(value, str):
        try:
            result = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise SpecError(field, value, "an ISO 8601 time like '2026-12-31' or "
                            "'2026-12-31T18:00:00Z'") from None
    else:
        raise SpecError(field, value, "an ISO 8601 time like '2026-12-31T18:00:00Z'")
    if result.tzinfo is None:
        return result.replace(tzinfo=UTC)
    return result.astimezone(UTC)


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
                  nodes: Sequence[Node] | None = None) -> Request:
    """A :class:`Request` from plain data.

    ``gpus`` is the total number of GPUs; a gang gives ``nodes`` and ``gpus_per_node`` (or
    a ``gpus`` divisible by ``nodes``). ``gpu_share`` (1..999 thousandths) asks for a share
    of one GPU. With ``nodes`` (the fleet), a request larger than any node or gang the
    fleet could hold is refused here.
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
    node_count = parse_int(data.get("nodes", 1), "nodes", minimum=1)
    gpus, gpu_milli = _parse_gpu_shape(data, node_count)
    dataset = None
    if data.get("dataset") is not None:
        zone = data.get("dataset_zone")
        dataset = Dataset(
            uri=str(data["dataset"]),
            zone=parse_name(zone, "dataset_zone") if zone is not None else None,
            size_gib=parse_number(data.get("dataset_size_gib", 0), "dataset_size_gib"),
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
    )
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
    whole = "a whole number of GPUs, at least 1 (use gpu_share for part of one GPU)"
    per_node_raw = data.get("gpus_per_node")
    if per_node_raw is not None:
        per_node = parse_int(per_node_raw, "gpus_per_node", minimum=1, hint=whole)
        if data.get("gpus") is not None:
            total = parse_int(data["gpus"], "gpus", minimum=1, hint=whole)
            if total != per_node * node_count:
                raise SpecError("gpus", data["gpus"], f"{per_node * node_count} "
                                f"(nodes × gpus_per_node), or leave gpus out")
        return per_node, MILLI_PER_GPU
    total = parse_int(data.get("gpus", 1), "gpus", minimum=1, hint=whole)
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
    count = parse_int(data.get("gpus", 0), "gpus", minimum=0, maximum=64,
                      hint="a GPU count from 0 to 64")
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
    if not isinstance(labels, Mapping):
        raise SpecError("labels", labels, "a mapping of label names to values")
    return Node(
        name=name,
        gpus=gpus,
        cpu_milli=parse_cpu_milli(data.get("cpu", 0)),
        memory_mib=parse_memory_mib(data.get("memory", 0), "memory"),
        zone=parse_name(data.get("zone", "default"), "zone"),
        tier=parse_enum(data.get("tier", "core"), Tier, "tier"),
        ssh_conn_id=parse_name(data["ssh_conn_id"], "ssh_conn_id") if data.get("ssh_conn_id") else None,
        bandwidth_mb_s=parse_number(data.get("bandwidth_mb_s", 1000.0), "bandwidth_mb_s",
                                    strict=True),
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


def parse_nodes_document(text: str, source: str = "nodes.yaml", *,
                         policy: Policy | None = None) -> list[Node]:
    """Nodes from a YAML document: ``nodes: [ {name: ..., ...}, ... ]`` or a bare list."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise SpecError("yaml", getattr(error, "problem", str(error)), "valid YAML",
                        where=where) from None
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
    return Quota(
        team=team,
        purpose=parse_enum(data.get("purpose"), Purpose, "purpose"),
        gpus=parse_number(data.get("gpus"), "gpus"),
        valid_from=valid_from,
        expires_at=expires_at,
        gpu_model=model,
        borrow_limit_gpus=parse_number(data.get("borrow_limit_gpus", 0), "borrow_limit_gpus"),
        gpu_hour_budget=None if budget is None else parse_number(budget, "gpu_hour_budget"),
    )


def parse_team(data: Mapping[str, Any]) -> Team:
    _refuse_unknown(data, TEAM_FIELDS)
    email = data.get("notify_email")
    if email is not None and not _EMAIL.match(str(email)):
        raise SpecError("notify_email", email, "an e-mail address like 'nlp-oncall@example.com'")
    webhook = data.get("notify_webhook")
    if webhook is not None and not _WEBHOOK.match(str(webhook)):
        raise SpecError("notify_webhook", webhook, "an http:// or https:// URL, "
                        "conn:<Airflow connection id> (a URL kept secret there) or "
                        "file:///<absolute path> (notices appended as JSON lines)")
    return Team(name=parse_name(data.get("name"), "name"), notify_email=email,
                notify_webhook=webhook)
