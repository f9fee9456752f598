/** @module `POST /v1/telemetry`: trainers report t_wait, t_h2d and t_compute per step; the server keeps them as histograms. */

import type { Hono } from "hono";
import { MAX_MICRO_BATCH, MAX_WORLD } from "../../batch/steps.ts";
import { badRequest } from "../../errors.ts";
import type { Metrics } from "../../metrics/prometheus.ts";
import { MAX_REPORT_STEPS, MAX_TIMING_SECONDS } from "../../metrics/telemetry-report.ts";
import type { RequestBodies } from "../middleware/request-bodies.ts";
import { bodyBound, READ, routeDoc } from "../route-docs.ts";

/** Largest telemetry report body. */
const MAX_REPORT_BYTES = 2 << 20;

/**
 * How long a report's id is remembered (ms): the SDK retries a report for at most 5 s, so a
 * retry comes well within it, however many ranks report meanwhile.
 */
const REPORT_ID_MS = 60_000;

/** Report ids remembered at most (~100 bytes each): past it the oldest go first, whatever their age. */
const MAX_REMEMBERED_REPORTS = 1 << 17;

/** A report id: what the SDK sends (32 hex digits), or any other client's up to 64 characters. */
const REPORT_ID = /^[A-Za-z0-9_-]{1,64}$/;

/**
 * Registers the telemetry route (behind the read token, like every `/v1` route).
 *
 * @param app the Hono app
 * @param deps the metrics that receive the timings and the known dataset names
 */
export function telemetryRoutes(app: Hono, deps: { metrics: Metrics; datasets: () => readonly string[]; requestBodies: RequestBodies; now: () => number }): void {
  // Ids of reports recorded lately, with when: a client that lost the answer to a report (its
  // connection cut after the server read it, or its attempt timed out) sends it again, and each
  // step would otherwise count twice. Checked and added with no await between, so a retry that
  // overtakes its first try is still counted once. Oldest first (a Map keeps insertion order).
  const recorded = new Map<string, number>();
  app.post(
    "/v1/telemetry",
    routeDoc("datasets", "Report per-step t_wait, t_h2d and t_compute of a consumer (the SDK does this)", {
      requestBody: { required: true, content: { "application/json": { schema: { type: "object" } } } },
      responses: { 204: { description: "Recorded" }, ...READ, ...bodyBound(MAX_REPORT_BYTES) },
    }),
    deps.requestBodies.limit(MAX_REPORT_BYTES, "Telemetry report too large: at most 2 MiB of JSON; report more often"),
    async (c) => {
      let body: unknown;
      try {
        body = await c.req.json();
      } catch (e) {
        throw badRequest(`Cannot parse the telemetry report as JSON: ${(e as Error).message}`);
      }
      const r = parseReport(body, deps.datasets());
      if (r.id !== undefined) {
        const now = deps.now();
        for (const [id, at] of recorded) {
          if (now - at < REPORT_ID_MS && recorded.size < MAX_REMEMBERED_REPORTS) break;
          recorded.delete(id);
        }
        if (recorded.has(r.id)) return c.body(null, 204); // a retry of a report counted already
        recorded.set(r.id, now);
      }
      for (const s of r.steps) deps.metrics.observeStep(r.dataset, s);
      return c.body(null, 204);
    },
  );
}

/** `v` when it is an integer from `min` to `max`, else a 400 naming `field`. */
function integer(v: unknown, field: string, min: number, max: number): number {
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw badRequest(`Invalid telemetry "${field}": expected an integer from ${min} to ${max}, received ${JSON.stringify(v) ?? "nothing"}`);
  }
  return v;
}

interface Report {
  dataset: string;
  /** The report's id, when the client gave one: a report sent again with it is recorded once. */
  id?: string;
  steps: { t_wait?: number; t_h2d?: number; t_compute?: number }[];
}

function parseReport(body: unknown, known: readonly string[]): Report {
  const b = body as Record<string, unknown>;
  if (typeof b !== "object" || b === null || typeof b.dataset !== "string") {
    throw badRequest('Invalid telemetry report: expected {"dataset": name, "rank", "world", "micro_batch", "steps": [{"step", "t_wait", "t_h2d", "t_compute"}]}');
  }
  // Labels come from registered names only, so a client cannot grow the metric set without bound.
  if (!known.includes(b.dataset)) throw badRequest(`Invalid telemetry report: unknown dataset "${b.dataset}"`);
  // The consumer is not a label, but a report that names none (or "0" for a rank) is a broken
  // client: refused, as the batches route refuses it, rather than recorded as if it were sound.
  // The SDK sends the consumer its batches() checked (or the caller gave to reportStep).
  const world = integer(b.world, "world", 1, MAX_WORLD);
  integer(b.rank, "rank", 0, world - 1);
  integer(b.micro_batch, "micro_batch", 1, MAX_MICRO_BATCH);
  if (!Array.isArray(b.steps) || b.steps.length > MAX_REPORT_STEPS) {
    throw badRequest(`Invalid telemetry "steps": expected an array of at most ${MAX_REPORT_STEPS} entries`);
  }
  // The entry's name is made only for an error: a report carries up to 10 000 steps.
  const seconds = (v: unknown, i: number, name: string): number | undefined => {
    if (v === undefined || v === null) return undefined;
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v > MAX_TIMING_SECONDS) {
      throw badRequest(`Invalid telemetry "steps[${i}].${name}": expected seconds from 0 to ${MAX_TIMING_SECONDS}, received ${JSON.stringify(v)}`);
    }
    return v;
  };
  if (b.report !== undefined && (typeof b.report !== "string" || !REPORT_ID.test(b.report))) {
    throw badRequest(`Invalid telemetry "report": expected an id of 1 to 64 letters, digits, "-" or "_", received ${JSON.stringify(b.report)}`);
  }
  return {
    dataset: b.dataset,
    id: b.report as string | undefined,
    steps: b.steps.map((s: unknown, i: number) => {
      if (typeof s !== "object" || s === null || Array.isArray(s)) {
        throw badRequest(`Invalid telemetry "steps[${i}]": expected an object {"step", "t_wait", "t_h2d", "t_compute"}, received ${JSON.stringify(s)}`);
      }
      const t = s as Record<string, unknown>;
      integer(t.step, `steps[${i}].step`, 0, Number.MAX_SAFE_INTEGER);
      return {
        t_wait: seconds(t.t_wait, i, "t_wait"),
        t_h2d: seconds(t.t_h2d, i, "t_h2d"),
        t_compute: seconds(t.t_compute, i, "t_compute"),
      };
    }),
  };
}
