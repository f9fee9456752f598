/** @module `/healthz`, `/metrics` and the landing page `/`. */

import type { Hono } from "hono";
import type { Metrics } from "../../metrics/prometheus.ts";

/**
 * Registers the operational routes.
 *
 * @param app the Hono app
 * @param deps the metrics registry and the origin names (for the landing page)
 */
export function operationalRoutes(app: Hono, deps: { metrics: Metrics; originNames: readonly string[] }): void {
  app.get("/healthz", (c) => c.json({ status: "ok" }));
  app.get("/metrics", async (c) => {
    const body = await deps.metrics.render();
    return c.body(body, 200, { "content-type": deps.metrics.contentType });
  });
  app.get("/", (c) => c.html(landingPage(deps.originNames)));
}

function landingPage(origins: readonly string[]): string {
  const esc = (s: string) => s.replace(/[&<>"']/g, (ch) => `&#${ch.charCodeAt(0)};`);
  const list = origins.map((o) => `<li><code>/v1/objects/${esc(o)}/{key}</code></li>`).join("");
  return `<!doctype html><html><head><meta charset="utf-8"><title>rackfeed</title>
<style>body{font:15px/1.5 system-ui,sans-serif;max-width:46rem;margin:2rem auto;padding:0 1rem}code{background:#f3f3f3;padding:0 .2rem}</style>
</head><body><h1>rackfeed</h1><p>Rack-local cache and batch server for ML training data.</p>
<h2>Origins</h2><ul>${list || "<li>(none configured)</li>"}</ul>
<h2>Endpoints</h2><ul><li><a href="/metrics">/metrics</a> (Prometheus text)</li><li><a href="/healthz">/healthz</a></li></ul>
</body></html>`;
}
