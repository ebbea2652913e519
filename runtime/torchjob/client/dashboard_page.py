"""The dashboard's one page (``torchjob.client.dashboard``): plain HTML, CSS and JavaScript,
no framework and nothing fetched from elsewhere (clusters are often offline). Routes are the
URL's fragment: ``#/jobs``, ``#/job/<namespace>/<name>``, ``#/studies``. Each view asks the
server again every two seconds."""

PAGE = r"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>torchjob</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body{font:14px system-ui,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2430;color:#fff;padding:10px 18px;display:flex;gap:18px;align-items:center}
header a{color:#cfd8e6;text-decoration:none}header a.on{color:#fff;font-weight:600}
main{padding:14px 18px}h2{font-size:17px;margin:18px 0 8px}
table{border-collapse:collapse;background:#fff;width:100%;font-size:13px}
th,td{text-align:left;padding:5px 8px;border-bottom:1px solid #e4e7ec;white-space:nowrap}
th{background:#eef1f5;font-weight:600}td.msg{white-space:normal}
.Running{color:#137333}.Failed{color:#b3261e}.Restarting{color:#b06000}.Succeeded{color:#1a56b0}
pre{background:#10141b;color:#d7e0ea;padding:10px;overflow:auto;max-height:260px;font-size:12px}
.muted{color:#6b7480}svg{background:#fff;border:1px solid #e4e7ec}
#status{margin-left:auto;font-size:12px;color:#9aa6b5}
</style></head><body>
<header><strong>torchjob</strong><a href="#/jobs" id="nav-jobs">Jobs</a>
<a href="#/studies" id="nav-studies">Studies</a><span id="status"></span></header>
<main id="view">loading…</main>
<script>
"use strict";
const REFRESH_MS = 2000;
let timer = null;
const esc = s => String(s ?? "").replace(/[&<>"']/g, c => ({"&":"&amp;","<":"&lt;",">":"&gt;",'"':"&quot;","'":"&#39;"}[c]));
const num = (v, d=2) => v == null ? "-" : Number(v).toFixed(d);
const pct = v => v == null ? "-" : (100 * v).toFixed(0) + "%";
const age = s => s == null ? "-" : s < 120 ? `${s.toFixed(0)}s` : s < 7200 ? `${(s/60).toFixed(0)}m` : `${(s/3600).toFixed(1)}h`;
function table(cols, rows, id) {
  return `<table id="${id}"><thead><tr>${cols.map(c => `<th>${esc(c)}</th>`).join("")}</tr></thead>` +
    `<tbody>${rows.map(r => `<tr>${r.map(c => c.html ? `<td class="${c.cls||""}">${c.html}</td>` : `<td>${esc(c)}</td>`).join("")}</tr>`).join("")}</tbody></table>`;
}
async function get(url) {
  const r = await fetch(url, {cache: "no-store"});
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}
function rate(j) { return j.stepsPerSecond == null ? "-" : `${num(j.stepsPerSecond)} ${esc(j.rateUnit)}/s`; }
function jobsView(jobs) {
  const rows = jobs.map(j => [
    {html: `<a href="#/job/${encodeURIComponent(j.namespace)}/${encodeURIComponent(j.name)}">${esc(j.namespace)}/${esc(j.name)}</a>`},
    {html: esc(j.phase), cls: j.phase}, j.worldSize, j.workers, j.generation, rate(j),
    pct(j.goodput), age(j.ageSeconds),
    j.lastLoss ? `gen ${j.lastLoss.generation}: ${j.lastLoss.cause}` : "-"]);
  return `<h2>Jobs (${jobs.length})</h2>` +
    table(["job", "phase", "world", "workers", "gen", "rate", "goodput", "age", "last loss"], rows, "jobs");
}
function timeline(d) {
  const pts = d.timeline; const W = 900, H = 220, L = 40, R = 40, T = 14, B = 24;
  const marks = (d.history || []).filter(h => h.cause !== "Start").map(h => ({t: Date.parse(h.began) / 1000, cause: h.cause, gen: h.generation}));
  const t0 = Math.min(...pts.map(p => p.t), ...marks.map(m => m.t), d.now - 60), t1 = Math.max(d.now, t0 + 1);
  const x = t => L + (W - L - R) * (t - t0) / (t1 - t0);
  const maxW = Math.max(1, ...pts.map(p => p.world));
  const rates = [];
  for (let i = 1; i < pts.length; i++) {
    const a = pts[i-1], b = pts[i];
    if (a.step != null && b.step != null && b.t > a.t) rates.push({t: b.t, r: Math.max(0, (b.step - a.step) / (b.t - a.t))});
  }
  const maxR = Math.max(0.001, ...rates.map(p => p.r));
  const yW = w => H - B - (H - B - T) * w / maxW, yR = r => H - B - (H - B - T) * r / maxR;
  const world = pts.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${yW(p.world).toFixed(1)}`).join("");
  const rate = rates.map((p, i) => `${i ? "L" : "M"}${x(p.t).toFixed(1)},${yR(p.r).toFixed(1)}`).join("");
  const lines = marks.map(m => `<g class="loss" data-cause="${esc(m.cause)}" data-generation="${m.gen}"><line x1="${x(m.t)}" x2="${x(m.t)}" y1="${T}" y2="${H-B}" stroke="#b3261e" stroke-dasharray="4 3"/>` +
    `<text x="${x(m.t) > W - 140 ? x(m.t) - 3 : x(m.t) + 3}" text-anchor="${x(m.t) > W - 140 ? "end" : "start"}" y="${T+10}" font-size="11" fill="#b3261e">gen ${m.gen}: ${esc(m.cause)}</text></g>`).join("");
  return `<svg id="timeline" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">` +
    `<path d="${world}" fill="none" stroke="#1a56b0" stroke-width="2"/><path d="${rate}" fill="none" stroke="#137333" stroke-width="1.5"/>${lines}` +
    `<text x="${L}" y="${H-6}" font-size="11" fill="#1a56b0">world size (max ${maxW})</text>` +
    `<text x="${L+170}" y="${H-6}" font-size="11" fill="#137333">${esc(d.rateUnit)}/s (max ${maxR.toFixed(2)})</text>` +
    `<text x="${W-R}" y="${H-6}" font-size="11" text-anchor="end" fill="#6b7480">last ${age(t1 - t0)}</text></svg>`;
}
function jobView(d) {
  const hist = (d.history || []).map(h => [h.generation, (h.began || "").slice(0, 19).replace("T", " "), {html: esc(h.cause), cls: "cause"},
    h.worldSize, (h.left || []).join(", ") || "-", (h.joined || []).join(", ") || "-", h.restoredFrom || "-",
    h.recoverySeconds == null ? "-" : h.recoverySeconds.toFixed(1) + "s", h.stepsLost ?? "-", {html: esc(h.detail), cls: "msg"}]);
  const conds = (d.conditions || []).map(c => [c.type, c.status, c.reason, {html: esc(c.message), cls: "msg"}]);
  const evs = (d.events || []).map(e => [e.type, e.reason, e.time.slice(0, 19), {html: esc(e.message), cls: "msg"}]);
  return `<h2>${esc(d.namespace)}/${esc(d.name)} <span class="${esc(d.phase)}">${esc(d.phase)}</span></h2>` +
    `<p class="muted">generation ${d.generation}, world size ${d.worldSize}, workers ${esc(d.workers)}, ${rate(d)}, ` +
    `goodput ${pct(d.goodput)}, ${d.restarts} restarts charged, ${d.disruptions} disruptions</p>` +
    timeline(d) + `<h2>Generations</h2>` +
    table(["gen", "began", "cause", "world", "left", "joined", "from", "recovery", "lost", "detail"], hist, "history") +
    `<h2>Conditions</h2>` + table(["type", "status", "reason", "message"], conds, "conditions") +
    `<h2>Events</h2>` + table(["type", "reason", "last seen", "message"], evs, "events") +
    `<h2>Rank 0's log</h2><pre id="log">${esc((d.log || []).join("\n"))}</pre>`;
}
function studiesView(studies) {
  return `<h2>Studies (${studies.length})</h2>` + studies.map(s => {
    const done = s.trials.filter(t => t.value != null);
    const W = 420, H = 160, P = 24, vals = done.map(t => t.value);
    const lo = Math.min(...vals), hi = Math.max(...vals), n = Math.max(1, s.trials.length - 1);
    const dots = done.map(t => `<circle cx="${P + (W - 2*P) * t.number / n}" cy="${H - P - (H - 2*P) * (hi > lo ? (t.value - lo) / (hi - lo) : 0.5)}" r="4" fill="${s.best && s.best.number === t.number ? "#b3261e" : "#1a56b0"}"/>`).join("");
    const rows = s.trials.map(t => [t.number, {html: `<a href="#/job/${encodeURIComponent(s.namespace)}/${encodeURIComponent(t.name)}">${esc(t.name)}</a>`},
      t.state, t.value == null ? "-" : num(t.value, 4), JSON.stringify(t.params)]);
    return `<h2>${esc(s.namespace)}/${esc(s.name)} <span class="${esc(s.phase)}">${esc(s.phase)}</span></h2>` +
      `<p class="muted">${esc(s.metric)} (${esc(s.mode)}), ${esc(s.progress)}; best: ${s.best ? esc(s.best.name) + " = " + num(s.best.value, 4) : "-"}</p>` +
      `<svg width="${W}" height="${H}" class="objective">${dots}</svg>` + table(["#", "trial", "state", "value", "params"], rows, "trials-" + s.name);
  }).join("");
}
async function render() {
  clearTimeout(timer);
  const route = (location.hash || "#/jobs").slice(2).split("/").map(decodeURIComponent);
  document.getElementById("nav-jobs").className = route[0] !== "studies" ? "on" : "";
  document.getElementById("nav-studies").className = route[0] === "studies" ? "on" : "";
  const started = performance.now();
  try {
    let html;
    if (route[0] === "job") html = jobView(await get(`/api/job/${encodeURIComponent(route[1])}/${encodeURIComponent(route[2])}`));
    else if (route[0] === "studies") html = studiesView(await get("/api/studies"));
    else html = jobsView(await get("/api/jobs"));
    document.getElementById("view").innerHTML = html;
    window.lastRenderMs = performance.now() - started;
    document.getElementById("status").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (e) {
    document.getElementById("status").textContent = `error: ${e.message}`;
  }
  timer = setTimeout(render, REFRESH_MS);
}
window.addEventListener("hashchange", render);
render();
</script></body></html>
"""
