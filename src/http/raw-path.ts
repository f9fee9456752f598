/** @module The request target exactly as the client sent it, before any URL normalisation. */

import type { Context } from "hono";

/**
 * The raw, still percent-encoded path of a request. WHATWG URL parsing (which
 * `@hono/node-server` applies) resolves `..` and `%2e%2e` segments, so the raw target is
 * the only place an escape attempt is still visible: on Node it comes from the
 * `IncomingMessage`, on Deno `Request.url` keeps the target as sent.
 *
 * @param c the request context
 * @returns the path, without query or fragment
 */
export function rawPathOf(c: Context): string {
  const incoming = (c.env as { incoming?: { url?: string } } | undefined)?.incoming?.url;
  let target: string;
  if (typeof incoming === "string") {
    // An absolute-form target (`GET http://host/path`, RFC 9112 §3.2.2) carries its path after
    // the authority, as Deno's Request.url does.
    target = incoming.startsWith("/") ? incoming : pathOfUrl(incoming);
  } else {
    target = pathOfUrl(c.req.raw.url);
  }
  const q = target.search(/[?#]/);
  return q < 0 ? target : target.slice(0, q);
}

/** The path (with query) of `scheme://authority/path`, as written. */
function pathOfUrl(url: string): string {
  const slash = url.indexOf("/", url.indexOf("//") + 2);
  return slash < 0 ? "/" : url.slice(slash);
}
