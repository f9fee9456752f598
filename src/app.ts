/** @module `createApp(deps)`: the Hono app built from injected parts; what tests drive with `app.request()`. */

import { TUNABLES } from "./config/defaults.ts";
import { Hono } from "hono";
import type { BatchStats } from "./batch/batch-stats.ts";
import type { BatchBodies } from "./http/routes/datasets.ts";
import type { DatasetCatalog } from "./batch/dataset-catalog.ts";
import type { ReadAhead } from "./batch/read-ahead.ts";
import type { BlockCache } from "./cache/block-cache.ts";
import { CacheServerError, OverloadedError } from "./errors.ts";
import { errorHandler } from "./http/error-handler.ts";
import { allowedMethods } from "./http/allowed-methods.ts";
import { bearerAuth } from "./http/middleware/bearer-auth.ts";
import { rejectDotSegments } from "./http/middleware/reject-dot-segments.ts";
import { rejectBadHost } from "./http/middleware/reject-bad-host.ts";
import { RequestBodies } from "./http/middleware/request-bodies.ts";
import { datasetRoutes } from "./http/routes/datasets.ts";
import { operationalRoutes } from "./http/routes/health.ts";
import { prefetchRoutes } from "./http/routes/prefetch.ts";
import { telemetryRoutes } from "./http/routes/telemetry.ts";
import type { PrefetchJobs } from "./prefetch/prefetch-jobs.ts";
import { type ObjectHolds, objectRoutes } from "./http/routes/objects.ts";
import type { ServedBytes } from "./http/served-bytes.ts";
import type { Metrics } from "./metrics/prometheus.ts";
import type { ServerStatus } from "./metrics/status.ts";
import { dashboardRoutes } from "./http/routes/dashboard.ts";
import { OPENAPI_DOCUMENT, READ, routeDoc } from "./http/route-docs.ts";
import { openAPIRouteHandler } from "hono-openapi";
import type { OriginGateway } from "./origin/origin-gateway.ts";
import type { PieceCopier } from "./batch/piece-copier.ts";

/** Everything the HTTP app needs, built by `createServer` (or by a test). */
export interface AppDeps {
  readonly origins: ReadonlyMap<string, OriginGateway>;
  readonly cache: BlockCache;
  readonly metrics: Metrics;
  readonly served: ServedBytes;
  readonly datasets: DatasetCatalog;
  readonly readAhead: ReadAhead;
  readonly prefetch: PrefetchJobs;
  readonly batchStats: BatchStats;
  /** The dashboard's JSON snapshot. */
  readonly status: () => Promise<ServerStatus> | ServerStatus;
  /** Where the shm control socket is, once it listens; undefined when the shm path is off. */
  readonly shm?: () => { socket: string; instance: string; protocol: number } | "starting" | undefined;
  /** Token for read routes; undefined leaves them open. */
  readonly readToken: string | undefined;
  /** Token for admin routes; undefined closes them. */
  readonly adminToken: string | undefined;
  /** Turns one view of cached bytes into a response body without a copy on this runtime. */
  readonly wrapBody: (bytes: Uint8Array) => BodyInit;
  /** Largest samples/batch body. */
  readonly maxBatchBytes: number;
  /** Bytes of request bodies received at once (`--request-body-bytes`); default its default in the tunables table. */
  readonly requestBodyBytes?: number;
  /** Reusable batch bodies and the runtime's word on when a response is out; unset: a new body per batch. */
  readonly bodies?: BatchBodies;
  /** The bound on cached blocks that object responses are sending; unset: unbounded (tests of other parts). */
  readonly objectHolds?: ObjectHolds;
  /** The native gather; unset: batches are copied in JavaScript. */
  readonly copier?: PieceCopier;
  /** How often a quiet prefetch event stream gets a comment line; default `SSE_KEEP_ALIVE_MS`. */
  readonly sseKeepAliveMs?: number;
  readonly now: () => number;
  /** Reports unexpected errors. */
  readonly log: (message: string, err?: unknown) => void;
}

/**
 * Builds the HTTP app: middleware, routes, and the one error→status mapping.
 *
 * @param deps the injected parts
 * @returns the Hono app; its `fetch` is what the runtime serves
 * @example
 * ```ts
 * const app = createApp(deps);
 * const res = await app.request("/v1/objects/data/a.bin", { headers: { range: "bytes=0-99" } });
 * ```
 */
export function createApp(deps: AppDeps): Hono {
  const app = new Hono();
  const requestBodies = new RequestBodies(deps.requestBodyBytes ?? TUNABLES.requestBodyBytes.parse(TUNABLES.requestBodyBytes.default!, "--request-body-bytes"));
  const onError = errorHandler(deps.log);
  app.onError(onError);
  // Made at the first unmatched request, when every route is registered.
  let allowed: ((path: string) => string[]) | undefined;
  app.notFound((c) => {
    allowed ??= allowedMethods(app.routes);
    const methods = allowed(c.req.path);
    if (methods.length === 0) return c.json({ error: "NOT_FOUND", message: `No route for ${c.req.method} ${c.req.path}` }, 404);
    return onError(methodNotAllowed(c.req.method, c.req.path, methods), c);
  });
  app.use("*", rejectBadHost());
  app.use("*", rejectDotSegments());
  app.use(
    "/v1/*",
    bearerAuth({ token: deps.readToken, required: false, role: "read", alsoAccept: deps.adminToken, needsStronger: adminRouteUnderV1 }),
  );
  operationalRoutes(app, { metrics: deps.metrics });
  dashboardRoutes(app, { status: deps.status });
  objectRoutes(app, { origins: deps.origins, cache: deps.cache, served: deps.served, wrapBody: deps.wrapBody, holds: deps.objectHolds });
  datasetRoutes(app, {
    catalog: deps.datasets,
    cache: deps.cache,
    readAhead: deps.readAhead,
    served: deps.served,
    adminToken: deps.adminToken,
    maxBatchBytes: deps.maxBatchBytes,
    bodies: deps.bodies,
    requestBodies,
    copier: deps.copier,
    now: deps.now,
    onBatch: (s, cache) => deps.metrics.observeBatch(s, cache),
    stats: deps.batchStats,
    wrapBody: deps.wrapBody,
  });
  app.get(
    "/v1/shm",
    routeDoc("datasets", "Where the shared-memory control socket is, for co-located clients (404 when the shm path is off)", {
      responses: { ...READ, 404: { description: "The shm path is off (--shm-dir off)" }, 503: { description: "The shm path is still starting; retry" } },
    }),
    (c) => {
      const info = deps.shm?.();
      // HTTP listens before the socket (its default name holds the port): a client asking in
      // between is told to retry rather than that there is no shm path.
      if (info === "starting") throw new OverloadedError("The shared-memory path is starting; retry");
      if (!info) throw new CacheServerError("NOT_FOUND", "The shared-memory path is off on this server (--shm-dir off) or not started");
      return c.json(info);
    },
  );
  prefetchRoutes(app, { jobs: deps.prefetch, adminToken: deps.adminToken, requestBodies, keepAliveMs: deps.sseKeepAliveMs });
  telemetryRoutes(app, { metrics: deps.metrics, datasets: () => deps.datasets.names(), requestBodies, now: deps.now });
  app.get("/openapi.json", routeDoc("operations", "This OpenAPI description, generated from the route definitions"), openAPIRouteHandler(app, {
    documentation: OPENAPI_DOCUMENT,
    excludeStaticFile: false, // "/openapi.json" has a dot but is no static file
  }));
  app.all("/v1/objects/*", (c) => {
    if (c.req.method === "GET" || c.req.method === "HEAD") {
      throw new CacheServerError("BAD_REQUEST", `No object key in ${new URL(c.req.url).pathname}: expected /v1/objects/{origin}/{key}`);
    }
    throw methodNotAllowed(c.req.method, new URL(c.req.url).pathname, ["GET", "HEAD"], "objects are read-only");
  });
  return app;
}

/** The 405 of a request whose path takes only `methods`. */
function methodNotAllowed(method: string, path: string, methods: readonly string[], why?: string): CacheServerError {
  return new CacheServerError(
    "METHOD_NOT_ALLOWED",
    `${method} is not allowed on ${path}${why ? ` (${why})` : ""}: use ${methods.slice(0, -1).join(", ")}${methods.length > 1 ? " or " : ""}${methods.at(-1)}`,
    { headers: { allow: methods.join(", ") } },
  );
}

/**
 * The one admin route under `/v1/` (dataset registration, `src/http/routes/datasets.ts`): its
 * refusal by the read check names the admin token, which passes both checks. Only the message
 * depends on this; the admin check itself sits on the route.
 */
function adminRouteUnderV1(method: string, path: string): string | undefined {
  return method === "PUT" && /^\/v1\/datasets\/[^/]+\/?$/.test(path) ? "admin" : undefined;
}
