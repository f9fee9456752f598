/** @module The dataset API: register, describe, samples and batches of Megatron token datasets. */

import type { Context, Hono } from "hono";
import type { PieceCopier } from "../../batch/piece-copier.ts";
import { assembleSamples, bodyBytes, cacheState, checkedBodyBytes, peekCacheState } from "../../batch/assemble-batch.ts";
import type { BatchBodyPool } from "../../batch/body-pool.ts";
import type { ClientGone, WhenDone } from "../../runtime/listener.ts";
import type { DatasetCatalog, RegisteredDataset } from "../../batch/dataset-catalog.ts";
import type { BatchStats } from "../../batch/batch-stats.ts";
import type { ReadAhead } from "../../batch/read-ahead.ts";
import { fullSteps, MAX_MICRO_BATCH, MAX_WORLD, stepSamples } from "../../batch/steps.ts";
import type { BlockCache } from "../../cache/block-cache.ts";
import { badRequest, RangeNotSatisfiableError } from "../../errors.ts";
import { bearerAuth } from "../middleware/bearer-auth.ts";
import type { RequestBodies } from "../middleware/request-bodies.ts";
import { httpTransport, type ServedBytes } from "../served-bytes.ts";
import { ADMIN, bodyBound, ORIGIN_FAILURES, query, READ, routeDoc, TOKEN_BODY, UNKNOWN_DATASET } from "../route-docs.ts";

/** What the dataset routes need. */
export interface DatasetRoutesDeps {
  readonly catalog: DatasetCatalog;
  readonly cache: BlockCache;
  readonly readAhead: ReadAhead;
  readonly served: ServedBytes;
  readonly adminToken: string | undefined;
  /** The budget registrations' bodies are received within. */
  readonly requestBodies: RequestBodies;
  readonly maxBatchBytes: number;
  readonly now: () => number;
  /** Called with each batch's seconds and whether its blocks were in memory, arriving, or missing. */
  readonly onBatch: (seconds: number, cache: "hit" | "filling" | "miss") => void;
  /** Per-dataset traffic and slow-batch causes. */
  readonly stats: BatchStats;
  /** Wraps a body for the runtime (see `ServerEnv.wrapBody`). */
  readonly wrapBody: (bytes: Uint8Array) => BodyInit;
  /** Reusable bodies; unset: a new body per batch. */
  readonly bodies?: BatchBodies;
  /** The native gather; unset: batches are copied in JavaScript. */
  readonly copier?: PieceCopier;
}

/** Batch bodies leased from a pool and given back once the runtime says their response is over. */
export interface BatchBodies {
  /** Where bodies are leased (and waited for, under the in-flight bound). */
  readonly pool: BatchBodyPool;
  /** The runtime's word on when a response is over. */
  readonly whenDone: WhenDone;
  /** Whether a request's client is gone; unset: never known. */
  readonly clientGone?: ClientGone;
}

/** Largest registration body accepted. */
export const MAX_REGISTRATION_BYTES = 1 << 20;

/**
 * Registers the dataset routes.
 *
 * @param app the Hono app
 * @param deps catalog, cache, read-ahead and limits
 */
export function datasetRoutes(app: Hono, deps: DatasetRoutesDeps): void {
  app.put(
    "/v1/datasets/:name",
    routeDoc("datasets", "Register or replace a Megatron token dataset (admin)", {
      ...ADMIN,
      requestBody: { required: true, content: { "application/json": { schema: { type: "object" } } } },
      responses: { ...ADMIN.responses, 200: { description: "Replaced the dataset of that name; the body describes the new version" }, 201: { description: "Registered under a new name; the body describes the dataset" }, 409: { description: "Overtaken by a later registration of the same name, which is served" }, ...bodyBound(MAX_REGISTRATION_BYTES) },
    }),
    bearerAuth({ token: deps.adminToken, required: true, role: "admin" }),
    deps.requestBodies.limit(MAX_REGISTRATION_BYTES, `Dataset registration too large: at most ${MAX_REGISTRATION_BYTES} bytes of JSON`),
    async (c) => {
      let body: unknown;
      try {
        body = await c.req.json();
      } catch (e) {
        throw badRequest(`Cannot parse the registration as JSON: ${(e as Error).message}`);
      }
      // 200 or 201 as the catalog tells it when the name is taken: whether the name existed when
      // this request started says nothing once another registration of it lands meanwhile.
      const { registered, replaced } = await deps.catalog.register(c.req.param("name"), body);
      return c.json(describe(registered), replaced ? 200 : 201);
    },
  );

  app.get("/v1/datasets", routeDoc("datasets", "Names of the registered datasets", { responses: READ }), (c) => c.json({ datasets: deps.catalog.names() }));

  app.get("/v1/datasets/:name", routeDoc("datasets", "Describe a dataset: kind, dtype, samples, shape, documents, tokens, epochs", { responses: { ...READ, ...UNKNOWN_DATASET } }), async (c) => {
    const reg = await deps.catalog.get(c.req.param("name"));
    return c.json({ ...describe(reg), rebuildError: deps.catalog.rebuildError(reg.name) ?? null });
  });

  app.get(
    "/v1/datasets/:name/samples",
    routeDoc("datasets", "Samples start .. start+count-1", {
      parameters: [query("start", "First sample (default 0)"), query("count", "Number of samples (default 1)")],
      responses: { 200: TOKEN_BODY, 416: { description: "Beyond the dataset" }, ...READ, ...UNKNOWN_DATASET, ...ORIGIN_FAILURES },
    }),
    async (c) => {
    const reg = await deps.catalog.get(c.req.param("name"));
    const q = c.req.queries();
    const start = intParam(q, "start", 0, Number.MAX_SAFE_INTEGER, 0);
    const count = intParam(q, "count", 1, 1 << 20, 1);
    if (start >= reg.dataset.numSamples) {
      throw new RangeNotSatisfiableError(
        `Sample ${start} of dataset "${reg.name}" does not exist: it has samples 0-${reg.dataset.numSamples - 1}`,
      );
    }
    const n = Math.min(count, reg.dataset.numSamples - start);
    return await batchResponse(c, deps, reg, start, n, () => `samples ${start}+${n}`);
  });

  app.get(
    "/v1/datasets/:name/batches/:step",
    routeDoc("datasets", "Rank R's micro-batch of a step: samples (step*W + R)*B .. +B-1", {
      parameters: [query("rank", "Rank R (default 0)"), query("world", "World size W (default 1)"), query("micro_batch", "Micro-batch size B", true)],
      responses: { 200: TOKEN_BODY, 416: { description: "Step beyond the dataset" }, ...READ, ...UNKNOWN_DATASET, ...ORIGIN_FAILURES },
    }),
    async (c) => {
    const reg = await deps.catalog.get(c.req.param("name"));
    const stepText = c.req.param("step");
    if (!/^\d{1,15}$/.test(stepText)) throw badRequest(`Invalid step "${stepText}": expected a non-negative integer`);
    const step = Number(stepText);
    // Parsed once: each c.req.queries(name) scans the whole query again (~3 % of Deno's time per batch).
    const q = c.req.queries();
    const world = intParam(q, "world", 1, MAX_WORLD, 1);
    const rank = intParam(q, "rank", 0, world - 1, 0);
    const microBatch = intParam(q, "micro_batch", 1, MAX_MICRO_BATCH, undefined);
    // Full steps only, for every rank alike: a last, partial step would give some ranks a batch
    // and others a 416 (the shm path and the SDK end the epoch there too).
    const steps = fullSteps(reg.dataset.numSamples, world, microBatch);
    if (step >= steps) {
      const has = steps === 0 ? "no full step" : `steps 0-${steps - 1}`;
      throw new RangeNotSatisfiableError(
        `Step ${step} is beyond dataset "${reg.name}": with world=${world} and micro_batch=${microBatch} it has ${has} (${reg.dataset.numSamples} samples)`,
      );
    }
    const res = await batchResponse(c, deps, reg, stepSamples(step, rank, world, microBatch), microBatch, () => `rank ${rank}/${world} × ${microBatch} step ${step}`);
    // A HEAD reads nothing: it is not a step of this consumer.
    if (c.req.method !== "HEAD") deps.readAhead.observe(reg, { dataset: reg.name, rank, world, microBatch }, step);
    return res;
  });
}

async function batchResponse(
  c: Context,
  deps: DatasetRoutesDeps,
  reg: RegisteredDataset,
  first: number,
  count: number,
  request: () => string,
): Promise<Response> {
  if (c.req.method === "HEAD") {
    // The headers of the GET, without its work: nothing is fetched, copied, leased or counted.
    const bytes = checkedBodyBytes(reg, count, deps.maxBatchBytes);
    return c.body(null, 200, batchHeaders(reg, first, count, bytes, peekCacheState(deps.cache, reg, first, count)));
  }
  const t0 = deps.now();
  const bodies = deps.bodies;
  const bytes = bodyBytes(reg, count);
  // Too large a body is refused by the assembly; it is not leased. Waiting for a lease (the
  // bound on bodies in flight) counts in the batch's time: it is time the trainer waits.
  const leasing = bodies !== undefined && bytes <= deps.maxBatchBytes;
  // A lease that will wait has its client watched from before the wait (a runtime may notice a
  // departure only once asked). Only then: watching costs Deno ~10 % of its small-batch rate.
  const gone = leasing && bodies.pool.mustWait(bytes) ? bodies.clientGone?.(c.env) : undefined;
  const lease = leasing ? await bodies.pool.lease(bytes) : undefined;
  let batch;
  try {
    if (lease && gone?.()) {
      // Its client left (usually while it waited for room): nobody can receive it, so nothing is
      // assembled. Not an error (nothing logged, no error answer); the runtime drops this reply.
      lease.abandon();
      return c.body(null, 204);
    }
    batch = await assembleSamples(deps.cache, reg, first, count, deps.maxBatchBytes, { now: deps.now, into: lease?.body, copier: deps.copier, plansAhead: deps.readAhead.plansAhead });
    // The lease ends with the response. Registered only once the copy is over: a runtime may say
    // "done" as soon as the connection is gone (Deno resolves `completed` when an HTTP/1.1 client
    // leaves), and a body back in the pool must not be written by a late copy. Back to the pool
    // only when nothing reads it any more: the next batch of this size overwrites it. Where the
    // runtime cannot tell (no bindings), the lease ends now and the body is not reused.
    if (lease && !bodies?.whenDone(c.env, lease.end)) lease.end(false);
  } catch (e) {
    lease?.end(false); // a failed assembly copies nothing later; the body is simply not reused
    throw e;
  }
  const state = cacheState(batch);
  const seconds = (deps.now() - t0) / 1000;
  deps.onBatch(seconds, state);
  deps.stats.record(reg.name, request, batch, seconds);
  deps.served.add(httpTransport(c.env), batch.body.length);
  return c.body(
    deps.wrapBody(batch.body) as ReadableStream | Uint8Array<ArrayBuffer>,
    200,
    batchHeaders(reg, first, count, batch.body.length, state),
  );
}

function batchHeaders(reg: RegisteredDataset, first: number, count: number, bytes: number, state: string): Record<string, string> {
  return {
    "content-type": "application/octet-stream",
    "content-length": String(bytes),
    "x-rackfeed-dtype": reg.dataset.dtype,
    "x-rackfeed-shape": `${count},${reg.dataset.windowLength}`,
    "x-rackfeed-first-sample": String(first),
    "x-rackfeed-cache": state, // see cacheState()
  };
}

function intParam(query: Record<string, string[]>, name: string, min: number, max: number, fallback: number | undefined): number {
  // Given twice, which one was meant is a guess (a proxy appending its own, a client bug): refuse.
  const all = query[name];
  if (all !== undefined && all.length > 1) {
    throw badRequest(`Query parameter "${name}" given ${all.length} times (${all.map((v) => JSON.stringify(v)).join(", ")}): give it once`);
  }
  const raw = all?.[0];
  if (raw === undefined || raw === "") {
    if (fallback === undefined) throw badRequest(`Missing query parameter "${name}": expected an integer from ${min} to ${max}`);
    return fallback;
  }
  const v = /^\d{1,15}$/.test(raw) ? Number(raw) : NaN;
  if (!(v >= min && v <= max)) {
    throw badRequest(`Invalid query parameter ${name}="${raw}": expected an integer from ${min} to ${max}`);
  }
  return v;
}

function describe(reg: RegisteredDataset): Record<string, unknown> {
  const d = reg.dataset.describe();
  return {
    name: reg.name,
    ...d,
    files: reg.files.map((f) => ({
      origin: f.gw.name,
      idx: f.idxKey,
      bin: f.binKey,
      binBytes: f.bin.size,
      version: f.bin.version,
    })),
    buildSeconds: reg.buildSeconds,
  };
}
