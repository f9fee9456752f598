/** @module Refuses a Host header (or HTTP/2 authority) that is more than a host and a port, before anything reads the request's URL. */

import type { MiddlewareHandler } from "hono";
import { badRequest } from "../../errors.ts";

/** What a Host header may not contain: a host name or address and a port never do. */
export const NOT_IN_HOST = /[/?#\\@\s]/;

/**
 * The usual Host, accepted without parsing it as a URL: a DNS name with a letter in its last
 * label, or a dotted-quad IPv4 address, and a port. Anything else (a bracketed IPv6, a name of
 * digits only, an IDN) is parsed as a URL: `[1]` or `999.1.1.1` look plain but are no host.
 */
const PLAIN_HOST = /^(?:(?:[A-Za-z0-9-]+\.)*[A-Za-z0-9-]*[A-Za-z][A-Za-z0-9-]*\.?|(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d))(?::(\d{1,5}))?$/;

/** A URL whose authority holds a user part (`http://u@host/…`). */
const USER_IN_URL = /^[a-z][a-z0-9+.-]*:\/\/[^/?#]*@/i;

/** Whether `host` is a host name or address with an optional port, as a URL's authority holds it. */
function isHost(host: string): boolean {
  if (NOT_IN_HOST.test(host)) return false;
  const plain = PLAIN_HOST.exec(host);
  if (plain) return plain[1] === undefined || Number(plain[1]) <= 65535;
  try {
    // Anything else (an IDN, percent-escapes) is a host only if a URL takes it as one.
    const url = new URL(`http://${host}`);
    return url.host !== "" && url.username === "" && url.password === "" && url.pathname === "/";
  } catch {
    return false;
  }
}

/**
 * Answers 400 to a request whose Host header is no host and port: one holding a path, query,
 * fragment or user part, an empty one, a port past 65535. Deno builds `Request.url` from the Host
 * header and the target, so `Host: h/v1/objects/data` with `GET /k` would otherwise read as
 * `/v1/objects/data/k` (a path a proxy in front never saw), and Deno serves hosts Node's server
 * refuses (`a:b`, `[::1`): both runtimes now answer them alike. An HTTP/2 request on Deno carries
 * no Host header: its URL's authority (from `:authority`) is checked for a user part instead.
 *
 * @returns the middleware
 */
export const rejectBadHost = (): MiddlewareHandler =>
  async function rejectBadHost(c, next) {
    const host = c.req.header("host");
    if (host !== undefined ? !isHost(host) : USER_IN_URL.test(c.req.url)) {
      throw badRequest(`Invalid ${host !== undefined ? `Host header "${host}"` : "request authority"}: expected a host name or address and an optional port`);
    }
    await next();
  };
