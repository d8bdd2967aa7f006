"""What the end-to-end tests check, as functions over plain data.

``read_probes`` parses the lines the remote probe command wrote on the nodes (see
``dag_files/e2e_common.py``); ``gpu_overlaps`` finds any moment where the GPU shares held
on one GPU by tasks that really ran there add up to more than one whole GPU.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Probe:
    """One remote run of a test GPU task, as the node saw it."""

    name: str
    node: str
    cuda: tuple[int, ...]
    milli: int
    pgid: int
    start: float
    end: float | None  # None: killed before it finished


def read_probes(out_dir: Path) -> dict[str, Probe]:
    probes: dict[str, Probe] = {}
    for path in sorted(out_dir.glob("*.log")):
        start: dict[str, str] | None = None
        end: float | None = None
        for line in path.read_text().splitlines():
            kind, stamp, *fields = line.split()
            values = dict(f.split("=", 1) for f in fields)
            if kind == "start":
                start = {**values, "at": stamp}
            elif kind == "end":
                end = float(stamp)
        if start is None:
            continue
        cuda = () if start["cuda"] == "none" else tuple(int(i) for i in start["cuda"].split(","))
        probes[path.stem] = Probe(path.stem, start["node"], cuda, int(start["milli"]),
                                  int(start["pgid"]), float(start["at"]), end)
    return probes


def gpu_overlaps(probes: Iterable[Probe]) -> list[str]:
    """Moments where one GPU carried more than 1000 milli; empty when there are none."""
    events: dict[tuple[str, int], list[tuple[float, int, str]]] = {}
    for p in probes:
        finish = p.end if p.end is not None else float("inf")
        for index in p.cuda:
            events.setdefault((p.node, index), []).extend(
                [(p.start, p.milli, p.name), (finish, -p.milli, p.name)])
    problems = []
    for (node, index), items in events.items():
        held, holders = 0, set()
        for at, delta, name in sorted(items, key=lambda e: (e[0], e[1])):  # ends first
            held += delta
            holders.symmetric_difference_update({name})
            if held > 1000:
                problems.append(f"{node}/{index} at {at:.3f}: {held} milli by {sorted(holders)}")
    return problems
