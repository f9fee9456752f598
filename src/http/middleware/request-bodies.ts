/**
 * @module What request bodies (telemetry reports, dataset registrations, prefetch jobs) may hold
 * while they are being received, all requests together: each route bounds its own body, and
 * this bounds how many are read at once (200 streams each sending a 2 MB report and never
 * ending took +2.3 GB on Node and +3.4 GB on Deno), and how long one may take to arrive.
 */

import type { Context, MiddlewareHandler, Next } from "hono";
import { badRequest, CacheServerError, isCacheServerError, OverloadedError, payloadTooLarge } from "../../errors.ts";

/** How long a request body may take to arrive, whole (ms): 2 MiB in 30 s is 70 KB/s. */
export const BODY_RECEIVE_MS = 30_000;

/** The server's budget for request bodies being received; `limit` makes each route's middleware. */
export class RequestBodies {
  #used = 0;

  /**
   * @param budgetBytes bytes of bodies received at once (`--request-body-bytes`)
   * @param receiveMs how long one body may take to arrive, whole
   */
  constructor(readonly budgetBytes: number, readonly receiveMs = BODY_RECEIVE_MS) {
    if (!Number.isSafeInteger(budgetBytes) || budgetBytes < 1) throw new RangeError(`budgetBytes must be a positive integer, got ${budgetBytes}`);
    if (!(receiveMs > 0 && receiveMs < 2 ** 31)) throw new RangeError(`receiveMs must be a positive number of ms below 2^31, got ${receiveMs}`);
  }

  /** Bytes of the budget held by bodies being received now. */
  get usedBytes(): number {
    return this.#used;
  }

  /**
   * A route's body, received here before its handler runs (which reads it with `c.req.json()`
   * or `c.req.text()` as usual): at most `maxBytes` (413 with `tooLarge` over it), whole within
   * `receiveMs` (408; a stalled client held its share of the budget for as long as it kept its
   * connection, and Deno never closes one), and only while the budget has room for it (503 with
   * Retry-After meanwhile). A body is counted at its Content-Length, or at `maxBytes` when it has
   * none, until its handler has finished.
   */
  limit(maxBytes: number, tooLarge: string): MiddlewareHandler {
    return async (c: Context, next: Next) => {
      const declared = Number(c.req.header("content-length"));
      const known = Number.isSafeInteger(declared) && declared >= 0;
      if (known && declared > maxBytes) throw payloadTooLarge(tooLarge);
      const bytes = known ? declared : maxBytes;
      // One body always fits, however small the budget: the route's own bound holds it.
      if (this.#used > 0 && this.#used + bytes > this.budgetBytes) {
        throw new OverloadedError(`Too many request bodies being received at once (${this.#used} of --request-body-bytes ${this.budgetBytes}); retry shortly`);
      }
      this.#used += bytes;
      try {
        const text = await receive(c.req.raw, maxBytes, tooLarge, this.receiveMs);
        // Hono's own cache of the body: `c.req.json()` and `c.req.text()` read it from here.
        (c.req.bodyCache as Record<string, unknown>).text = Promise.resolve(text);
        await next();
      } finally {
        this.#used -= bytes;
      }
    };
  }
}

/** A request's body as text, refused (413) past `maxBytes` and (408) when not whole in `ms`. */
async function receive(req: Request, maxBytes: number, tooLarge: string, ms: number): Promise<string> {
  if (req.body === null) return "";
  const reader = req.body.getReader();
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new CacheServerError("REQUEST_TIMEOUT", `The request body did not arrive whole within ${ms / 1000} s; send it at once`)), ms);
  });
  // Decoded as it comes (a character split across chunks waits for the next): no whole-body buffer.
  const decoder = new TextDecoder();
  let text = "";
  let length = 0;
  try {
    for (;;) {
      const { done, value } = await Promise.race([reader.read(), late]);
      if (done) break;
      length += value.length;
      if (length > maxBytes) throw payloadTooLarge(tooLarge);
      text += decoder.decode(value, { stream: true });
    }
  } catch (e) {
    // Stop reading: the runtime drops what else comes (and Node's stream ends the request).
    reader.cancel().catch(() => {});
    if (isCacheServerError(e)) throw e;
    // The stream broke: its client left mid-body (a reset, a closed connection). No server
    // fault to log; the answer most likely reaches nobody.
    throw badRequest(`The request body was cut off before its end (${(e as Error).message}); send it again whole`);
  } finally {
    clearTimeout(timer);
  }
  return text + decoder.decode();
}
