/**
 * @module What request bodies (telemetry reports, dataset registrations, prefetch jobs) may hold
 * while they are being received, all requests together: each route bounds its own body, and
 * this bounds how many are read at once (200 streams each sending a 2 MB report and never
 * ending took +2.3 GB on Node and +3.4 GB on Deno).
 */

import type { Context, MiddlewareHandler, Next } from "hono";
import { bodyLimit } from "hono/body-limit";
import { OverloadedError, payloadTooLarge } from "../../errors.ts";

/** The server's budget for request bodies being received; `limit` makes each route's middleware. */
export class RequestBodies {
  #used = 0;

  /** @param budgetBytes bytes of bodies received at once (`--request-body-bytes`) */
  constructor(readonly budgetBytes: number) {
    if (!Number.isSafeInteger(budgetBytes) || budgetBytes < 1) throw new RangeError(`budgetBytes must be a positive integer, got ${budgetBytes}`);
  }

  /** Bytes of the budget held by bodies being received now. */
  get usedBytes(): number {
    return this.#used;
  }

  /**
   * A route's body: at most `maxBytes` (413 with `tooLarge` over it), received while the budget
   * has room for it (503 with Retry-After meanwhile). A body is counted at its Content-Length,
   * or at `maxBytes` when it has none, from before it is read until its handler has finished.
   */
  limit(maxBytes: number, tooLarge: string): MiddlewareHandler {
    const bounded = bodyLimit({
      maxSize: maxBytes,
      onError: () => {
        throw payloadTooLarge(tooLarge);
      },
    });
    return async (c: Context, next: Next) => {
      const declared = Number(c.req.header("content-length"));
      const bytes = Number.isSafeInteger(declared) && declared >= 0 ? Math.min(declared, maxBytes) : maxBytes;
      // One body always fits, however small the budget: the route's own bound holds it.
      if (this.#used > 0 && this.#used + bytes > this.budgetBytes) {
        throw new OverloadedError(`Too many request bodies being received at once (${this.#used} of --request-body-bytes ${this.budgetBytes}); retry shortly`);
      }
      this.#used += bytes;
      try {
        await bounded(c, next);
      } finally {
        this.#used -= bytes;
      }
    };
  }
}
