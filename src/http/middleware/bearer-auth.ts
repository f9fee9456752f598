/** @module Bearer-token checks for read and admin routes. */

import type { MiddlewareHandler } from "hono";
import { CacheServerError } from "../../errors.ts";

/**
 * Requires `Authorization: Bearer <token>` when a token is configured. With `required`,
 * an unset token refuses every request (admin routes are closed unless a token is set).
 * `alsoAccept` lets a stronger token pass too (the admin token may read).
 *
 * @param opts the expected token, whether it must be configured, and the role (for messages)
 * @returns the middleware
 */
export const bearerAuth = (
  opts: {
    token: string | undefined;
    required: boolean;
    role: string;
    alsoAccept?: string | undefined;
    /** Requests that will also need a stronger token (an admin route behind the read check): the refusal names that one, the token that would pass both. */
    needsStronger?: (method: string, path: string) => string | undefined;
  },
): MiddlewareHandler =>
  async function bearerAuth(c, next) {
    if (opts.token === undefined) {
      if (opts.required) {
        throw new CacheServerError(
          "FORBIDDEN",
          `${opts.role} endpoints are disabled: start the server with --admin-token to enable them`,
        );
      }
      return await next();
    }
    const got = /^Bearer\s+(\S+)\s*$/i.exec(c.req.header("authorization") ?? "")?.[1];
    const ok = got !== undefined &&
      (constantTimeEqual(got, opts.token) || (opts.alsoAccept !== undefined && constantTimeEqual(got, opts.alsoAccept)));
    if (!ok) {
      c.header("www-authenticate", 'Bearer realm="rackfeed"');
      const role = opts.needsStronger?.(c.req.method, c.req.path) ?? opts.role;
      throw new CacheServerError("UNAUTHORIZED", `Missing or wrong ${role} token: send "Authorization: Bearer <token>"`);
    }
    await next();
    // The answer depends on the token: a browser (or any cache) must not hand a response fetched
    // with one token to a request with another, which would skip this check. Set on the response
    // itself: `c.header` after `next()` rebuilds it, which costs its fast body path (~30 % CPU).
    try {
      c.res.headers.append("vary", "Authorization");
    } catch {
      c.header("vary", "Authorization", { append: true }); // immutable headers (a proxied Response)
    }
  };

/** Compares two tokens in time that depends only on their lengths. */
export function constantTimeEqual(a: string, b: string): boolean {
  const ea = new TextEncoder().encode(a);
  const eb = new TextEncoder().encode(b);
  let diff = ea.length ^ eb.length;
  for (let i = 0; i < eb.length; i++) diff |= (ea[i] ?? 0) ^ eb[i];
  return diff === 0;
}
