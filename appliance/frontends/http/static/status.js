// The status page: polls /status.json and draws it. Plain DOM, text only (no innerHTML), so
// nothing in the data can run here. Charts are inline SVG polylines.
"use strict";

const REFRESH_MS = 2000;
const SVG = "http://www.w3.org/2000/svg";

function el(tag, text, cls) {
  const node = document.createElement(tag);
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (cls) node.className = cls;
  return node;
}

function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + " " + units[i];
}

function num(n, digits) {
  return n === null || n === undefined ? "–" : Number(n).toFixed(digits);
}

function when(seconds) {
  if (!seconds) return "never";
  return new Date(seconds * 1000).toLocaleString();
}

function duration(s) {
  const d = Math.floor(s / 86400), h = Math.floor(s / 3600) % 24, m = Math.floor(s / 60) % 60;
  return (d ? d + "d " : "") + (d || h ? h + "h " : "") + m + "m " + Math.floor(s % 60) + "s";
}

function fillList(dl, pairs) {
  dl.replaceChildren();
  for (const [key, value] of pairs) {
    dl.append(el("dt", key), el("dd", value));
  }
}

// The server keeps this many points per model (services/status.py RING_POINTS).
const RING_POINTS = 150;

// A polyline of the last RING_POINTS `values`, newest at the right (missing or null: drawn
// as 0), scaled to the box; `title` for the tooltip.
function chart(kind, recent, title) {
  const width = 160, height = 36, pad = 2;
  const values = Array(Math.max(0, RING_POINTS - recent.length)).fill(null)
    .concat(recent.slice(-RING_POINTS));
  const svg = document.createElementNS(SVG, "svg");
  svg.setAttribute("class", "chart " + kind);
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("preserveAspectRatio", "none");
  const label = document.createElementNS(SVG, "title");
  label.textContent = title;
  svg.append(label);
  const line = document.createElementNS(SVG, "polyline");
  const max = Math.max(1e-9, ...values.map((v) => v || 0));
  const step = values.length > 1 ? (width - 2 * pad) / (values.length - 1) : 0;
  const points = values.map((v, i) => {
    const x = pad + i * step;
    const y = height - pad - ((v || 0) / max) * (height - 2 * pad);
    return x.toFixed(1) + "," + y.toFixed(1);
  });
  line.setAttribute("points", points.join(" "));
  svg.append(line);
  return svg;
}

function renderDevice(data) {
  const s = data.server, d = data.device;
  const badge = document.getElementById("readiness");
  badge.textContent = s.ready ? "ready" : "not ready";
  badge.className = "badge " + (s.ready ? "ok" : "bad");
  const pairs = [
    ["server", `${s.name} ${s.version}` + (s.build.commit ? ` (${s.build.commit})` : "")],
    ["host", d.hostname],
    ["uptime", duration(s.uptime_s)],
    ["CPU", `${num(d.cpu_percent, 1)} % of ${d.cpu_count} (load ${num(d.load_1m, 2)})`],
    ["memory", d.memory_total_bytes
      ? `${bytes(d.memory_total_bytes - d.memory_available_bytes)} used of ` +
        bytes(d.memory_total_bytes)
      : "–"],
    ["model store", `${bytes(d.store_free_bytes)} free of ${bytes(d.store_total_bytes)} ` +
      `(${d.store_path})`],
  ];
  for (const gpu of d.gpus) {
    pairs.push(["GPU " + gpu.uuid,
      `${num(gpu.utilization === null ? null : gpu.utilization * 100, 0)} % busy, ` +
      `${bytes(gpu.memory_used_bytes)} of ${bytes(gpu.memory_total_bytes)}, ` +
      `${num(gpu.power_watts, 1)} W`]);
  }
  if (!d.gpus.length) pairs.push(["GPU", "none seen"]);
  fillList(document.getElementById("device"), pairs);
  const problems = document.getElementById("server-problems");
  problems.replaceChildren(...s.problems.map((p) => el("li", p)));
}

function versionsCell(model) {
  const cell = el("td");
  // A served version's notes that the instances column says already (a CPU fallback).
  const placed = model.instances.map((i) => i.reason).filter((r) => r);
  for (const v of model.versions) {
    const line = el("div");
    line.append(el("span", v.version === null ? "–" : "v" + v.version),
      el("span", " " + (v.state || "not loaded"), "state-" + v.state));
    const reason = v.reason.split("; ")
      .filter((part) => !(v.state === "READY" && placed.some((r) => part.includes(r))))
      .join("; ");
    if (reason) {
      line.append(el("div", reason, v.state === "READY" ? "note" : "reason"));
    }
    cell.append(line);
  }
  return cell;
}

// Instances by version, group and where they run: "2 × CPU" and, for a fallback, the reason.
function instancesCell(model) {
  const cell = el("td", null, "instances");
  const versions = new Set(model.instances.map((i) => i.version));
  const lines = new Map();
  for (const i of model.instances) {
    const where = i.kind.replace("KIND_", "") + (i.gpu === null ? "" : " " + i.gpu);
    const key = [i.version, i.group, where, i.reason].join("\u0000");
    const line = lines.get(key) || { i, where, count: 0 };
    line.count++;
    lines.set(key, line);
  }
  for (const { i, where, count } of lines.values()) {
    const line = el("div", null, "placement kind-" + i.kind);
    line.append(el("span", (versions.size > 1 ? `v${i.version} ` : "") +
      `${i.group}: ${count} × ${where}`, "where"));
    if (i.reason) line.append(el("div", "CPU fallback: " + i.reason, "reason fallback"));
    cell.append(line);
  }
  if (!model.instances.length) {
    const groups = model.instance_groups.map((g) => `${g.count} × ${g.kind.replace("KIND_", "")}`);
    cell.textContent = groups.join(", ") || "–";
  }
  return cell;
}

function renderModels(data) {
  const body = document.querySelector("#models tbody");
  const rows = data.models.map((m) => {
    const tr = el("tr");
    tr.dataset.model = m.name;
    const live = m.live;
    const batching = m.max_batch_size
      ? `max ${m.max_batch_size}` + (m.dynamic_batching
        ? `, dynamic (delay ${m.max_queue_delay_us} µs` +
          (m.preferred_batch_sizes.length ? `, preferred ${m.preferred_batch_sizes}` : "") + ")"
        : "")
      : "none";
    tr.append(
      el("td", m.name + (m.platform ? ` (${m.platform})` : "")),
      el("td", m.state || "not loaded", "state-" + m.state),
      versionsCell(m),
      instancesCell(m),
      el("td", batching),
      el("td", num(live.requests_per_s, 1), "num rate-value"),
      el("td", num(live.p50_ms, 2), "num"),
      el("td", num(live.p99_ms, 2), "num"),
      el("td", num(live.error_rate * 100, 1) + " %", "num"),
    );
    const rate = el("td");
    const points = chartPoints(m.name, live);
    rate.append(chart("rate", points.map((p) => p.requests_per_s), "requests/s"));
    const latency = el("td");
    latency.append(chart("latency", points.map((p) => p.mean_ms), "mean latency, ms"));
    tr.append(rate, latency);
    return tr;
  });
  body.replaceChildren(...rows);
}

function rate(bytesPerS) {
  return bytesPerS === null || bytesPerS === undefined ? "–" : bytes(bytesPerS) + "/s";
}

function downloadItem(d) {
  const item = el("div", null, "download");
  item.dataset.model = d.model;
  const bar = el("progress");
  bar.max = Math.max(1, d.total_bytes);
  bar.value = d.done_bytes;
  const share = d.total_bytes ? Math.floor((100 * d.done_bytes) / d.total_bytes) : 100;
  item.append(el("span", `downloading model '${d.model}' version ${d.version} `), bar,
    el("span", ` ${bytes(d.done_bytes)} of ${bytes(d.total_bytes)} (${share} %), ` +
      rate(d.rate_bytes_s), "download-numbers"));
  return item;
}

function versionList(versions) {
  return versions.length ? versions.map((v) => "v" + v).join(", ") : "none";
}

function switchText(s) {
  if (!s) return "none since start";
  const what = !s.from_versions.length ? `loaded ${versionList(s.to_versions)}`
    : !s.to_versions.length ? `${versionList(s.from_versions)} stopped serving`
      : `${versionList(s.from_versions)} → ${versionList(s.to_versions)}`;
  return `${what} at ${when(s.time_s)}`;
}

function renderModelUpdates(u) {
  const body = document.querySelector("#model-updates tbody");
  body.replaceChildren(...u.models.map((m) => {
    const tr = el("tr");
    tr.dataset.model = m.name;
    const held = el("td");
    if (m.rollback) {
      held.append(el("div", `v${m.rollback.version} rolled back` +
        (m.rollback.time_s ? ` at ${when(m.rollback.time_s)}` : "") + ": " + m.rollback.reason,
      "reason rollback"));
    }
    for (const f of m.failures) {
      if (f.stage === "probation") continue;
      held.append(el("div", `v${f.version} held back (${f.stage}): ${f.reason}`, "reason"));
    }
    if (!held.childNodes.length) held.textContent = "–";
    tr.append(el("td", m.name), el("td", versionList(m.serving)),
      el("td", switchText(m.last_switch), "switch"),
      el("td", m.last_good === null ? "–" : "v" + m.last_good),
      el("td", m.pinned === null ? "–" : "v" + m.pinned), held);
    return tr;
  }));
}

function renderUpdates(data) {
  const u = data.updates;
  fillList(document.getElementById("updates"), [
    ["model control", u.control_mode],
    ["local repositories", u.local_repositories.join(", ") || "none"],
    ["polling", u.poll_interval_s === null ? "off" : `every ${u.poll_interval_s} s`],
    ["last poll", u.last_poll_s === null ? "none yet" : when(u.last_poll_s)],
  ]);
  const list = document.getElementById("sources");
  list.replaceChildren(...u.sources.map((s) => {
    const reach = s.reachable === null ? "not synced yet" : s.reachable ? "reachable" : "unreachable";
    const item = el("li", `${s.url}: ${reach}, last sync ` +
      `${when(s.last_sync_s)}, ${bytes(s.downloaded_bytes)} downloaded`);
    if (s.download) item.append(downloadItem(s.download));
    if (s.frozen_since_s) item.append(el("div", `updates frozen since ${when(s.frozen_since_s)}`, "reason"));
    if (s.last_error) item.append(el("div", s.last_error, "reason"));
    for (const p of s.pending) item.append(el("div", "pending: " + p, "note"));
    return item;
  }));
  renderModelUpdates(u);
}

// The memory budget (docs/memory.md): the bar, and each model resident, loading, evicted or
// not loaded yet; the section stays hidden on a server without the budget's flags.
function renderMemory(data) {
  const m = data.memory;
  const section = document.getElementById("memory-section");
  section.hidden = !m;
  if (!m) return;
  const bar = document.getElementById("memory-used");
  bar.max = m.budget_bytes || 1;
  bar.value = m.budget_bytes ? Math.min(m.used_bytes, m.budget_bytes) : 0;
  document.getElementById("memory-text").textContent = (m.budget_bytes
    ? `${bytes(m.used_bytes)} of ${bytes(m.budget_bytes)} (${m.budget_source})`
    : `${bytes(m.used_bytes)}, no budget`) +
    `; ${m.loads_on_demand} loads on demand, ${m.unloads} unloads, ${m.refusals} refused` +
    (m.load_on_demand ? "" : "; loads on demand off") +
    (m.idle_unload_secs ? `; unloaded after ${m.idle_unload_secs} s idle` : "");
  document.querySelector("#memory tbody").replaceChildren(...m.models.map((x) => {
    const tr = el("tr");
    tr.dataset.model = x.name;
    const state = x.state.replace("_", " ") + (x.pinned ? " (pinned)" : "");
    const estimate = x.estimate_bytes
      ? bytes(x.estimate_bytes) + (x.estimate_measured ? " (measured)" : " (files)") : "–";
    tr.append(el("td", x.name), el("td", state, "memory-" + x.state),
      el("td", x.bytes ? bytes(x.bytes) : "–", "num"), el("td", estimate, "num"),
      el("td", x.idle_s === null ? "–" : duration(x.idle_s), "num"),
      el("td", x.reason, "note"));
    return tr;
  }));
}

function renderProblems(data) {
  const body = document.querySelector("#problems tbody");
  const rows = data.recent_problems.slice().reverse().map((p) => {
    const tr = el("tr");
    tr.append(el("td", when(p.time_s)), el("td", p.level, "level-" + p.level),
      el("td", p.model || "–"), el("td", p.message));
    return tr;
  });
  if (!rows.length) {
    const tr = el("tr");
    const td = el("td", "none", "muted");
    td.colSpan = 4;
    tr.append(td);
    rows.push(tr);
  }
  body.replaceChildren(...rows);
}

// The charts' points by model: each poll asks only for the points after the newest one drawn
// (?since=), and the server says how many it holds (ring_points), so a model whose ring started
// again (it stopped serving) or a restarted server never leaves old points here.
const drawn = new Map();
let since = 0;
let serverStarted = null;

function chartPoints(name, live) {
  const kept = (drawn.get(name) || []).concat(live.points);
  const points = live.ring_points ? kept.slice(-live.ring_points) : [];
  drawn.set(name, points);
  return points;
}

function forget(data) {
  if (data.server.started_s !== serverStarted) {  // another server process: start afresh
    serverStarted = data.server.started_s;
    drawn.clear();
    return true;
  }
  const names = new Set(data.models.map((m) => m.name));
  for (const name of drawn.keys()) if (!names.has(name)) drawn.delete(name);
  return false;
}

async function refresh() {
  const updated = document.getElementById("updated");
  try {
    const response = await fetch("/status.json?since=" + since, { cache: "no-store" });
    if (!response.ok) throw new Error(`HTTP ${response.status}`);
    let data = await response.json();
    if (forget(data) && since) {  // the points before `since` came from another process
      since = 0;
      data = await (await fetch("/status.json", { cache: "no-store" })).json();
      serverStarted = data.server.started_s;
    }
    renderDevice(data);
    renderModels(data);
    renderUpdates(data);
    renderMemory(data);
    renderProblems(data);
    for (const m of data.models) {
      const last = m.live.points[m.live.points.length - 1];
      if (last && last.time_s > since) since = last.time_s;
    }
    updated.textContent = "updated " + new Date(data.generated_s * 1000).toLocaleTimeString();
  } catch (err) {
    updated.textContent = "cannot reach the server: " + err.message;
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

document.addEventListener("DOMContentLoaded", refresh);
