/** @module `/prefetch`: start, watch (JSON or Server-Sent Events) and cancel warm jobs. Admin token required. */

import type { Hono } from "hono";
import { streamSSE } from "hono/streaming";
import { badRequest } from "../../errors.ts";
import { parsePrefetchRequest, type PrefetchJobs, type PrefetchProgress } from "../../prefetch/prefetch-jobs.ts";
import { bearerAuth } from "../middleware/bearer-auth.ts";
import type { RequestBodies } from "../middleware/request-bodies.ts";
import { ADMIN, bodyBound, routeDoc } from "../route-docs.ts";

/** The admin routes of one job. */
const OF_JOB = { ...ADMIN, responses: { ...ADMIN.responses, 404: { description: "Unknown job (finished jobs past the most remembered are forgotten, oldest first)" } } };

/** Largest prefetch request body. */
const MAX_PREFETCH_BYTES = 1 << 20;

/** How often a prefetch event stream with no progress to send gets a comment line instead (ms). */
export const SSE_KEEP_ALIVE_MS = 15_000;

/**
 * Registers the prefetch routes.
 *
 * @param app the Hono app
 * @param deps the jobs, the admin token, the request-body budget, and how often a quiet event
 *   stream gets a comment line (default `SSE_KEEP_ALIVE_MS`)
 */
export function prefetchRoutes(
  app: Hono,
  deps: { jobs: PrefetchJobs; adminToken: string | undefined; requestBodies: RequestBodies; keepAliveMs?: number },
): void {
  const keepAliveMs = deps.keepAliveMs ?? SSE_KEEP_ALIVE_MS;
  app.use("/prefetch", bearerAuth({ token: deps.adminToken, required: true, role: "admin" }));
  app.use("/prefetch/*", bearerAuth({ token: deps.adminToken, required: true, role: "admin" }));

  app.post(
    "/prefetch",
    routeDoc("prefetch", "Start a warm job by object prefix or dataset steps (admin)", {
      ...ADMIN,
      requestBody: { required: true, content: { "application/json": { schema: { type: "object" } } } },
      responses: { ...ADMIN.responses, 202: { description: "Started; the body is the job's progress" }, ...bodyBound(MAX_PREFETCH_BYTES) },
    }),
    deps.requestBodies.limit(MAX_PREFETCH_BYTES, "Prefetch request too large: at most 1 MiB of JSON"),
    async (c) => {
      let body: unknown;
      try {
        body = await c.req.json();
      } catch (e) {
        throw badRequest(`Cannot parse the prefetch request as JSON: ${(e as Error).message}`);
      }
      const job = await deps.jobs.submit(parsePrefetchRequest(body));
      return c.json(job, 202, { location: `/prefetch/${job.id}` });
    },
  );

  app.get("/prefetch", routeDoc("prefetch", "Jobs and their progress (admin)", ADMIN), (c) => c.json({ jobs: deps.jobs.list() }));
  app.get("/prefetch/:id", routeDoc("prefetch", "A job's progress (admin)", OF_JOB), (c) => c.json(deps.jobs.get(c.req.param("id"))));
  app.delete("/prefetch/:id", routeDoc("prefetch", "Cancel a job (admin)", OF_JOB), (c) => c.json(deps.jobs.cancel(c.req.param("id"))));

  app.get(
    "/prefetch/:id/events",
    routeDoc("prefetch", "A job's progress as Server-Sent Events (admin)", {
      ...OF_JOB,
      responses: { ...OF_JOB.responses, 200: { description: "text/event-stream of `progress` events", content: { "text/event-stream": {} } } },
    }),
    (c) => {
    const id = c.req.param("id");
    deps.jobs.get(id); // 404 before the stream starts
    const res = streamSSE(c, async (stream) => {
      // Coalesce: at most one event per 100 ms while running, and always the final one.
      let latest: PrefetchProgress | undefined;
      let wake: (() => void) | undefined;
      const stop = deps.jobs.subscribe(id, (p) => {
        latest = p;
        wake?.();
      });
      stream.onAbort(() => {
        stop();
        wake?.();
      });
      try {
        for (;;) {
          if (latest) {
            const p = latest;
            latest = undefined;
            await stream.writeSSE({ event: "progress", data: JSON.stringify(p) });
            if (p.state === "done" || p.state === "failed" || p.state === "cancelled") break;
            await stream.sleep(100);
          } else {
            if (stream.aborted) break;
            let timer: ReturnType<typeof setTimeout> | undefined;
            const quiet = await new Promise<boolean>((r) => {
              wake = () => r(false);
              timer = setTimeout(() => r(true), keepAliveMs);
            });
            clearTimeout(timer);
            wake = undefined;
            // A comment line (clients skip it): a job that waits long (queued behind others, or on
            // a slow origin) sends no event, and a connection with nothing sent for a minute is
            // closed by idle timeouts (rackfeed's own on Deno, a proxy's).
            if (quiet && !stream.aborted) await stream.write(": keep-alive\n\n");
          }
        }
      } finally {
        stop();
      }
    });
    // Hono sets these HTTP/1.1 connection headers, which HTTP/2 forbids: Node's h2 refused the
    // response and @hono/node-server's fallback then threw outside any handler (the process
    // ended). The runtimes add what HTTP/1.1 needs by themselves.
    res.headers.delete("transfer-encoding");
    res.headers.delete("connection");
    return res;
  });
}
