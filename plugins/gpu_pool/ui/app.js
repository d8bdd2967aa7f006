// gpu-pool fleet page: fetches the REST API (api/...) every REFRESH_S seconds and redraws the
// visible tab in place. Data is only ever inserted as text (never as HTML), so names coming
// from the store cannot inject markup. Charts are inline SVG.
"use strict";

// ?refresh=N sets the period (tests use a short one); 15 s otherwise.
const REFRESH_S = Number(new URLSearchParams(location.search).get("refresh")) || 15;
const STATUSES = ["free", "held", "partial", "idle", "draining", "down", "unhealthy"];
const SVG = "http://www.w3.org/2000/svg";
const state = { tab: "fleet", team: "", window: "day", timer: null };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function svg(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

async function api(path) {
  const resp = await fetch("api/" + path, { credentials: "same-origin" });
  if (resp.status === 401 || resp.status === 403) {
    const login = "/auth/login?next=" + encodeURIComponent(location.pathname + location.search);
    showBanner("Not signed in to Airflow. ", el("a", { href: login, target: "_top" }, "Sign in"));
    throw new Error("not authenticated");
  }
  const body = await resp.json();
  if (!resp.ok) throw new Error(body.detail || resp.statusText);
  return body;
}

function showBanner(...content) {
  const b = document.getElementById("banner");
  b.replaceChildren(...content);
  b.hidden = false;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  const neg = seconds < 0;
  let s = Math.abs(seconds);
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60);
  const text = d ? `${d}d ${h}h` : h ? `${h}h ${m}m` : `${m}m`;
  return neg ? `-${text}` : text;
}

function when(iso) {
  return iso ? iso.replace("T", " ").slice(0, 16) + " UTC" : "-";
}

function taskAnchor(task) {
  if (!task) return null;
  const label = `${task.dag_id}.${task.task_id}` + (task.map_index >= 0 ? `[${task.map_index}]` : "");
  return task.airflow_url ? el("a", { href: task.airflow_url, target: "_top" }, label) : label;
}

// -- fleet --------------------------------------------------------------------------------

function gpuTooltip(node, gpu) {
  const lines = [`${node.name} GPU ${gpu.index} · ${gpu.model} · ${Math.round(gpu.memory_mib / 1024)} GiB`,
    `status: ${gpu.status}` + (gpu.utilization_pct !== null ? ` · util ${gpu.utilization_pct}%` : "")];
  if (node.state !== "up") lines.push(`node ${node.state}${node.state_reason ? ": " + node.state_reason : ""}`);
  for (const h of gpu.holders) {
    const share = h.share_milli < 1000 ? ` (${h.share_milli / 10}% share)` : "";
    const lent = h.borrowed_from === null || h.borrowed_from === undefined ? ""
      : ` · borrowed from ${h.borrowed_from ? "team " + h.borrowed_from : "capacity no guarantee covers"}`;
    const night = h.off_peak ? " · off-peak, beyond quota until the peak" : "";
    lines.push(`held by ${h.team}: ${h.request}${share}${lent}${night}`,
      `  since ${when(h.since)} until ${when(h.until)}` + (h.task ? `\n  task ${h.task.dag_id}.${h.task.task_id}` : ""));
  }
  return lines.join("\n");
}

function renderFleet(data) {
  const counts = STATUSES.map((s) => `${data.summary.by_status[s] || 0} ${s}`).join(" · ");
  document.getElementById("summary").textContent =
    `${data.summary.nodes} nodes · ${data.summary.gpus} GPUs · ${counts}`;
  document.getElementById("legend").replaceChildren(...STATUSES.map((s) =>
    el("span", {}, el("i", { class: `swatch ${s}` }), s)));
  const groups = data.groups.map((g) => {
    const gpus = g.nodes.reduce((n, x) => n + x.gpus.length, 0);
    const free = g.nodes.reduce((n, x) => n + x.gpus.filter((u) => u.status === "free").length, 0);
    return el("div", { class: "group", "data-zone": g.zone, "data-model": g.gpu_model || "none" },
      el("h2", {}, `${g.zone} · ${g.gpu_model || "no GPU"} — ${g.nodes.length} nodes, ${free}/${gpus} GPUs free`),
      el("div", { class: "nodes" }, g.nodes.map((n) =>
        el("div", { class: `node ${n.state}`, "data-node": n.name },
          el("div", { class: "name" }, n.name),
          el("div", { class: "state" }, n.state === "up" ? n.tier : `${n.state}${n.state_reason ? ": " + n.state_reason : ""}`),
          el("div", { class: "gpus" }, n.gpus.map((u) => {
            const cell = el("div", { class: `gpu ${u.status}`, "data-gpu": `${n.name}/${u.index}` });
            cell.dataset.tip = gpuTooltip(n, u);
            return cell;
          }))))));
  });
  document.getElementById("fleet-groups").replaceChildren(...groups);
  const shares = (data.fair_share || []).map((f) => el("tr", { "data-team": f.team },
    el("td", {}, f.rank), el("td", {}, f.team), el("td", {}, f.decayed_gpu_hours.toFixed(1))));
  document.querySelector("#fair-share-table tbody").replaceChildren(...shares);
}

// The sharing policy in force: its version and the values that differ from the defaults.
function renderPolicy(p) {
  const who = p.version ? `v${p.version} by ${p.set_by} at ${when(p.set_at)}` : "defaults (no version set)";
  const changed = p.values.filter((v) => !v.is_default);
  const text = (v) => (typeof v === "object" ? JSON.stringify(v) : String(v));
  document.getElementById("policy-panel").replaceChildren(
    el("h2", {}, "Policy ", el("span", { class: "muted", "data-version": String(p.version) }, who)),
    changed.length
      ? el("table", {}, el("tbody", {}, changed.map((v) => el("tr", { "data-key": v.key },
        el("td", {}, v.key), el("td", {}, text(v.value)), el("td", { class: "muted" }, v.source)))))
      : el("p", { class: "muted" }, "every value is the default"));
}

function wireTooltip() {
  const tip = document.getElementById("tooltip");
  const root = document.getElementById("fleet-groups");
  root.addEventListener("mouseover", (e) => {
    const t = e.target.closest(".gpu");
    if (!t) { tip.hidden = true; return; }
    tip.textContent = t.dataset.tip;
    tip.hidden = false;
  });
  root.addEventListener("mousemove", (e) => {
    tip.style.left = Math.min(e.clientX + 12, innerWidth - 370) + "px";
    tip.style.top = (e.clientY + 12) + "px";
  });
  root.addEventListener("mouseleave", () => { tip.hidden = true; });
}

// -- queue --------------------------------------------------------------------------------

function renderQueue(data) {
  const select = document.getElementById("team-filter");
  const options = [el("option", { value: "" }, "all teams"),
    ...data.teams.map((t) => el("option", { value: t, selected: t === state.team }, t))];
  select.replaceChildren(...options);
  document.getElementById("queue-count").textContent =
    ` ${data.items.length} shown of ${data.total} waiting, in the order they would be placed`;
  const rows = data.items.map((r) => el("tr", { "data-request": r.name },
    el("td", {}, r.position),
    el("td", {}, r.name, r.task ? el("div", { class: "muted" }, taskAnchor(r.task)) : null),
    el("td", {}, r.team),
    el("td", { class: `pri-${r.priority}` }, r.priority),
    el("td", {}, r.shape + (r.gpu_models.length ? ` (${r.gpu_models.join("|")})` : "")),
    el("td", {}, duration(r.waited_s)),
    el("td", { class: "estimate" }, r.estimated_start ? when(r.estimated_start) : "unknown"),
    el("td", {}, r.data_ready ? "ready" : "not ready"),
    el("td", {}, (r.team_decayed_gpu_hours || 0).toFixed(1)),
    el("td", { class: "reason" }, r.reason_message || "not yet considered by a placement cycle",
      r.reason_code ? el("div", {}, el("code", {}, r.reason_code)) : null)));
  document.querySelector("#queue-table tbody").replaceChildren(...rows);
}

// -- quotas -------------------------------------------------------------------------------

function renderQuotas(data) {
  const rows = data.quotas.map((q) => el("tr", { "data-quota": `${q.team}/${q.purpose}/${q.gpu_model || "any"}` },
    el("td", {}, q.team), el("td", {}, q.purpose), el("td", {}, q.gpu_model || "any"),
    el("td", {}, q.gpus), el("td", {}, q.in_use), el("td", {}, q.borrow_limit_gpus),
    el("td", {}, q.gpu_hour_budget === null ? `${q.budget_used_gpu_hours} GPU-h`
      : `${q.budget_used_gpu_hours} / ${q.gpu_hour_budget} GPU-h`),
    el("td", {}, when(q.expires_at)),
    el("td", { class: `countdown alert-${q.alert}`, title: `alerts at ${data.alert_days.join(", ")} days` },
      q.alert === "expired" ? `expired ${duration(-q.expires_in_s)} ago` : duration(q.expires_in_s))));
  document.querySelector("#quota-table tbody").replaceChildren(...rows);
}

// -- usage charts -------------------------------------------------------------------------

function allocationChart(data) {
  const W = 560, H = 200, L = 36, B = 22, n = Math.max(data.buckets.length, 1);
  const top = Math.max(data.capacity_gpus, 1);
  const bw = (W - L) / n;
  const y = (v) => H - B - (v / top) * (H - B - 8);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "data-chart": "allocation" });
  data.buckets.forEach((b, i) => {
    if (b.off_peak) g.append(svg("rect", { x: L + i * bw, y: 0, width: bw, height: H - B, fill: "#eef1f8" }));
  });
  const pts = data.buckets.map((b, i) => `${L + i * bw + bw / 2},${y(b.gpus_held)}`).join(" ");
  g.append(svg("polyline", { points: pts, fill: "none", stroke: "#3b6fd8", "stroke-width": 2 }));
  g.append(svg("line", { x1: L, x2: W, y1: y(top), y2: y(top), stroke: "#d6453d", "stroke-dasharray": "4 3" }));
  g.append(svg("text", { x: 2, y: y(top) + 4 }, top), svg("text", { x: 2, y: H - B }, 0));
  const step = Math.ceil(n / 8);
  data.buckets.forEach((b, i) => {
    if (i % step === 0) g.append(svg("text", { x: L + i * bw, y: H - 6 }, b.start.slice(5, 13).replace("T", " ")));
  });
  return g;
}

function teamChart(data) {
  const W = 560, rowH = 22, L = 90, H = Math.max(data.teams.length, 1) * rowH + 10;
  const max = Math.max(...data.teams.map((t) => t.gpu_hours), 1);
  const g = svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "data-chart": "teams" });
  data.teams.forEach((t, i) => {
    const w = (t.gpu_hours / max) * (W - L - 150);
    g.append(svg("text", { x: 0, y: i * rowH + 15 }, t.team),
      svg("rect", { x: L, y: i * rowH + 4, width: Math.max(w, 1), height: rowH - 8, fill: "#3b6fd8" }),
      svg("text", { x: L + w + 6, y: i * rowH + 15 }, `${t.gpu_hours.toFixed(1)} GPU-h · $${t.cost.toFixed(2)}`));
  });
  if (!data.teams.length) g.append(svg("text", { x: 0, y: 15 }, "no finished allocations in this window"));
  return g;
}

function readinessChart(r) {
  const W = 560, H = 40, total = Math.max(r.waiting, 1), w = ((W - 10) * r.ready) / total;
  return svg("svg", { viewBox: `0 0 ${W} ${H}`, width: "100%", role: "img", "data-chart": "readiness" },
    svg("rect", { x: 0, y: 4, width: W - 10, height: 16, fill: "#e0a526" }),
    svg("rect", { x: 0, y: 4, width: w, height: 16, fill: "#2e9d5b" }),
    svg("text", { x: 0, y: 36 }, `${r.ready} of ${r.waiting} waiting requests have their data ready; ${r.not_ready} wait for data`));
}

function renderUsage(data) {
  document.getElementById("chart-alloc").replaceChildren(allocationChart(data));
  document.getElementById("alloc-stats").textContent =
    `average GPUs held: peak ${data.peak_avg_gpus}, off-peak ${data.off_peak_avg_gpus} of ${data.capacity_gpus}`;
  document.getElementById("chart-teams").replaceChildren(teamChart(data));
  document.getElementById("chart-ready").replaceChildren(readinessChart(data.readiness));
  // expected: what the engine expected the move to save (null: no known end at home);
  // saved: measured from when the home zone had room (at least, while it has had none).
  const moves = data.cross_zone.map((m) => el("tr", { "data-paid": m.paid }, el("td", {}, m.request), el("td", {}, m.team),
    el("td", {}, `${m.from_zone} → ${m.to_zone}`), el("td", {}, `${m.size_gib} GiB`), el("td", {}, duration(m.transfer_s)),
    el("td", {}, m.expected_wait_saved_s === null ? "no known end" : duration(m.expected_wait_saved_s)),
    el("td", {}, m.home_room_at ? duration(m.actual_wait_saved_s) : `≥ ${duration(m.actual_wait_saved_s)}`),
    el("td", { class: `paid-${m.paid}` }, m.paid)));
  document.getElementById("cross-zone").replaceChildren(
    el("div", { class: "muted" }, `${data.cross_zone_summary || "no cross-zone moves"}; a move paid when its home zone had no room for it for at least its transfer time`),
    el("table", {}, el("thead", {}, el("tr", {}, ["request", "team", "zones", "size", "transfer", "expected saving", "saved", "paid"].map((h) => el("th", {}, h)))),
      el("tbody", {}, moves)));
}

// -- placement (the link from an Airflow task instance lands here) -------------------------

async function renderPlacement() {
  const params = new URLSearchParams(location.search);
  const form = document.getElementById("placement-form");
  for (const k of ["request", "dag_id", "task_id", "run_id", "map_index"]) {
    if (params.get(k) && !form.elements[k].value) form.elements[k].value = params.get(k);
  }
  const query = new URLSearchParams();
  for (const k of ["request", "dag_id", "task_id", "run_id", "map_index"]) {
    if (form.elements[k].value) query.set(k, form.elements[k].value);
  }
  const out = document.getElementById("placement-result");
  if (![...query.keys()].length) { out.replaceChildren(el("p", { class: "muted" }, "Pick a request or a task instance.")); return; }
  try {
    const p = await api("placement?" + query);
    out.replaceChildren(
      el("h3", {}, `${p.request} (${p.team}) — ${p.state}`),
      p.task ? el("p", {}, "Airflow task: ", taskAnchor(p.task)) : null,
      p.reason_message ? el("p", {}, "Waits: ", p.reason_message) : null,
      p.estimated_start ? el("p", { class: "estimate" }, "Expected to start: ", when(p.estimated_start)) : null,
      el("ul", {}, p.allocations.map((a) => el("li", {},
        `${a.node} GPUs ${a.gpu_indices.join(",")} (${a.gpu_model}) since ${when(a.started_at)} until ${when(a.ends_by)}`))));
  } catch (err) {
    out.replaceChildren(el("p", { class: "banner" }, err.message));
  }
}

// -- audit --------------------------------------------------------------------------------

function shortJson(value) {
  if (value === null || value === undefined) return "";
  const text = JSON.stringify(value);
  return text.length > 160 ? text.slice(0, 157) + "..." : text;
}

function renderAudit(events) {
  const rows = events.slice().reverse().map((e) => el("tr", { "data-kind": e.kind },
    el("td", {}, when(e.at)), el("td", {}, el("code", {}, e.kind)), el("td", {}, e.subject),
    el("td", {}, e.actor), el("td", { class: "json" }, shortJson(e.before)),
    el("td", { class: "json" }, shortJson(e.after)), el("td", {}, e.reason || "")));
  document.querySelector("#audit-table tbody").replaceChildren(...rows);
}

function auditQuery() {
  const q = new URLSearchParams({ limit: "200" });
  if (state.auditTeam) q.set("team", state.auditTeam);
  if (state.auditKind) q.set("kind", state.auditKind);
  return "audit?" + q.toString();
}

// -- refresh loop -------------------------------------------------------------------------

async function refresh() {
  try {
    if (state.tab === "fleet") { renderFleet(await api("fleet")); renderPolicy(await api("policy")); }
    else if (state.tab === "queue") renderQueue(await api("queue" + (state.team ? "?team=" + encodeURIComponent(state.team) : "")));
    else if (state.tab === "quotas") renderQuotas(await api("quotas"));
    else if (state.tab === "usage") renderUsage(await api("usage?window=" + state.window));
    else if (state.tab === "placement") await renderPlacement();
    else if (state.tab === "audit") {
      const select = document.getElementById("audit-team");
      if (select.options.length === 1) {
        for (const t of (await api("queue?limit=1")).teams) select.append(el("option", { value: t }, t));
      }
      renderAudit(await api(auditQuery()));
    }
    if (state.tab !== "fleet" && !document.getElementById("summary").textContent) renderFleet(await api("fleet"));
    document.getElementById("updated").textContent = "updated " + new Date().toISOString().slice(11, 19) + " UTC";
    document.body.dataset.loaded = state.tab;
  } catch (err) {
    if (err.message !== "not authenticated") showBanner(err.message);
  }
}

function show(tab) {
  state.tab = document.getElementById(tab) ? tab : "fleet";
  for (const s of document.querySelectorAll(".tab")) s.hidden = s.id !== state.tab;
  for (const a of document.querySelectorAll("#tabs a")) a.classList.toggle("active", a.dataset.tab === state.tab);
  delete document.body.dataset.loaded;
  refresh();
}

async function start() {
  wireTooltip();
  document.getElementById("team-filter").addEventListener("change", (e) => { state.team = e.target.value; refresh(); });
  document.getElementById("usage-window").addEventListener("change", (e) => { state.window = e.target.value; refresh(); });
  document.getElementById("audit-team").addEventListener("change", (e) => { state.auditTeam = e.target.value; refresh(); });
  document.getElementById("audit-kind").addEventListener("change", (e) => { state.auditKind = e.target.value; refresh(); });
  document.getElementById("placement-form").addEventListener("submit", (e) => { e.preventDefault(); renderPlacement(); });
  addEventListener("hashchange", () => show(location.hash.slice(1)));
  try {
    const me = await api("me");
    document.getElementById("who").textContent = `${me.user}${me.can_admin ? " (fleet admin)" : ""}`;
  } catch (err) { /* the banner says why */ }
  show(location.hash.slice(1) || "fleet");
  state.timer = setInterval(refresh, REFRESH_S * 1000);
}

start();
