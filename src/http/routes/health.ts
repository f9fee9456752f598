/** @module `/healthz` and `/metrics`. */

import type { Hono } from "hono";
import type { Metrics } from "../../metrics/prometheus.ts";
import { routeDoc } from "../route-docs.ts";

/**
 * Registers the operational routes.
 *
 * @param app the Hono app
 * @param deps the metrics registry
 */
export function operationalRoutes(app: Hono, deps: { metrics: Metrics }): void {
  app.get("/healthz", routeDoc("operations", "Liveness: {\"status\":\"ok\"}"), (c) => c.json({ status: "ok" }));
  app.get("/metrics", routeDoc("operations", "Prometheus text exposition"), async (c) => {
    const body = await deps.metrics.render();
    return c.body(body, 200, { "content-type": deps.metrics.contentType });
  });
}
