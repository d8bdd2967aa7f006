"""Teams, nodes and their GPUs in the store.

Terms
-----
import
    Adding nodes from a fleet file. A node name already stored is refused unless
    ``replace``: then its fields and GPUs are updated, GPUs missing from the new
    description are removed — except one an active allocation holds, which is refused.
reading
    One probe result for one GPU: ``index``, ``utilization_pct``, ``memory_used_mib``,
    ``healthy``. It updates the GPU's row and appends a row to ``gpu_samples``.

Invariants: :func:`change_node_state` is the only writer of ``nodes.state`` after a node's
creation and writes its ``node.state`` event in the same transaction; a change of a GPU's
health writes a ``gpu.health`` event; ``gpus.allocated_milli`` is never written here (the
guard triggers own it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from gpu_pool.errors import NotFoundError, SpecError
from gpu_pool.model import Gpu, Node, NodeState, Team
from gpu_pool.store import events
from gpu_pool.store.checks import check_node, check_reading
from gpu_pool.store.codec import (
    db_time,
    gpu_from_row,
    new_id,
    node_from_row,
    node_params,
    team_from_row,
)


def upsert_team(conn: Connection, team: Team, actor: str, now: datetime) -> Team:
    params = {"name": team.name, "email": team.notify_email, "webhook": team.notify_webhook,
              "now": db_time(now)}
    updated = conn.execute(text("UPDATE teams SET notify_email = :email, notify_webhook = "
                                ":webhook, updated_at = :now WHERE name = :name"), params)
    kind = "team.updated"
    if updated.rowcount == 0:
        conn.execute(text("INSERT INTO teams (name, notify_email, notify_webhook, created_at, "
                          "updated_at) VALUES (:name, :email, :webhook, :now, :now)"), params)
        kind = "team.added"
    events.record(conn, now, "team", team.name, kind, actor,
                  data={"notify_email": team.notify_email, "notify_webhook": team.notify_webhook})
    return team


def list_teams(conn: Connection) -> list[Team]:
    rows = conn.execute(text("SELECT * FROM teams ORDER BY name")).mappings()
    return [team_from_row(r) for r in rows]


def team_names(conn: Connection) -> list[str]:
    return list(conn.execute(text("SELECT name FROM teams ORDER BY name")).scalars())


def require_team(conn: Connection, team: str) -> None:
    """Refuse a team the store does not know (SpecError naming the known ones)."""
    teams = team_names(conn)
    if team not in teams:
        raise SpecError("team", team, "a known team: " + (", ".join(teams) or "none yet "
                        "(create one with `gpu-pool team add`)"))


def list_nodes(conn: Connection) -> list[Node]:
    gpus: dict[str, list[Gpu]] = {}
    for r in conn.execute(text("SELECT * FROM gpus ORDER BY node, idx")).mappings():
        gpus.setdefault(r["node"], []).append(gpu_from_row(r))
    rows = conn.execute(text("SELECT * FROM nodes ORDER BY name")).mappings()
    return [node_from_row(r, gpus.get(r["name"], ())) for r in rows]


def fleet_shapes(conn: Connection) -> list[Node]:
    """Every node with what :func:`gpu_pool.engine.never_fits` looks at — GPU count, model,
    smallest GPU memory, CPU, RAM — from one row per node instead of one per GPU (it runs on
    every submission)."""
    rows = conn.execute(text(
        "SELECT n.name, n.cpu_milli, n.memory_mib, n.zone, COUNT(g.idx) AS gpus, "
        "MIN(g.model) AS model, MIN(g.memory_mib) AS gpu_memory FROM nodes n "
        "LEFT JOIN gpus g ON g.node = n.name GROUP BY n.name, n.cpu_milli, n.memory_mib, n.zone "
        "ORDER BY n.name")).mappings()
    return [Node(name=r["name"], gpus=tuple(Gpu(i, r["model"], r["gpu_memory"])
                                             for i in range(r["gpus"])),
                 cpu_milli=r["cpu_milli"], memory_mib=r["memory_mib"], zone=r["zone"])
            for r in rows]


def get_node(conn: Connection, name: str) -> Node | None:
    row = conn.execute(text("SELECT * FROM nodes WHERE name = :n"), {"n": name}).mappings().first()
    if row is None:
        return None
    gpus = conn.execute(text("SELECT * FROM gpus WHERE node = :n ORDER BY idx"),
                        {"n": name}).mappings()
    return node_from_row(row, [gpu_from_row(g) for g in gpus])


def import_nodes(conn: Connection, nodes: Sequence[Node], actor: str, replace: bool,
                 now: datetime) -> None:
    seen: set[str] = set()
    for node in nodes:
        check_node(node)
        if node.name in seen:
            raise SpecError("name", node.name, "a node name given once per import")
        seen.add(node.name)
    stored = {r["name"]: r["state"] for r in
              conn.execute(text("SELECT name, state FROM nodes")).mappings()}
    for node in nodes:
        if node.name not in stored:
            _insert_node(conn, node, actor, now)
        elif not replace:
            raise SpecError("name", node.name, "a node name not in the store yet (it has "
                            f"{node.name!r}); use replace (--replace) to update it")
        else:
            _replace_node(conn, node, stored[node.name], actor, now)


def _insert_node(conn: Connection, node: Node, actor: str, now: datetime) -> None:
    conn.execute(text(
        "INSERT INTO nodes (name, zone, tier, ssh_conn_id, cpu_milli, memory_mib, bandwidth_mb_s,"
        " labels, state, created_at, updated_at) VALUES (:name, :zone, :tier, :ssh_conn_id, "
        ":cpu_milli, :memory_mib, :bandwidth_mb_s, :labels, :state, :now, :now)"),
        node_params(node, now))
    for gpu in node.gpus:
        _insert_gpu(conn, node.name, gpu)
    events.record(conn, now, "node", node.name, "node.added", actor,
                  data={"gpus": node.gpu_count, "model": node.gpu_model, "state": node.state,
                        "before": None, "after": node_summary(node)})


def _insert_gpu(conn: Connection, node: str, gpu: Gpu) -> None:
    conn.execute(text("INSERT INTO gpus (node, idx, model, memory_mib, healthy, utilization_pct)"
                      " VALUES (:node, :idx, :model, :mem, :healthy, :util)"),
                 {"node": node, "idx": gpu.index, "model": gpu.model, "mem": gpu.memory_mib,
                  "healthy": bool(gpu.healthy), "util": gpu.utilization_pct})


def node_summary(node: Node) -> dict[str, Any]:
    """What an audit shows of a node: its shape and where it belongs."""
    return {"gpus": node.gpu_count, "model": node.gpu_model, "zone": node.zone,
            "tier": str(node.tier.value if hasattr(node.tier, "value") else node.tier),
            "cpu_milli": node.cpu_milli, "memory_mib": node.memory_mib,
            "ssh_conn_id": node.ssh_conn_id, "labels": dict(node.labels)}


def _replace_node(conn: Connection, node: Node, old_state: str, actor: str,
                  now: datetime) -> None:
    previous = get_node(conn, node.name)
    conn.execute(text(
        "UPDATE nodes SET zone = :zone, tier = :tier, ssh_conn_id = :ssh_conn_id, cpu_milli = "
        ":cpu_milli, memory_mib = :memory_mib, bandwidth_mb_s = :bandwidth_mb_s, labels = "
        ":labels, updated_at = :now WHERE name = :name"), node_params(node, now))
    current = {r["idx"]: r for r in conn.execute(
        text("SELECT idx, allocated_milli FROM gpus WHERE node = :n"), {"n": node.name}).mappings()}
    wanted = {g.index: g for g in node.gpus}
    for idx, row in sorted(current.items()):
        if idx in wanted:
            continue
        if row["allocated_milli"] > 0:
            raise SpecError("gpus", f"{node.name} without GPU {idx}",
                            f"a GPU list that keeps GPU {idx}: an active allocation holds it "
                            "(release it or drain the node first)")
        conn.execute(text("DELETE FROM gpus WHERE node = :n AND idx = :i"),
                     {"n": node.name, "i": idx})
    for idx, gpu in sorted(wanted.items()):
        if idx in current:
            conn.execute(text("UPDATE gpus SET model = :model, memory_mib = :mem "
                              "WHERE node = :node AND idx = :idx"),
                         {"model": gpu.model, "mem": gpu.memory_mib, "node": node.name, "idx": idx})
        else:
            _insert_gpu(conn, node.name, gpu)
    events.record(conn, now, "node", node.name, "node.updated", actor,
                  data={"gpus": node.gpu_count, "model": node.gpu_model,
                        "before": None if previous is None else node_summary(previous),
                        "after": node_summary(node)})
    if NodeState(old_state) is not node.state:
        change_node_state(conn, node.name, node.state, actor, "state given by node import", now)


def change_node_state(conn: Connection, name: str, state: NodeState, actor: str,
                      reason: str | None, now: datetime) -> bool:
    """Set a node's state (guarded on its current one); False when it already had it.

    ``state_reason`` says why a node is *not* up: a node back up keeps none (the reason it
    came back is in its ``node.state`` event).
    """
    old = conn.execute(text("SELECT state FROM nodes WHERE name = :n"), {"n": name}).scalar()
    if old is None:
        known = list(conn.execute(text("SELECT name FROM nodes")).scalars())
        raise NotFoundError("node", name, known)
    if old == str(state):
        return False
    changed = conn.execute(text("UPDATE nodes SET state = :s, state_reason = :r, updated_at = :now"
                                " WHERE name = :n AND state = :old"),
                           {"s": str(state), "r": None if state is NodeState.UP else reason,
                            "now": db_time(now), "n": name,
                            "old": old})
    if changed.rowcount != 1:  # unreachable inside one transaction; guard against misuse
        raise NotFoundError("node", name)
    events.record(conn, now, "node", name, "node.state", actor, reason,
                  {"from": old, "to": str(state), "before": {"state": old},
                   "after": {"state": str(state)}})
    return True


def _field(reading: Any, name: str, default: Any = None) -> Any:
    if isinstance(reading, Mapping):
        return reading.get(name, default)
    return getattr(reading, name, default)


def record_gpu_readings(conn: Connection, node: str, readings: Iterable[Any], at: datetime,
                        actor: str) -> int:
    """Store probe readings of ``node``'s GPUs; returns how many were stored."""
    current = {r["idx"]: bool(r["healthy"]) for r in conn.execute(
        text("SELECT idx, healthy FROM gpus WHERE node = :n"), {"n": node}).mappings()}
    if not current and conn.execute(text("SELECT 1 FROM nodes WHERE name = :n"),
                                    {"n": node}).first() is None:
        raise NotFoundError("node", node, list(conn.execute(text("SELECT name FROM nodes"))
                                               .scalars()))
    count = 0
    for reading in readings:
        idx = _field(reading, "index")
        util = _field(reading, "utilization_pct")
        used = _field(reading, "memory_used_mib")
        check_reading(node, idx, util, used, current)
        healthy = bool(_field(reading, "healthy", True))
        params = {"node": node, "idx": idx, "util": util, "used": used, "healthy": healthy,
                  "at": db_time(at), "id": new_id()}
        conn.execute(text("UPDATE gpus SET utilization_pct = :util, memory_used_mib = :used, "
                          "healthy = :healthy, read_at = :at WHERE node = :node AND idx = :idx"),
                     params)
        conn.execute(text("INSERT INTO gpu_samples (id, node, gpu_index, at, utilization_pct, "
                          "memory_used_mib, healthy) VALUES (:id, :node, :idx, :at, :util, "
                          ":used, :healthy)"), params)
        if healthy != current[idx]:
            events.record(conn, at, "gpu", f"{node}/{idx}", "gpu.health", actor,
                          "probe reading", {"healthy": healthy})
            current[idx] = healthy
        count += 1
    return count
