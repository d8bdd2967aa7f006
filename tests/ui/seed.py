"""A seeded gpu-pool store for the API and page tests: the demo fleet grown to 200 nodes.

What it holds (times relative to ``now``, the wall clock the api-server also reads):

* the demo's six hosts plus 194 synthetic 8-GPU hosts in three zones: 200 nodes, 1,588 GPUs;
* teams nlp, vision, research, platform with quotas that expire in 60 days (ok), 12 days (amber),
  5 days (red), 20 hours (final) and yesterday (expired);
* a day of history: a placement cycle 20 h ago, half of that work finished 8 h ago (the
  ledger), a second cycle 30 min ago, so some requests run, others wait with the reasons the
  engine persisted;
* one running request linked to an Airflow task instance (``LINKED``), probe readings for
  every GPU (one held GPU idle, one unhealthy), one node draining, one down.

Everything goes through the real :class:`gpu_pool.store.Store` and the real engine.
"""

from __future__ import annotations

import tempfile
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from gpu_pool.cli.demo import demo_org
from gpu_pool.engine import plan
from gpu_pool.model import NodeState, Outcome, Policy
from gpu_pool.spec import parse_nodes, parse_nodes_document, parse_quota, parse_request, parse_team
from gpu_pool.store import Store

ACTOR = "seed"
LINKED = {"name": "llm-finetune-ti", "dag_id": "train_llm", "task_id": "finetune",
          "run_id": "manual__2026-12-01T08:00:00+00:00", "map_index": -1, "try_number": 1}
ZONES = ("eu-west", "us-east", "ap-south")
MODELS = ("A100", "H100", "L4", "T4")
DRAINED, DOWNED = "eu-a100-2", "ap-south-t4-003"
QUOTA_DAYS = {("nlp", "training"): 60, ("nlp", "inference"): 12, ("vision", "training"): 5,
              ("vision", "inference"): 20 / 24, ("research", "pretraining"): -1,
              ("research", "training"): 60}


def _demo(name: str) -> str:
    return resources.files("gpu_pool").joinpath("demo_data", name).read_text()


def synthetic_nodes(count: int = 194) -> list[dict[str, Any]]:
    return [{"name": f"{ZONES[i % 3]}-{MODELS[(i // 3) % 4].lower()}-{i // 12:03d}",
             "zone": ZONES[i % 3], "gpu_model": MODELS[(i // 3) % 4], "gpus": 8, "cpu": 96,
             "memory": "512GiB"} for i in range(count)]


def _cycle(store: Store, policy: Policy, at: datetime) -> None:
    store.apply_plan(plan(store.load_snapshot(policy, at)), now=at, actor=ACTOR, policy=policy)


def seed(store: Store, now: datetime, *, extra_nodes: int = 194,
         bulk: int = 200) -> dict[str, Any]:
    """Fill a migrated, empty store; returns names the tests check for.

    ``extra_nodes`` (at least 48, for the down node) and ``bulk`` size the synthetic part.
    """
    # Off-peak lending off: the seed's story (cycles hours apart) must not depend on the
    # hour the tests run at (a lent placement would be preempted by a later cycle's peak).
    policy = Policy(lend_idle_off_peak=False)
    nodes = parse_nodes_document(_demo("fleet.yaml"), "fleet.yaml", policy=policy)
    extra = synthetic_nodes(extra_nodes)
    nodes += parse_nodes(extra, source="synthetic", policy=policy)
    store.import_nodes(nodes, actor=ACTOR)
    org = demo_org(Path(tempfile.gettempdir()))  # the page shows teams; nothing is sent
    for t in org["teams"]:
        store.upsert_team(parse_team(t), actor=ACTOR)
    for q in org["quotas"]:
        fields = {k: v for k, v in q.items() if k not in ("from_days", "expires_days")}
        fields["valid_from"] = now - timedelta(days=30)
        fields["expires_at"] = now + timedelta(days=QUOTA_DAYS[(q["team"], q["purpose"])])
        store.set_quota(parse_quota(fields, policy=policy), actor=ACTOR)
    store.upsert_team(parse_team({"name": "platform"}), actor=ACTOR)
    store.set_quota(parse_quota({"team": "platform", "purpose": "training", "gpus": 900,
                                 "valid_from": now - timedelta(days=30),
                                 "expires_at": now + timedelta(days=90)}, policy=policy),
                    actor=ACTOR)
    teams = {t.name for t in store.list_teams()}

    early = now - timedelta(hours=20)
    for i, item in enumerate(yaml.safe_load(_demo("queue.yaml"))):
        fields = {k: v for k, v in item.items() if k != "minutes_ago"}
        fields["submitted_at"] = (early if i < 6 else now) - timedelta(minutes=item["minutes_ago"])
        store.submit_request(parse_request(fields, policy=policy, known_teams=teams, nodes=nodes),
                             actor=ACTOR, now=fields["submitted_at"])
    for i in range(bulk):  # background load that fills part of the synthetic fleet
        fields = {"name": f"bulk-{i:03d}", "team": ("nlp", "vision", "research", "platform",
                                                    "platform")[i % 5],
                  "gpus": (1, 2, 4, 8)[i % 4], "gpu_models": MODELS[i % 4], "time_limit": "48h",
                  "submitted_at": early - timedelta(minutes=5)}
        store.submit_request(parse_request(fields, policy=policy, known_teams=teams, nodes=nodes),
                             actor=ACTOR, now=fields["submitted_at"])
    store.submit_request(parse_request(
        {"name": "platform-xzone-embed", "team": "platform", "gpus": 4, "gpu_models": "H100",
         "dataset": "s3://lake/embeds-v1", "dataset_zone": "eu-central", "dataset_size_gib": 300,
         "time_limit": "30h", "submitted_at": early}, policy=policy, known_teams=teams,
        nodes=nodes), actor=ACTOR, now=early)
    link = {k: v for k, v in LINKED.items() if k != "name"}
    ti_request = parse_request({"name": LINKED["name"], "team": "nlp", "gpus": 1,
                                "gpu_models": "H100", "priority": "high", "time_limit": "30h",
                                "submitted_at": early}, policy=policy, known_teams=teams)
    store.submit_request(ti_request, actor=ACTOR, now=early, **link)
    _cycle(store, policy, early)

    finished = sorted({a.request_name for a in store.active_allocations()
                       if a.request_name.startswith("bulk-")})[::2]
    for name in finished:
        store.release_request(name, Outcome.SUCCESS, actor=ACTOR, reason="task succeeded",
                              now=now - timedelta(hours=8), policy=policy)
    # A gang of every H100 node: it waits for capacity, and the work on them has time
    # limits, so the queue shows when it is expected to start.
    wide = now - timedelta(minutes=40)
    h100 = sum(1 for n in nodes if n.gpus and n.gpus[0].model == "H100")
    store.submit_request(parse_request(
        {"name": "platform-wide-gang", "team": "platform", "gpus": 8 * h100, "nodes": h100,
         "gpu_models": "H100", "time_limit": "6h", "submitted_at": wide}, policy=policy,
        known_teams=teams, nodes=nodes), actor=ACTOR, now=wide)
    _cycle(store, policy, now - timedelta(minutes=30))

    held = {(a.node, i) for a in store.active_allocations() for i in a.gpu_indices}
    idle = sorted(held)[0]
    for node in nodes:
        readings = [{"index": g.index, "healthy": (node.name, g.index) != ("eu-t4-1", 3),
                     "utilization_pct": (1.0 if (node.name, g.index) == idle else
                                         87.0 if (node.name, g.index) in held else 0.0),
                     "memory_used_mib": 1024} for g in node.gpus]
        store.record_gpu_readings(node.name, readings, at=now - timedelta(minutes=1))
    store.set_node_state(DRAINED, NodeState.DRAINING, actor=ACTOR, reason="kernel upgrade")
    store.set_node_state(DOWNED, NodeState.DOWN, actor=ACTOR, reason="PSU failure")
    # A policy version, for the Policy panel and /api/policy (nothing the views compute
    # depends on the grace).
    store.set_policy("preemption_grace: 90s\n", "olga", "longer grace for checkpoints")
    return {"nodes": len(nodes), "gpus": sum(n.gpu_count for n in nodes), "idle": idle,
            "finished": finished}
