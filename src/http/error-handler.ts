/** @module The one place that maps rackfeed's error codes to HTTP statuses. */

import type { Context } from "hono";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { type ErrorCode, isCacheServerError } from "../errors.ts";

/** HTTP status of every error code. */
export const STATUS_OF: Readonly<Record<ErrorCode, ContentfulStatusCode>> = {
  BAD_REQUEST: 400,
  PAYLOAD_TOO_LARGE: 413,
  // A request body that did not arrive in time (its client stalled or trickled it).
  REQUEST_TIMEOUT: 408,
  UNAUTHORIZED: 401,
  FORBIDDEN: 403,
  NOT_FOUND: 404,
  // A path with routes, asked with a method none of them takes: `Allow` names those that do.
  METHOD_NOT_ALLOWED: 405,
  // A registration overtaken by a later one of the same name (see DatasetCatalog.register).
  CONFLICT: 409,
  ORIGIN_NOT_FOUND: 404,
  OBJECT_NOT_FOUND: 404,
  // The object changed under a fill that was already promised to this request; a retry sees
  // the new version.
  OBJECT_CHANGED: 503,
  RANGE_NOT_SATISFIABLE: 416,
  ORIGIN_UNAVAILABLE: 502,
  ORIGIN_TIMEOUT: 504,
  OVERLOADED: 503,
  SHUTTING_DOWN: 503,
  // No room for a shm ring (--shm-bytes, or the tmpfs): the client reads over HTTP instead.
  SHM_FULL: 503,
  // A shm consumer's dataset was replaced by a new version: reconnect and resume at the next step.
  DATASET_REPLACED: 503,
};

/**
 * Builds the `app.onError` handler: rackfeed errors become `{ "error": code, "message": ... }`
 * with their status and headers; anything else is logged once with its cause chain and
 * answered with a bare 500 that leaks nothing.
 *
 * @param log where unexpected errors are reported
 * @returns the handler
 */
export function errorHandler(log: (message: string, err: unknown) => void) {
  return function onError(err: Error, c: Context): Response {
    if (isCacheServerError(err)) {
      const status = STATUS_OF[err.code];
      for (const [k, v] of Object.entries(err.headers)) c.header(k, v);
      if (status === 503 && !err.headers["retry-after"]) c.header("retry-after", "1");
      return c.json({ error: err.code, message: err.message }, status);
    }
    // c.req.path, not new URL(c.req.url): a Host header that makes the URL invalid would throw here.
    log(`Unhandled error on ${c.req.method} ${c.req.path}`, err);
    return c.json({ error: "INTERNAL", message: "Internal server error" }, 500);
  };
}
