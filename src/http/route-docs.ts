/** @module OpenAPI descriptions attached to each route where it is defined (hono-openapi's `describeRoute`). */

import { describeRoute } from "hono-openapi";

type Doc = Parameters<typeof describeRoute>[0];

const error = (description: string) => ({
  description,
  content: { "application/json": { schema: { $ref: "#/components/schemas/Error" } } },
});

/**
 * A route's OpenAPI description: summary, tag, the usual error answers, and anything else given.
 *
 * @param tag the API section (objects, datasets, prefetch, operations)
 * @param summary one line
 * @param doc more of the operation object (parameters, responses, security)
 * @returns the `describeRoute` middleware
 */
export function routeDoc(tag: string, summary: string, doc: Partial<Doc> = {}) {
  return describeRoute({
    tags: [tag],
    summary,
    ...doc,
    responses: {
      200: { description: "OK" },
      400: error("Bad input; the message names the field or value and what was expected"),
      ...(doc.responses ?? {}),
    },
  });
}

/** A query parameter. */
export const query = (name: string, description: string, required = false) => ({
  in: "query" as const,
  name,
  required,
  description,
  schema: { type: "integer" as const, minimum: 0 },
});

/** Responses that carry raw tokens. */
export const TOKEN_BODY = {
  description: "Raw little-endian tokens, shape [N, seq_length + 1]; headers X-Rackfeed-Dtype, X-Rackfeed-Shape, X-Rackfeed-First-Sample, X-Rackfeed-Cache",
  content: { "application/octet-stream": { schema: { type: "string" as const, format: "binary" } } },
};

/** Routes that take a JSON body, bounded by `bytes`. */
export const bodyBound = (bytes: number) => ({ 413: error(`Body over ${bytes} bytes`), 503: error("Too many request bodies being received at once (--request-body-bytes); retry after Retry-After") });

/** Routes under `/v1/`: a server started with `--read-token` wants it. */
export const READ = { 401: error("Missing or wrong read token (a server started with --read-token)") };

/** Routes that read through the cache: the origin's failures. */
export const ORIGIN_FAILURES = {
  502: error("The origin failed (or cannot reach its root)"),
  503: error("The origin's queue is full, it is down (circuit open), or the object changed while being read; retry after Retry-After"),
  504: error("The origin did not answer in time"),
};

/** Routes of one dataset. */
export const UNKNOWN_DATASET = { 404: error("Unknown dataset") };

/** Admin-only routes. */
export const ADMIN = { security: [{ bearer: [] }], responses: { 401: error("Missing or wrong admin token"), 403: error("Admin endpoints are disabled (no --admin-token)") } };

/** Document-level parts: components and security schemes. */
export const OPENAPI_DOCUMENT = {
  info: {
    title: "rackfeed",
    version: "0.1.0",
    description: "Rack-local cache and batch server for ML training data. Generated from the route definitions.",
  },
  components: {
    securitySchemes: { bearer: { type: "http" as const, scheme: "bearer" } },
    schemas: {
      Error: {
        type: "object" as const,
        properties: { error: { type: "string" as const }, message: { type: "string" as const } },
        required: ["error", "message"],
      },
    },
  },
};
