"""Governance through the REST API inside a real Airflow api-server, with users of three
Airflow roles (SimpleAuthManager): alice (admin), carol (user; made a lead of team vision
here), bob (viewer). Admins manage members; a team's lead (or an admin) freezes the team and
approves the use of its templates; everyone authenticated reads; every change is audited
with who did it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

NEW = [("GET", "/api/teams/vision/members"), ("POST", "/api/teams/vision/members"),
       ("GET", "/api/freezes"), ("POST", "/api/teams/vision/freezes"),
       ("POST", "/api/freezes/x/lift"), ("GET", "/api/templates"),
       ("GET", "/api/templates/x/history"), ("POST", "/api/templates/x/approvals"),
       ("GET", "/api/audit")]


@pytest.mark.parametrize(("method", "path"), NEW)
def test_governance_endpoints_refuse_a_caller_without_token(fleet_server, method, path):
    with fleet_server.client(None) as c:
        assert c.request(method, path, json={}).status_code == 401


def test_roles_decide_who_manages_members_freezes_and_approvals(fleet_server):
    store = fleet_server.store
    store.save_template("vision-ft", {"gpus": 1, "gpu_models": ["T4"]}, "seed", team="vision")
    until = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    # Members: only an admin.
    for user in ("bob", "carol"):
        with fleet_server.client(user) as c:
            resp = c.post("/api/teams/vision/members", json={"user": "carol", "role": "lead"})
        assert resp.status_code == 403, resp.text
    with fleet_server.client("alice") as c:
        resp = c.post("/api/teams/vision/members", json={"user": "carol", "role": "lead"})
    assert resp.status_code == 200 and resp.json()["added_by"] == "alice"
    with fleet_server.client("bob") as c:  # reading is for everyone authenticated
        assert [m["user"] for m in c.get("/api/teams/vision/members").json()] == ["carol"]
        # A viewer who leads nothing may not freeze or approve.
        resp = c.post("/api/teams/vision/freezes", json={"until": until, "reason": "x"})
        assert resp.status_code == 403 and "a lead of team vision" in resp.json()["detail"]
        resp = c.post("/api/templates/vision-ft/approvals", json={"team": "nlp"})
        assert resp.status_code == 403
    with fleet_server.client("carol") as c:
        # carol leads vision, not research.
        resp = c.post("/api/teams/research/freezes", json={"until": until, "reason": "x"})
        assert resp.status_code == 403
        resp = c.post("/api/templates/vision-ft/approvals", json={"team": "nlp"})
        assert resp.status_code == 200 and resp.json()["approved_for"] == ["nlp"]
        resp = c.post("/api/teams/vision/freezes",
                      json={"until": until, "reason": "demo day"})
        assert resp.status_code == 200, resp.text
        freeze = resp.json()
    try:
        assert (freeze["state"], freeze["set_by"]) == ("active", "carol")
        with fleet_server.client("alice") as c:  # even an admin's quota change waits
            resp = c.put("/api/quotas", json={
                "team": "vision", "purpose": "training", "gpus": 11,
                "expires_at": (datetime.now(UTC) + timedelta(days=40)).isoformat()})
        assert resp.status_code == 409
        assert "team vision is frozen" in resp.json()["detail"]
        assert "carol: demo day" in resp.json()["detail"]
    finally:
        with fleet_server.client("carol") as c:
            lifted = c.post(f"/api/freezes/{freeze['id']}/lift")
    assert lifted.status_code == 200 and lifted.json()["state"] == "lifted"
    with fleet_server.client("bob") as c:
        trail = c.get("/api/audit", params={"team": "vision"}).json()
        kinds = [(e["kind"], e["actor"]) for e in trail
                 if e["kind"].split(".")[0] in ("freeze", "template") or "member" in e["kind"]]
        assert kinds == [("template.created", "seed"), ("team.member_added", "alice"),
                         ("template.approved", "carol"), ("freeze.set", "carol"),
                         ("freeze.lifted", "carol")]
        resp = c.get("/api/audit", params={"kind": "nonsense"})
        assert resp.status_code == 422 and "kind" in resp.text
