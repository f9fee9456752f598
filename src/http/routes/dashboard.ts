/**
 * @module The live dashboard at `GET /` and its data, `GET /v1/status`. No build step: the page
 * is server-rendered HTML with a small inline script that polls the status document once a
 * second and keeps the hit-ratio history client-side.
 */

import type { Hono } from "hono";
import type { ServerStatus } from "../../metrics/status.ts";
import { READ, routeDoc } from "../route-docs.ts";

/**
 * Registers `/` and `/v1/status`.
 *
 * @param app the Hono app
 * @param deps the status snapshot
 */
export function dashboardRoutes(app: Hono, deps: { status: () => Promise<ServerStatus> | ServerStatus }): void {
  app.get("/v1/status", routeDoc("operations", "The server's state as one JSON document (what the dashboard draws)", { responses: READ }), async (c) => c.json(await deps.status()));
  app.get("/", routeDoc("operations", "The live dashboard page (HTML)"), (c) => c.html(DASHBOARD_HTML, 200, { "cache-control": "no-store" }));
}

const DASHBOARD_HTML = `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rackfeed</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 14px/1.45 system-ui, sans-serif; margin: 0; background: #f6f7f9; color: #1d2330; }
  header { background: #1d2330; color: #fff; padding: .7rem 1.2rem; display: flex; gap: 1rem; align-items: baseline; }
  header h1 { font-size: 1.15rem; margin: 0; } header span { opacity: .7; }
  main { display: grid; grid-template-columns: repeat(auto-fit, minmax(22rem, 1fr)); gap: 1rem; padding: 1rem 1.2rem; }
  section { background: #fff; border-radius: 8px; padding: .8rem 1rem; box-shadow: 0 1px 2px #0001; }
  h2 { font-size: .95rem; margin: 0 0 .5rem; text-transform: uppercase; letter-spacing: .04em; color: #566; }
  .big { font-size: 2rem; font-weight: 600; } .muted { color: #778; }
  table { width: 100%; border-collapse: collapse; font-variant-numeric: tabular-nums; }
  td, th { padding: .2rem .3rem; text-align: left; border-bottom: 1px solid #eee; } th { color: #778; font-weight: 500; }
  progress { width: 8rem; } .bar { height: .6rem; background: #e5e8ee; border-radius: 3px; overflow: hidden; }
  .bar > div { height: 100%; background: #3a7bd5; } svg { width: 100%; height: 70px; }
  .err { color: #b3261e; }
</style></head>
<body>
<header><h1>rackfeed</h1><span id="uptime">connecting…</span><span id="error" class="err"></span></header>
<main>
  <section><h2>Cache hit ratio</h2>
    <div class="big" id="hit-ratio" data-value="">–</div>
    <div class="muted">memory hits <b id="memory-hits">–</b> · disk hits <b id="disk-hits">–</b> · misses <b id="misses">–</b></div>
    <svg id="hit-history" viewBox="0 0 120 40" preserveAspectRatio="none"><polyline fill="none" stroke="#3a7bd5" stroke-width="1.5" points=""/></svg>
  </section>
  <section><h2>Tiers</h2><table>
    <tr><th>tier</th><th>used</th><th>budget</th><th>blocks</th><th></th></tr>
    <tr><td>memory</td><td id="memory-bytes">–</td><td id="memory-budget">–</td><td id="memory-blocks">–</td><td><div class="bar"><div id="memory-fill" style="width:0"></div></div></td></tr>
    <tr><td>disk</td><td id="disk-bytes">–</td><td id="disk-budget">–</td><td id="disk-blocks">–</td><td><div class="bar"><div id="disk-fill" style="width:0"></div></div></td></tr>
  </table></section>
  <section><h2>Origins</h2><table id="origins"><tr><th>origin</th><th>read</th><th>throughput</th><th>errors</th><th>in flight</th></tr></table></section>
  <section><h2>Consumers</h2><table id="consumers"><tr><th>dataset</th><th>rank/world × mb</th><th>step</th><th>look-ahead</th><th>step time</th></tr></table></section>
  <section><h2>Datasets</h2><table id="datasets"><tr><th>dataset</th><th>batches</th><th>served</th><th>hit ratio</th></tr></table></section>
  <section><h2>Prefetch jobs</h2><table id="prefetch"><tr><th>job</th><th>state</th><th>progress</th><th>rate</th><th>ETA</th></tr></table></section>
  <section><h2>Slow batches</h2><div class="muted" id="slow-counts">–</div>
    <table id="slow"><tr><th>when</th><th>dataset</th><th>request</th><th>ms</th><th>cause</th></tr></table></section>
</main>
<script>
"use strict";
const token = new URLSearchParams(location.search).get("token");
const headers = token ? { authorization: "Bearer " + token } : {};
const history = [];
let last = null;
const fmt = (n) => { const u = ["B", "KiB", "MiB", "GiB", "TiB"]; let i = 0; while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; } return (i ? n.toFixed(1) : String(n)) + " " + u[i]; };
const pct = (r) => r === null ? "–" : (100 * r).toFixed(1) + "%";
const text = (id, v) => { document.getElementById(id).textContent = v; };
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => "&#" + c.charCodeAt(0) + ";");
function rows(id, list, cells) {
  const t = document.getElementById(id);
  while (t.rows.length > 1) t.deleteRow(1);
  if (list.length === 0) { t.insertRow().innerHTML = '<td colspan="5" class="muted">none</td>'; return; }
  for (const x of list) t.insertRow().innerHTML = cells(x).map((c) => "<td>" + c + "</td>").join("");
}
function draw(s) {
  const seconds = last ? Math.max(0.001, s.uptimeSeconds - last.uptimeSeconds) : 1;
  text("uptime", "up " + s.uptimeSeconds.toFixed(0) + " s");
  const hr = document.getElementById("hit-ratio");
  hr.textContent = pct(s.cache.hitRatio); hr.dataset.value = s.cache.hitRatio === null ? "" : String(s.cache.hitRatio);
  text("memory-hits", s.cache.hits.memory); text("disk-hits", s.cache.hits.disk); text("misses", s.cache.misses);
  history.push(s.cache.hitRatio === null ? 0 : s.cache.hitRatio); if (history.length > 120) history.shift();
  document.querySelector("#hit-history polyline").setAttribute("points", history.map((v, i) => (i * 120 / Math.max(1, history.length - 1)).toFixed(1) + "," + (40 - 38 * v).toFixed(1)).join(" "));
  for (const tier of ["memory", "disk"]) {
    const t = s.cache.tiers[tier];
    const el = document.getElementById(tier + "-bytes");
    el.textContent = t ? fmt(t.bytes) : "off"; el.dataset.value = t ? String(t.bytes) : "";
    text(tier + "-budget", t ? fmt(t.budgetBytes) : "–"); text(tier + "-blocks", t ? t.blocks : "–");
    document.getElementById(tier + "-fill").style.width = t ? (100 * t.bytes / t.budgetBytes).toFixed(1) + "%" : "0";
  }
  rows("origins", s.origins, (o) => {
    const before = last && last.origins.find((p) => p.name === o.name);
    const rate = before ? (o.bytes - before.bytes) / seconds : 0;
    return [esc(o.name), '<span data-origin-bytes="' + o.bytes + '">' + fmt(o.bytes) + "</span>", fmt(Math.round(rate)) + "/s", o.errors, o.active + " (+" + o.queued + " queued)"];
  });
  rows("consumers", s.consumers, (c) => [esc(c.dataset), c.rank + "/" + c.world + " × " + c.microBatch, c.step,
    c.stepsBuffered + " steps, " + c.secondsBuffered.toFixed(2) + " s", (1000 * c.stepSeconds).toFixed(1) + " ms"]);
  rows("datasets", s.datasets, (d) => [esc(d.name), d.batches, fmt(d.bytes), pct(d.hitRatio)]);
  rows("prefetch", s.prefetch, (p) => [esc(p.id) + '<div class="muted">' + esc(p.what) + "</div>", p.state,
    '<progress max="' + Math.max(1, p.bytesTotal) + '" value="' + p.bytesDone + '"></progress> ' + fmt(p.bytesDone) + " / " + fmt(p.bytesTotal),
    fmt(Math.round(p.rate)) + "/s", p.etaSeconds === null ? "–" : p.etaSeconds.toFixed(1) + " s"]);
  const by = s.slowBatches.byCause;
  text("slow-counts", by ? Object.entries(by).map(([k, v]) => k + " " + v).join(" · ") : "–");
  rows("slow", s.slowBatches.recent, (b) => [esc(b.at.slice(11, 19)), esc(b.dataset), esc(b.request), (1000 * b.seconds).toFixed(1), esc(b.cause)]);
  last = s;
}
async function tick() {
  try {
    const res = await fetch("/v1/status", { headers });
    if (!res.ok) throw new Error("HTTP " + res.status);
    draw(await res.json());
    text("error", "");
    document.body.dataset.ready = "1";
  } catch (e) { text("error", "cannot read /v1/status: " + e.message); }
  setTimeout(tick, 1000);
}
tick();
</script>
</body></html>`;
