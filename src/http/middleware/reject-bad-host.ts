/** @module Refuses a Host header that is more than a host and a port, before anything reads the request's URL. */

import type { MiddlewareHandler } from "hono";
import { badRequest } from "../../errors.ts";

/** What a Host header may not contain: a host name or address and a port never do. */
export const NOT_IN_HOST = /[/?#\\@\s]/;

/**
 * Answers 400 to a request whose Host header holds a path, query, fragment or user part. Deno
 * builds `Request.url` from the Host header and the target, so `Host: h/v1/objects/data` with
 * `GET /k` would otherwise read as `/v1/objects/data/k` (a path a proxy in front never saw).
 *
 * @returns the middleware
 */
export const rejectBadHost = (): MiddlewareHandler =>
  async function rejectBadHost(c, next) {
    const host = c.req.header("host");
    if (host !== undefined && NOT_IN_HOST.test(host)) {
      throw badRequest(`Invalid Host header "${host}": expected a host name or address and an optional port`);
    }
    await next();
  };
