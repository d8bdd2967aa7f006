"""The gpu-pool REST API inside a real Airflow api-server, on the seeded store of ``seed``.

Covers authentication (401 without a token on every endpoint), authorisation (a viewer
cannot change a quota or drain a node; an admin can, and the store records who), bad input
(422 naming the parameter, the value and what is valid) and each endpoint's content.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpu_pool.engine.types import ReasonCode
from gpu_pool.model import PriorityClass

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

ENDPOINTS = [("GET", "/api/me"), ("GET", "/api/fleet"), ("GET", "/api/queue"),
             ("GET", "/api/quotas"), ("GET", "/api/allocations"), ("GET", "/api/ledger"),
             ("GET", "/api/usage"), ("GET", "/api/events"), ("GET", "/api/policy"),
             ("GET", "/api/placement?request=x"), ("PUT", "/api/quotas"),
             ("POST", "/api/nodes/eu-t4-1/state")]


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_every_endpoint_refuses_a_caller_without_token(fleet_server, method, path):
    with fleet_server.client(None) as c:
        resp = c.request(method, path, json={"state": "down"})
    assert resp.status_code == 401, resp.text


def test_a_forged_token_is_refused(fleet_server):
    with fleet_server.client(None) as c:
        resp = c.get("/api/fleet", headers={"Authorization": "Bearer not.a.jwt"})
    assert resp.status_code in (401, 403)


def test_me_says_who_may_change_the_fleet(fleet_server):
    for user, admin in (("alice", True), ("olga", True), ("bob", False)):
        with fleet_server.client(user) as c:
            assert c.get("/api/me").json() == {"user": user, "can_admin": admin}


def _quota_body(**over):
    body = {"team": "vision", "purpose": "training", "gpus": 10,
            "expires_at": (datetime.now(UTC) + timedelta(days=40)).isoformat()}
    return {**body, **over}


def test_a_viewer_cannot_change_a_quota_or_drain_a_node(fleet_server):
    before = {(q.team, q.purpose, q.gpu_model): q.gpus for q in fleet_server.store.list_quotas()}
    with fleet_server.client("bob") as c:
        resp = c.put("/api/quotas", json=_quota_body(gpus=999))
        assert resp.status_code == 403
        assert "bob" in resp.json()["detail"] and "gpu_pool" in resp.json()["detail"]
        assert c.post("/api/nodes/eu-t4-1/state", json={"state": "draining"}).status_code == 403
    after = {(q.team, q.purpose, q.gpu_model): q.gpus for q in fleet_server.store.list_quotas()}
    assert after == before
    assert str(fleet_server.store.get_node("eu-t4-1").state) == "up"


def test_an_admin_changes_a_quota_and_the_store_records_who(fleet_server):
    with fleet_server.client("alice") as c:
        resp = c.put("/api/quotas", json=_quota_body(team="research", purpose="inference",
                                                     gpus=3, gpu_hour_budget=500))
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert (out["team"], out["purpose"], out["gpus"], out["gpu_hour_budget"]) == (
        "research", "inference", 3.0, 500.0)
    assert out["alert"] == "ok"
    events = [e for e in fleet_server.store.events(subject=out["id"])
              if e.kind.startswith("quota.")]
    assert events and events[-1].actor == "alice"


def test_an_admin_drains_and_undrains_a_node_recorded_with_reason(fleet_server):
    with fleet_server.client("alice") as c:
        resp = c.post("/api/nodes/us-l4-2/state", json={"state": "draining",
                                                        "reason": "firmware update"})
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"node": "us-l4-2", "state": "draining", "changed": True,
                               "actor": "alice"}
        node = next(n for g in c.get("/api/fleet").json()["groups"] for n in g["nodes"]
                    if n["name"] == "us-l4-2")
        assert node["state_reason"] == "firmware update"
        assert {g["status"] for g in node["gpus"]} == {"draining"}
        assert c.post("/api/nodes/us-l4-2/state", json={"state": "up"}).json()["changed"]
        node = next(n for g in c.get("/api/fleet").json()["groups"] for n in g["nodes"]
                    if n["name"] == "us-l4-2")
        assert (node["state"], node["state_reason"]) == ("up", None)  # not "firmware update"
    last = [e for e in fleet_server.store.events(subject="us-l4-2") if e.kind == "node.state"]
    assert [(e.actor, e.data["to"]) for e in last[-2:]] == [("alice", "draining"), ("alice", "up")]


BAD_INPUT = [
    ("GET", "/api/queue?team=nobody", None, "team: got 'nobody'; expected a known team"),
    ("GET", "/api/queue?limit=0", None, "limit: got '0'"),
    ("GET", "/api/usage?window=month", None, "window: got 'month'"),
    ("GET", "/api/ledger?since=yesterday", None, "since: got 'yesterday'"),
    ("GET", "/api/ledger?since=2026-12-02T00:00:00Z&until=2026-12-01T00:00:00Z", None,
     "until: got '2026-12-01T00:00:00+00:00'; expected a time after since"),
    ("GET", "/api/allocations?node=no-such-node", None, "no node named 'no-such-node'"),
    ("GET", "/api/placement", None, "request: got None; expected a request name"),
    ("GET", "/api/placement?request=ghost", None, "no request named 'ghost'"),
    ("PUT", "/api/quotas", _quota_body(gpus=-1), "gpus: got -1; Input should be greater"),
    ("PUT", "/api/quotas", _quota_body(colour="red"), "colour: got 'red'; Extra inputs"),
    ("PUT", "/api/quotas", _quota_body(team="ghosts"), "team: got 'ghosts'; expected a known team"),
    ("PUT", "/api/quotas", _quota_body(gpu_model="Z80"), "gpu_model: got"),
    ("PUT", "/api/quotas", _quota_body(purpose="fun"), "purpose: got 'fun'; Input should be"),
    ("PUT", "/api/quotas", _quota_body(valid_from="2030-01-01T00:00:00Z"),
     "expires_at: got"),
    # Before the year 1 once moved to UTC (found by the schema fuzzer: it was a 500).
    ("PUT", "/api/quotas", _quota_body(expires_at="0001-01-01T00:00:00+00:01"),
     "expires_at: got '0001-01-01T00:00:00+00:01'; expected a time that stays within"),
    ("GET", "/api/ledger?since=0001-01-01T00:00:00%2B00:01", None,
     "since: got '0001-01-01T00:00:00+00:01'"),
    ("POST", "/api/nodes/eu-t4-1/state", {"state": "melted"}, "state: got 'melted'"),
    ("POST", "/api/nodes/ghost-1/state", {"state": "down"}, "no node named 'ghost-1'"),
]


@pytest.mark.parametrize(("method", "path", "body", "message"), BAD_INPUT)
def test_bad_input_is_a_4xx_that_names_parameter_value_and_fix(fleet_server, method, path,
                                                               body, message):
    with fleet_server.client("alice") as c:
        resp = c.request(method, path, json=body)
    assert resp.status_code in (404, 422), resp.text
    assert message in resp.json()["detail"], resp.json()["detail"]


def test_fleet_shows_every_node_and_gpu_grouped_by_zone_and_model(fleet_server):
    with fleet_server.client("bob") as c:
        fleet = c.get("/api/fleet").json()
    assert fleet["summary"]["nodes"] == 200 and fleet["summary"]["gpus"] == 1588
    assert sum(fleet["summary"]["by_status"].values()) == 1588
    keys = [(g["zone"], g["gpu_model"]) for g in fleet["groups"]]
    assert keys == sorted(keys) and len(keys) == len(set(keys))
    nodes = {n["name"]: n for g in fleet["groups"] for n in g["nodes"]}
    for g in fleet["groups"]:
        assert all(n["zone"] == g["zone"] and n["gpu_model"] == g["gpu_model"] for n in g["nodes"])
    assert nodes["eu-a100-2"]["state"] == "draining"
    assert nodes["ap-south-t4-003"]["state_reason"] == "PSU failure"
    assert nodes["eu-t4-1"]["gpus"][3]["status"] == "unhealthy"
    idle_node, idle_index = fleet_server.seeded["idle"]
    assert nodes[idle_node]["gpus"][idle_index]["status"] == "idle"
    held = [g for n in nodes.values() for g in n["gpus"] if g["holders"]]
    held_ids = {(a.node, i) for a in fleet_server.store.active_allocations() for i in a.gpu_indices}
    assert len(held) == len(held_ids)
    linked = [h for g in held for h in g["holders"] if h["request"] == "llm-finetune-ti"]
    assert linked and linked[0]["task"]["airflow_url"] == (
        "/dags/train_llm/runs/manual__2026-12-01T08%3A00%3A00%2B00%3A00/tasks/finetune")
    assert linked[0]["until"] is not None and linked[0]["team"] == "nlp"


def test_queue_is_in_placement_order_with_persisted_reasons(fleet_server):
    with fleet_server.client("bob") as c:
        queue = c.get("/api/queue").json()
        pending = {r.name for r in fleet_server.store.pending_requests()}
        assert queue["total"] == len(pending) == len(queue["items"])
        assert {i["name"] for i in queue["items"]} == pending
        ranks = [PriorityClass(i["priority"]).rank for i in queue["items"]]
        assert ranks == sorted(ranks)
        for item in queue["items"]:
            assert item["reason_code"] in set(ReasonCode), item
            assert (item["reason_code"], item["reason_message"]) == \
                fleet_server.store.request_reason(item["name"])
            assert item["waited_s"] > 0
        assert any(not i["data_ready"] and i["reason_code"] == "data_not_ready"
                   for i in queue["items"])
        # Start estimates as the last cycle stored them; only for work waiting for capacity.
        for item in queue["items"]:
            stored = fleet_server.store.estimated_start(item["name"])
            got = item["estimated_start"]
            assert (got is None) == (stored is None), item
            if got is not None:
                assert datetime.fromisoformat(got.replace("Z", "+00:00")) == stored
                assert item["reason_code"] == "waiting_for_capacity"
        wide = c.get("/api/placement", params={"request": "platform-wide-gang"}).json()
        assert wide["state"] == "pending" and wide["estimated_start"] is not None
        vision = c.get("/api/queue", params={"team": "vision"}).json()
        assert vision["items"] and {i["team"] for i in vision["items"]} == {"vision"}
        assert [i["position"] for i in vision["items"]] == sorted(
            i["position"] for i in queue["items"] if i["team"] == "vision")


def test_quotas_show_use_budget_and_countdown_levels(fleet_server):
    with fleet_server.client("bob") as c:
        quotas = {(q["team"], q["purpose"]): q for q in c.get("/api/quotas").json()["quotas"]}
    levels = {k: quotas[k]["alert"] for k in (("nlp", "training"), ("nlp", "inference"),
                                               ("vision", "training"), ("vision", "inference"),
                                               ("research", "pretraining"))}
    assert levels == {("nlp", "training"): "ok", ("nlp", "inference"): "amber",
                      ("vision", "training"): "red", ("vision", "inference"): "final",
                      ("research", "pretraining"): "expired"}
    usage = fleet_server.store.quota_usage(datetime.now(UTC))
    for q in quotas.values():
        assert q["in_use"] == usage[q["id"]]
    assert quotas[("platform", "training")]["budget_used_gpu_hours"] > 0


def test_allocations_ledger_usage_and_events(fleet_server):
    with fleet_server.client("bob") as c:
        allocs = c.get("/api/allocations", params={"team": "nlp"}).json()
        assert allocs and {a["team"] for a in allocs} == {"nlp"}
        ledger = c.get("/api/ledger").json()
        assert {e["request"] for e in ledger} >= set(fleet_server.seeded["finished"])
        assert all(e["gpu_hours"] > 0 and e["outcome"] == "success" for e in ledger)
        day = c.get("/api/usage", params={"window": "day"}).json()
        assert len(day["buckets"]) in (24, 25) and day["capacity_gpus"] == 1588
        assert any(b["off_peak"] for b in day["buckets"]) and any(
            not b["off_peak"] for b in day["buckets"])
        assert max(b["gpus_held"] for b in day["buckets"]) > 0
        teams = {t["team"]: t for t in day["teams"]}
        assert teams["platform"]["gpu_hours"] == pytest.approx(
            sum(e["gpu_hours"] for e in ledger if e["team"] == "platform"), rel=1e-3)
        assert [m["request"] for m in day["cross_zone"]] == ["platform-xzone-embed"]
        assert day["readiness"]["not_ready"] == 1
        week = c.get("/api/usage", params={"window": "week"}).json()
        assert week["bucket_s"] == 6 * 3600 and len(week["buckets"]) >= 28
        events = c.get("/api/events", params={"limit": 5}).json()
        assert len(events) == 5


def test_policy_shows_values_sources_and_history_and_follows_the_store(fleet_server):
    store = fleet_server.store
    with fleet_server.client("bob") as c:
        body = c.get("/api/policy").json()
        assert (body["version"], body["set_by"]) == (store.policy_version(), "olga")
        values = {v["key"]: v for v in body["values"]}
        assert values["preemption_grace"] == {
            "key": "preemption_grace", "value": "90s", "is_default": False,
            "source": store.policy_history()[0].label}
        assert values["reserve_after"]["source"] == "default"
        assert [h["version"] for h in body["history"]][0] == 1
        # The app reads the store's policy per request: a new version shows at once.
        version = store.set_policy("preemption_grace: 2m\n", "alice", "even longer")
        try:
            again = c.get("/api/policy").json()
            assert (again["version"], again["set_by"]) == (version, "alice")
            assert {v["key"]: v["value"] for v in again["values"]}["preemption_grace"] == "2m"
        finally:
            store.restore_policy(1, "olga")  # the page test expects v1's values


def test_placement_of_a_task_instance_links_both_ways(fleet_server):
    with fleet_server.client("bob") as c:
        by_task = c.get("/api/placement", params={
            "dag_id": "train_llm", "task_id": "finetune",
            "run_id": "manual__2026-12-01T08:00:00+00:00"}).json()
        assert by_task["request"] == "llm-finetune-ti" and by_task["state"] == "running"
        assert by_task["allocations"] and by_task["task"]["dag_id"] == "train_llm"
        by_name = c.get("/api/placement", params={"request": "llm-finetune-ti"}).json()
        assert by_name == by_task
        missing = c.get("/api/placement", params={"dag_id": "x", "task_id": "y"})
        assert missing.status_code == 404


def test_the_plugin_is_mounted_and_in_the_airflow_nav(fleet_server):
    import httpx

    headers = {"Authorization": f"Bearer {fleet_server.token('bob')}"}
    plugins = httpx.get(f"{fleet_server.base}/api/v2/plugins", headers=headers).json()
    ours = [p for p in plugins["plugins"] if p["name"] == "gpu_pool"]
    assert ours, plugins
    assert ours[0]["external_views"][0]["href"] == "/gpu-pool/"
    assert ours[0]["fastapi_apps"][0]["url_prefix"] == "/gpu-pool"
    page = httpx.get(f"{fleet_server.base}/gpu-pool/")
    assert page.status_code == 200 and "GPU pool" in page.text
