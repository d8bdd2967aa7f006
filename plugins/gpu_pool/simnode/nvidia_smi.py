"""A stand-in for ``nvidia-smi`` that reports simulated GPUs in the real CSV format.

Run as a script by the ``bin/nvidia-smi`` launcher of a node directory (see
:mod:`gpu_pool.simnode.gpus`); it imports only the standard library so it starts fast on
any node. Supported, as the real tool spells them::

    nvidia-smi --query-gpu=index,name,memory.total,... --format=csv[,noheader][,nounits]
    nvidia-smi --query-compute-apps=gpu_uuid,pid,used_memory --format=csv[,noheader][,nounits]
    nvidia-smi -L

With units, values carry them as the real tool prints them (``81920 MiB``, ``37 %``) and the
header names them (``memory.total [MiB]``). Unknown fields fail like the real tool
(exit 2, ``Field "x" is not a valid field to query.``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# field -> (key in gpus.json, unit shown in the header and after values)
GPU_FIELDS: dict[str, tuple[str, str | None]] = {
    "index": ("index", None),
    "name": ("name", None),
    "memory.total": ("memory_total_mib", "MiB"),
    "memory.used": ("memory_used_mib", "MiB"),
    "memory.free": ("memory_free_mib", "MiB"),
    "utilization.gpu": ("utilization_pct", "%"),
    "temperature.gpu": ("temperature_c", None),
    "uuid": ("uuid", None),
}
APP_FIELDS: dict[str, tuple[str, str | None]] = {
    "gpu_uuid": ("gpu_uuid", None),
    "pid": ("pid", None),
    "used_memory": ("used_memory_mib", "MiB"),
}


def _render(rows: list[dict], fields: list[str], table: dict, header: bool, units: bool) -> str:
    lines = []
    if header:
        lines.append(", ".join(
            f"{f} [{table[f][1]}]" if units and table[f][1] else f for f in fields))
    for row in rows:
        cells = []
        for f in fields:
            key, unit = table[f]
            value = row[key]
            cells.append(f"{value} {unit}" if units and unit else str(value))
        lines.append(", ".join(cells))
    return "".join(line + "\n" for line in lines)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] != "--state":
        print("usage: nvidia_smi.py --state gpus.json [nvidia-smi arguments]", file=sys.stderr)
        return 2
    state = json.loads(Path(argv[1]).read_text())
    args = argv[2:]
    gpus = [dict(g, memory_free_mib=g["memory_total_mib"] - g["memory_used_mib"])
            for g in state["gpus"]]
    if args == ["-L"]:
        for g in gpus:
            print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        return 0
    query = fmt = None
    for arg in args:
        if arg.startswith("--query-gpu="):
            query = ("gpu", arg.split("=", 1)[1])
        elif arg.startswith("--query-compute-apps="):
            query = ("apps", arg.split("=", 1)[1])
        elif arg.startswith("--format="):
            fmt = arg.split("=", 1)[1].split(",")
        else:
            print(f'Invalid combination of input arguments: "{arg}"', file=sys.stderr)
            return 2
    if query is None or fmt is None or fmt[0] != "csv":
        print("Please use the --format=csv option with --query-*.", file=sys.stderr)
        return 2
    kind, field_list = query
    table = GPU_FIELDS if kind == "gpu" else APP_FIELDS
    fields = [f.strip() for f in field_list.split(",")]
    for f in fields:
        if f not in table:
            print(f'Field "{f}" is not a valid field to query.', file=sys.stderr)
            return 2
    if kind == "gpu" and state.get("raw_output") is not None:
        sys.stdout.write(state["raw_output"])
        return 0
    rows = gpus if kind == "gpu" else state["processes"]
    sys.stdout.write(_render(rows, fields, table, "noheader" not in fmt, "nounits" not in fmt))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
