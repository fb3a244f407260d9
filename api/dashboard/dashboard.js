// Shockwave dashboard: plain JavaScript on the /v1 API, no library, nothing from another host.
// Views: "#/" (cluster, queue, Gantt of recent and planned rounds) and "#/jobs/<id>" (one job).
// The token typed in is kept in sessionStorage (for this tab's session only: closing the tab
// forgets it) and sent as a bearer token. In open mode (the API answers a request without a
// token) none is needed: the page says so and offers no log-in. Job state changes arrive on the
// event stream (/v1/events) and trigger a refresh; a
// timer refreshes every 5 s as well.
"use strict";

const TOKEN_KEY = "shockwave.token";
const REFRESH_MS = 5000;
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
  "#7f7f7f", "#bcbd22", "#17becf"];

const $ = (sel) => document.querySelector(sel);

function esc(text) {
  return String(text ?? "").replace(/[&<>"']/g, (c) => ({
    "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"
  })[c]);
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

let openMode = false;

function headers() {
  const t = openMode ? "" : token();
  return t ? { Authorization: "Bearer " + t } : {};
}

async function detectOpenMode() {
  // Open mode is what the API does, not a setting the page can read: a request without a token
  // that is answered means every request is served as an admin.
  try {
    openMode = (await fetch("/v1/cluster")).ok;
  } catch (error) {
    openMode = false;
  }
  $("#open-mode").hidden = !openMode;
  $("#login").hidden = openMode;
}

class ApiError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path) {
  const response = await fetch(path, { headers: headers() });
  if (!response.ok) {
    let detail = response.statusText;
    try { const body = await response.json(); detail = body.detail || body.title || detail; }
    catch (e) { /* not JSON */ }
    throw new ApiError(response.status, detail);
  }
  return response.json();
}

function say(text, bad) {
  const status = $("#status");
  status.textContent = text || "";
  status.className = bad ? "bad" : "";
}

function shortId(id) { return id ? id.slice(0, 8) : "other tenant"; }

function colorOf(id) {
  let h = 0;
  for (const c of id || "") h = (h * 31 + c.charCodeAt(0)) >>> 0;
  return COLORS[h % COLORS.length];
}

function time(iso) {
  if (!iso) return "";
  return new Date(iso).toLocaleTimeString();
}

function duration(seconds) {
  if (seconds == null) return "";
  const s = Math.round(seconds);
  if (s < 120) return s + " s";
  if (s < 7200) return Math.round(s / 60) + " min";
  return (s / 3600).toFixed(1) + " h";
}

// --- overview --------------------------------------------------------------------------

async function showOverview() {
  $("#overview").hidden = false;
  $("#job").hidden = true;
  const [cluster, nodes, rounds, queue, tenants, usage] = await Promise.all([
    api("/v1/cluster"), api("/v1/nodes?page_size=500"), api("/v1/rounds?limit=20"),
    api("/v1/queue"), api("/v1/tenants"), api("/v1/usage?group_by=tenant"),
  ]);
  $("#who").textContent = cluster.tenant ? "tenant " + cluster.tenant : "all tenants";
  const jobs = Object.entries(cluster.jobs).filter(([, n]) => n).map(([s, n]) => n + " " + s);
  $("#cluster-summary").textContent =
    `${cluster.ready_gpus} of ${cluster.total_gpus} GPUs READY; ` +
    (rounds.current >= 0 ? `round ${rounds.current}` : "no round yet") +
    ` (${rounds.round_seconds} s rounds); jobs: ${jobs.join(", ") || "none"}`;
  renderNodes(nodes.items, rounds);
  renderQueue(queue);
  renderTenants(tenants, usage);
  renderGantt(rounds);
}

function renderTenants(tree, usage) {
  // The tenant tree with each tenant's share now (entitled GPUs against held GPUs) and its
  // GPU-hours over the last day; a user sees its own tenant only.
  const hours = {};
  for (const row of usage.rows) hours[row.key] = row.gpu_hours;
  const items = {};
  for (const t of tree.items) items[t.path] = t;
  const rows = [];
  const add = (path, depth) => {
    const t = items[path];
    const limit = (v) => (v == null ? "—" : String(v));
    rows.push(`<tr class="tenant-row" data-tenant="${esc(t.path)}">` +
      `<td class="tenant-path" data-depth="${depth}">${esc(t.path)}${t.configured ? "" : " *"}</td>` +
      `<td>${t.weight}</td><td>${t.entitled_gpus.toFixed(1)}</td><td>${t.held_gpus}</td>` +
      `<td>${t.active_jobs}</td><td>${limit(t.guaranteed_gpus)}</td><td>${limit(t.max_gpus)}</td>` +
      `<td>${limit(t.max_jobs)}</td><td>${path in hours ? hours[path].toFixed(2) : "—"}</td></tr>`);
    for (const child of t.children) if (child in items) add(child, depth + 1);
  };
  for (const root of tree.roots) add(root, 0);
  $("#tenants tbody").innerHTML = rows.join("") ||
    '<tr><td colspan="9">No tenant has jobs or settings yet.</td></tr>';
  // Indented through the CSSOM: the content security policy refuses inline style attributes.
  for (const cell of document.querySelectorAll("#tenants td.tenant-path")) {
    cell.style.paddingLeft = `${0.3 + Number(cell.dataset.depth) * 1.2}em`;
  }
}

function renderNodes(nodes, rounds) {
  const current = rounds.recent.find((r) => r.index === rounds.current);
  const holder = {};
  for (const held of current ? current.held : []) {
    if (held.state === "REVOKED" || held.state === "LOST" || held.state === "EXITED") continue;
    for (const g of held.gpus) holder[held.node_id + ":" + g] = held;
  }
  const rows = nodes.map((node) => {
    const gpus = [];
    for (let g = 0; g < node.gpus; g++) {
      const held = holder[node.id + ":" + g];
      const label = held ? (held.name || "") + " " + shortId(held.job_id) : "idle";
      const link = held && held.job_id ? `<a href="#/jobs/${esc(held.job_id)}">${esc(label)}</a>` : esc(label);
      const color = held ? ` data-color="${esc(colorOf(held.job_id))}"` : "";
      gpus.push(`<span class="gpu"${color}>GPU ${g}: ${link}</span>`);
    }
    return `<tr class="node-row" data-node="${esc(node.id)}"><td>${esc(node.id)}</td>` +
      `<td class="state-${esc(node.state)}">${esc(node.state)}</td>` +
      `<td>${esc(node.gpu_type || "—")}</td><td>${gpus.join(" ")}</td></tr>`;
  });
  $("#nodes tbody").innerHTML = rows.join("") ||
    '<tr><td colspan="4">No node registered: start one with <code>shockwave agent</code>.</td></tr>';
  // Colours through the CSS object model: the page's Content-Security-Policy allows no inline
  // style attribute.
  for (const gpu of document.querySelectorAll("#nodes .gpu[data-color]")) {
    gpu.style.borderLeft = "6px solid " + gpu.dataset.color;
  }
}

function renderQueue(queue) {
  const rows = queue.map((q) =>
    `<tr class="job-row" data-job="${esc(q.job_id)}">` +
    `<td><a href="#/jobs/${esc(q.job_id)}">${esc(shortId(q.job_id))}</a></td>` +
    `<td>${esc(q.name)}</td><td>${esc(q.tenant)}</td>` +
    `<td class="state-${esc(q.state)}">${esc(q.state)}</td><td>${q.gpus}</td>` +
    `<td>${q.epochs_done.toFixed(0)}/${q.epochs} ep @ bs ${q.batch_size}</td>` +
    `<td>${q.ftf_estimate == null ? "—" : q.ftf_estimate.toFixed(2)}</td><td>${esc(time(q.predicted_start))}</td>` +
    `<td>${esc(time(q.predicted_finish))}</td><td class="why">${esc(q.reason)}</td></tr>`);
  $("#queue tbody").innerHTML = rows.join("") ||
    '<tr><td colspan="10">No active job.</td></tr>';
}

function renderGantt(rounds) {
  // Rows: jobs; columns: rounds. Solid: held in a past or the current round; hatched: planned.
  const cells = [];
  const names = {};
  for (const r of rounds.recent) {
    for (const h of r.held) {
      const id = h.job_id || "(other tenants)";
      names[id] = h.name || "";
      if (!cells.some((c) => c.id === id && c.round === r.index && !c.planned)) {
        cells.push({ id, round: r.index, planned: false, revoked: h.state === "REVOKED" });
      }
    }
  }
  for (const p of rounds.planned) {
    if (p.index <= rounds.current) continue;
    for (const id of p.jobs) {
      if (!(id in names)) names[id] = "";
      cells.push({ id, round: p.index, planned: true });
    }
  }
  const gantt = $("#gantt");
  if (!cells.length) {
    const text = rounds.current >= 0
      ? `No job has held GPUs in the rounds up to round ${rounds.current}, and none is planned.`
      : "No round yet: the first starts when the round driver runs.";
    gantt.innerHTML = `<p id="gantt-empty">${esc(text)}</p>`;
    return;
  }
  const jobs = Object.keys(names);
  const first = Math.min(...cells.map((c) => c.round));
  const last = Math.max(...cells.map((c) => c.round));
  const label = 170, cw = Math.max(14, Math.min(40, 900 / (last - first + 1))), rh = 20, top = 22;
  const width = label + (last - first + 1) * cw + 10;
  const height = top + jobs.length * rh + 10;
  const parts = [`<svg id="gantt-svg" xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" role="img" aria-label="Gantt chart of rounds">`,
    '<defs><pattern id="hatch" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="3" height="6" fill="#999"/></pattern></defs>'];
  for (let r = first; r <= last; r++) {
    const x = label + (r - first) * cw;
    if ((r - first) % Math.ceil(40 / cw) === 0) {
      parts.push(`<text x="${x + 2}" y="14" class="axis">${r}</text>`);
    }
    if (r === rounds.current) {
      parts.push(`<rect x="${x}" y="${top - 4}" width="${cw}" height="${height - top}" class="now"/>`);
    }
  }
  jobs.forEach((id, i) => {
    const y = top + i * rh;
    const text = (names[id] ? names[id] + " " : "") + (id.startsWith("(") ? id : shortId(id));
    parts.push(`<text x="2" y="${y + 14}" class="job-label">${esc(text)}</text>`);
  });
  for (const c of cells) {
    const x = label + (c.round - first) * cw;
    const y = top + jobs.indexOf(c.id) * rh;
    const fill = c.planned ? "url(#hatch)" : colorOf(c.id);
    const cls = c.planned ? "cell planned" : "cell past";
    parts.push(`<rect class="${cls}" data-job="${esc(c.id)}" data-round="${c.round}" x="${x + 1}" y="${y + 2}" width="${cw - 2}" height="${rh - 4}" fill="${fill}" stroke="${colorOf(c.id)}"><title>${esc(c.id)} round ${c.round}${c.planned ? " (planned)" : ""}</title></rect>`);
  }
  parts.push("</svg>");
  gantt.innerHTML = parts.join("") +
    '<p class="legend">Solid: the job held GPUs in that round; hatched: planned; shaded column: the current round.</p>';
}

// --- one job ---------------------------------------------------------------------------

async function showJob(id) {
  $("#overview").hidden = true;
  $("#job").hidden = false;
  const [job, prediction, events, attempts] = await Promise.all([
    api(`/v1/jobs/${encodeURIComponent(id)}`),
    api(`/v1/jobs/${encodeURIComponent(id)}/prediction`),
    api(`/v1/jobs/${encodeURIComponent(id)}/events?page_size=500`),
    api(`/v1/jobs/${encodeURIComponent(id)}/attempts`),
  ]);
  $("#job-title").textContent = `${job.name} (${job.id})`;
  $("#job-summary").innerHTML =
    `<span class="state-${esc(job.state)}">${esc(job.state)}</span>, tenant ${esc(job.tenant)}, ` +
    `${job.gpus} GPU(s), ${job.epochs_done.toFixed(0)}/${job.epochs} epochs, batch size ` +
    `${job.batch_size} (${esc(job.mode)}); FTF estimate ${prediction.ftf_estimate.toFixed(2)}, ` +
    `${duration(prediction.remaining_seconds)} left alone; command: ` +
    `<code>${esc((job.command || []).join(" ") || "none")}</code>`;
  $("#job-why").textContent = prediction.reason;
  renderTimeline(prediction, events.items);
  $("#job-events tbody").innerHTML = events.items.map((e) => {
    let what = "";
    if (e.kind === "state") what = `${e.payload.from || ""} → ${e.payload.to}`;
    else if (e.kind === "progress") what = `epoch ${e.payload.epoch} in ${Number(e.payload.seconds).toFixed(1)} s at bs ${e.payload.batch_size}`;
    else if (e.kind === "scaling") what = `batch size ${e.payload.batch_size} from epoch ${e.payload.epoch}`;
    else if (e.kind === "preemption") what = `round ${e.payload.round} on ${(e.payload.nodes || []).join(", ")}`;
    return `<tr class="event-row kind-${esc(e.kind)}"><td>${esc(time(e.created_at))}</td><td>${esc(e.kind)}</td><td>${esc(what)}</td><td>${esc(e.reason)}</td></tr>`;
  }).join("");
  $("#job-attempts tbody").innerHTML = attempts.map((a) =>
    `<tr class="attempt-row"><td>${esc(shortId(a.attempt_id))}</td><td>${esc(a.node_id)}</td>` +
    `<td>${a.round_index}</td><td>${esc(a.gpus.join(","))}</td><td>${esc(a.state)}</td>` +
    `<td>${a.exit_code ?? ""}</td><td>${esc(a.reason)}</td></tr>`).join("") ||
    '<tr><td colspan="7">Not run yet.</td></tr>';
  const withLog = attempts.filter((a) => a.log_tail != null);
  $("#job-log").textContent = withLog.length ? withLog[withLog.length - 1].log_tail : "(no output yet)";
}

function renderTimeline(prediction, events) {
  // Batch size against epochs: what was observed (solid, up to the epochs done) and what is
  // predicted (dashed: the rest of the current regime and every future one), and a dot at each
  // scaling event.
  const regimes = prediction.regimes;
  if (!regimes.length) { $("#job-timeline").textContent = "(no regime)"; return; }
  const epochs = Math.max(prediction.epochs, 1);
  const sizes = regimes.map((r) => r.batch_size);
  const maxBs = Math.max(...sizes), minBs = Math.min(...sizes);
  const w = 600, h = 150, left = 50, bottom = 25;
  const x = (e) => left + (e / epochs) * (w - left - 10);
  const y = (bs) => (maxBs === minBs) ? h / 2 :
    10 + (1 - (Math.log2(bs) - Math.log2(minBs)) / (Math.log2(maxBs) - Math.log2(minBs))) * (h - bottom - 20);
  const parts = [`<svg id="timeline-svg" xmlns="http://www.w3.org/2000/svg" width="${w}" height="${h}" role="img" aria-label="Batch size over epochs">`];
  const done = prediction.epochs_done;
  const segment = (from, to, bs, phase, kind) => {
    if (to <= from) return;
    const dash = kind === "predicted" ? ' stroke-dasharray="5,4" stroke-opacity="0.7"' : "";
    parts.push(`<line class="regime ${phase} ${kind}" x1="${x(from)}" x2="${x(to)}" y1="${y(bs)}" y2="${y(bs)}" stroke="#1f4e79" stroke-width="3"${dash}/>`);
  };
  let start = 0;
  for (const r of regimes) {
    const end = start + r.epochs;
    if (r.phase === "past") segment(start, end, r.batch_size, r.phase, "observed");
    else if (r.phase === "future") segment(start, end, r.batch_size, r.phase, "predicted");
    else {
      const split = Math.min(Math.max(done, start), end);
      segment(start, split, r.batch_size, r.phase, "observed");
      segment(split, end, r.batch_size, r.phase, "predicted");
    }
    parts.push(`<text x="${x(start) + 2}" y="${y(r.batch_size) - 4}" class="axis">bs ${r.batch_size}</text>`);
    start = end;
  }
  for (const e of events.filter((ev) => ev.kind === "scaling")) {
    parts.push(`<circle class="scaling" cx="${x(e.payload.epoch)}" cy="${y(e.payload.batch_size)}" r="4" fill="#d62728"/>`);
  }
  parts.push(`<line x1="${x(done)}" x2="${x(done)}" y1="5" y2="${h - bottom}" stroke="#888" stroke-dasharray="2,2"/>`);
  parts.push(`<text x="${left}" y="${h - 5}" class="axis">epoch 0</text><text x="${w - 70}" y="${h - 5}" class="axis">epoch ${epochs}</text>`);
  parts.push("</svg>");
  $("#job-timeline").innerHTML = parts.join("") +
    '<p class="legend">Solid: observed; dashed: predicted; red dots: batch-size changes; dotted line: now.</p>';
}

// --- routing, login, live updates ------------------------------------------------------

async function refresh() {
  const hash = location.hash || "#/";
  try {
    const match = hash.match(/^#\/jobs\/(.+)$/);
    if (match) await showJob(decodeURIComponent(match[1]));
    else await showOverview();
    say("Updated " + new Date().toLocaleTimeString());
  } catch (error) {
    if (error.status === 401 && !openMode) say("Log in with your API token (shockwave admin create-token).", true);
    else say("Error: " + error.message, true);
  }
}

let pending = null;
function soon() {
  if (pending) return;
  pending = setTimeout(() => { pending = null; refresh(); }, 300);
}

let streamAbort = null;
async function follow() {
  // The event stream through fetch (EventSource cannot send a bearer token); resumes after
  // the last id it saw.
  if (streamAbort) streamAbort.abort();
  streamAbort = new AbortController();
  let last = null;
  for (;;) {
    try {
      const h = headers();
      if (last) h["Last-Event-ID"] = last;
      const response = await fetch("/v1/events", { headers: h, signal: streamAbort.signal });
      if (!response.ok) return;
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const id = block.match(/^id: (\d+)$/m);
          if (id) { last = id[1]; soon(); }
        }
      }
    } catch (error) {
      if (error.name === "AbortError") return;
    }
    await new Promise((resolve) => setTimeout(resolve, 3000));
  }
}

$("#login").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("#token").value.trim());
  $("#token").value = "";
  refresh();
  follow();
});
$("#logout").addEventListener("click", () => {
  sessionStorage.removeItem(TOKEN_KEY);
  refresh();
  follow();
});
window.addEventListener("hashchange", refresh);
setInterval(refresh, REFRESH_MS);
detectOpenMode().then(() => { refresh(); follow(); });
