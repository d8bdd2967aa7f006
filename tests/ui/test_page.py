"""The fleet page in real headless Chromium, served by the real Airflow api-server.

Signs in through the SimpleAuthManager's login page, then checks what a person sees on the
seeded 200-node store: every node and GPU (grouped by zone and model, coloured by status,
holders in the tooltip), the queue with reasons and a team filter, quota countdowns in
amber and red, usage charts, the placement of an Airflow task instance, the page inside the
Airflow UI, and a refresh that shows a store change without reloading. Screenshots go to the
test's tmp dir; with ``GPU_POOL_SCREENSHOT_DIR`` set, the fleet view is also copied there
and the page inside the Airflow UI (``docs/screenshots/refresh.sh`` uses that for
the README).

Browser: Debian's ``chromium`` driven by the ``playwright`` Python package through
``executable_path`` (no browser download).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from gpu_pool.model import NodeState

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

CHROMIUM = Path(shutil.which("chromium") or "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def browser_page(tmp_path_factory: pytest.TempPathFactory):
    from playwright import sync_api  # a test dependency: missing means a broken install

    if not CHROMIUM.exists():  # tests/prereqs.sh installs it before `make test` runs pytest
        pytest.fail("Debian's chromium is not installed: sudo apt-get install -y chromium")
    profile = tmp_path_factory.mktemp("chromium-profile")
    with sync_api.sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), headless=True, args=FLAGS,
            viewport={"width": 1600, "height": 1000})
        page = context.pages[0] if context.pages else context.new_page()
        page.set_default_timeout(60_000)
        yield page
        context.close()


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screenshots")


def _publish(shot: Path, name: str) -> None:
    """Copy a screenshot to ``GPU_POOL_SCREENSHOT_DIR`` (the README's), when it is set."""
    if os.environ.get("GPU_POOL_SCREENSHOT_DIR"):
        target = Path(os.environ["GPU_POOL_SCREENSHOT_DIR"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, target / name)


def _wait_loaded(page, tab: str) -> None:
    page.wait_for_selector(f"body[data-loaded='{tab}']", state="attached")


def test_1_signed_out_page_offers_the_airflow_login(fleet_server, browser_page, shots):
    page = browser_page
    page.goto(f"{fleet_server.base}/gpu-pool/")
    banner = page.locator("#banner")
    banner.wait_for(state="visible")
    assert "Not signed in" in banner.inner_text()
    assert page.locator(".node").count() == 0
    page.screenshot(path=str(shots / "signed-out.png"))


def test_2_sign_in_and_see_every_node_and_gpu(fleet_server, browser_page, shots):
    page = browser_page
    page.goto(f"{fleet_server.base}/auth/login?next=/gpu-pool/")
    page.locator("input[name='username']").fill("bob")
    page.locator("input[name='password']").fill("bob-pass-1")
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url("**/gpu-pool/**")
    _wait_loaded(page, "fleet")
    assert page.locator("#who").inner_text() == "bob"
    assert page.locator(".node").count() == 200
    assert page.locator(".gpu").count() == 1588
    headers = page.locator(".group h2").all_inner_texts()
    assert any(h.startswith("eu-west · A100") for h in headers), headers
    assert "draining" in page.locator("[data-node='eu-a100-2']").get_attribute("class")
    assert "90s" in page.locator("#policy-panel tr[data-key='preemption_grace']").inner_text()
    assert "PSU failure" in page.locator("[data-node='ap-south-t4-003']").inner_text()
    node, index = fleet_server.seeded["idle"]
    assert "idle" in page.locator(f"[data-gpu='{node}/{index}']").get_attribute("class")
    assert "unhealthy" in page.locator("[data-gpu='eu-t4-1/3']").get_attribute("class")
    held = next(a for a in fleet_server.store.active_allocations()
                if a.request_name == "llm-finetune-ti")
    page.locator(f"[data-gpu='{held.node}/{held.gpu_indices[0]}']").hover()
    tip = page.locator("#tooltip")
    tip.wait_for(state="visible")
    assert "held by nlp: llm-finetune-ti" in tip.inner_text()
    assert "until" in tip.inner_text() and "train_llm.finetune" in tip.inner_text()
    summary = page.locator("#summary").inner_text()
    assert summary.startswith("200 nodes · 1588 GPUs")
    page.screenshot(path=str(shots / "fleet.png"), full_page=False)
    page.screenshot(path=str(shots / "fleet-full.png"), full_page=True)
    _publish(shots / "fleet.png", "fleet.png")


def test_3_queue_shows_reasons_wait_priority_and_filters_by_team(fleet_server, browser_page,
                                                                  shots):
    page = browser_page
    page.click("#tabs a[data-tab='queue']")
    _wait_loaded(page, "queue")
    pending = fleet_server.store.pending_requests()
    rows = page.locator("#queue-table tbody tr")
    assert rows.count() == len(pending)
    ablation = page.locator("tr[data-request='research-ablation']")
    code, message = fleet_server.store.request_reason("research-ablation")
    assert message in ablation.inner_text() and code in ablation.inner_text()
    assert "not ready" in ablation.inner_text()
    # Start estimates: the last cycle's, as stored; "unknown" where it gave none.
    estimates = {r.name: fleet_server.store.estimated_start(r.name) for r in pending}
    known = sorted(n for n, at in estimates.items() if at is not None)
    assert known, "the seed's queue waits behind work with time limits: some estimate"
    for name in (known[0], known[-1]):
        cell = page.locator(f"tr[data-request='{name}'] td.estimate")
        assert cell.inner_text() == f"{estimates[name]:%Y-%m-%d %H:%M} UTC"
    unknown = next((n for n, at in estimates.items() if at is None), None)
    if unknown is not None:
        assert page.locator(f"tr[data-request='{unknown}'] td.estimate").inner_text() == "unknown"
    page.screenshot(path=str(shots / "queue.png"))
    page.select_option("#team-filter", "vision")
    page.wait_for_function("() => [...document.querySelectorAll('#queue-table tbody tr')]"
                           ".every(r => r.children[2].textContent === 'vision')")
    vision = [r for r in pending if r.team == "vision"]
    assert rows.count() == len(vision) > 0
    page.select_option("#team-filter", "")


def test_4_quota_countdowns_turn_amber_and_red(fleet_server, browser_page, shots):
    page = browser_page
    page.click("#tabs a[data-tab='quotas']")
    _wait_loaded(page, "quotas")
    def level(key: str) -> str:
        cls = page.locator(f"tr[data-quota='{key}'] td.countdown").get_attribute("class")
        return cls.split("alert-")[1]
    assert level("nlp/training/any") == "ok"
    assert level("nlp/inference/any") == "amber"
    assert level("vision/training/any") == "red"
    assert level("vision/inference/any") == "final"
    assert level("research/pretraining/any") == "expired"
    colour = page.locator("tr[data-quota='nlp/inference/any'] td.countdown").evaluate(
        "e => getComputedStyle(e).backgroundColor")
    assert colour == "rgb(255, 243, 214)"
    page.screenshot(path=str(shots / "quotas.png"))


def test_5_usage_is_drawn_as_charts(fleet_server, browser_page, shots):
    page = browser_page
    page.click("#tabs a[data-tab='usage']")
    _wait_loaded(page, "usage")
    points = page.locator("svg[data-chart='allocation'] polyline").get_attribute("points")
    assert len(points.split()) >= 24
    assert page.locator("svg[data-chart='allocation'] rect").count() > 0  # off-peak shading
    teams = page.locator("svg[data-chart='teams']").inner_html()
    assert "platform" in teams and "GPU-h" in teams
    moves = page.locator("#cross-zone").inner_text()
    assert "platform-xzone-embed" in moves and "expected saving" in moves
    assert page.locator("#cross-zone tr[data-paid]").count() == 1
    assert "wait for data" in page.locator("svg[data-chart='readiness']").inner_html()
    page.select_option("#usage-window", "week")
    page.wait_for_function("() => document.querySelector(\"svg[data-chart='allocation'] "
                           "polyline\").getAttribute('points').split(' ').length >= 28")
    page.screenshot(path=str(shots / "usage.png"))


def test_6_task_instance_link_lands_on_its_placement_and_links_back(fleet_server,
                                                                   browser_page, shots):
    page = browser_page
    page.goto(f"{fleet_server.base}/gpu-pool/?dag_id=train_llm&task_id=finetune&run_id="
              "manual__2026-12-01T08%3A00%3A00%2B00%3A00#placement")
    page.wait_for_selector("#placement-result h3")
    assert page.locator("#placement-result h3").inner_text().startswith("llm-finetune-ti (nlp)")
    back = page.locator("#placement-result a")
    assert back.get_attribute("href") == (
        "/dags/train_llm/runs/manual__2026-12-01T08%3A00%3A00%2B00%3A00/tasks/finetune")
    page.screenshot(path=str(shots / "placement.png"))


def test_7_page_refreshes_without_reload(fleet_server, browser_page):
    page = browser_page
    page.goto(f"{fleet_server.base}/gpu-pool/?refresh=1#fleet")
    _wait_loaded(page, "fleet")
    page.evaluate("window.__sameDocument = true")
    assert "down" not in page.locator("[data-node='us-l4-1']").get_attribute("class")
    fleet_server.store.set_node_state("us-l4-1", NodeState.DOWN, actor="test", reason="unplugged")
    try:
        page.wait_for_selector("[data-node='us-l4-1'].down", timeout=30_000)
        assert page.evaluate("window.__sameDocument") is True
    finally:
        fleet_server.store.set_node_state("us-l4-1", NodeState.UP, actor="test")


def test_8_page_is_in_the_airflow_ui_nav(fleet_server, browser_page, shots):
    page = browser_page
    page.goto(f"{fleet_server.base}/plugin/gpu-pool")
    frame = page.frame_locator("iframe")
    frame.locator(".node").first.wait_for()
    assert page.locator("iframe").get_attribute("src").endswith("/gpu-pool/")
    page.screenshot(path=str(shots / "in-airflow.png"))
    _publish(shots / "in-airflow.png", "fleet-in-airflow.png")


def test_9_audit_lists_every_change_and_filters_by_team(fleet_server, browser_page, shots):
    store = fleet_server.store
    store.add_member("research", "dana", "alice", role="lead")
    store.save_template("research-sweep", {"gpus": 1, "priority": "low"}, "dana",
                        team="research")
    page = browser_page
    page.goto(f"{fleet_server.base}/gpu-pool/#audit")
    _wait_loaded(page, "audit")
    first = page.locator("#audit-table tbody tr").first
    assert first.get_attribute("data-kind") == "template.created"  # newest first
    assert "dana" in first.inner_text() and '"priority":"low"' in first.inner_text()
    page.select_option("#audit-team", "research")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#audit-table tbody tr')].every("
        "r => !r.innerText.includes('nlp-'))")
    kinds = page.locator("#audit-table tbody tr").evaluate_all(
        "rows => rows.map(r => r.dataset.kind)")
    assert kinds[:2] == ["template.created", "team.member_added"]
    page.select_option("#audit-kind", "template")
    page.wait_for_function(
        "() => [...document.querySelectorAll('#audit-table tbody tr')].every("
        "r => r.dataset.kind.startsWith('template.'))")
    page.screenshot(path=str(shots / "audit.png"))
