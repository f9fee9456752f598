/** @module `/healthz` and `/metrics`. */

import type { Hono } from "hono";
import type { Metrics } from "../../metrics/prometheus.ts";

/**
 * Registers the operational routes.
 *
 * @param app the Hono app
 * @param deps the metrics registry
 */
export function operationalRoutes(app: Hono, deps: { metrics: Metrics }): void {
  app.get("/healthz", (c) => c.json({ status: "ok" }));
  app.get("/metrics", async (c) => {
    const body = await deps.metrics.render();
    return c.body(body, 200, { "content-type": deps.metrics.contentType });
  });
}
