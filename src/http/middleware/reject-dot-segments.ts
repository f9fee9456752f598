/** @module Refuses request targets with `.`/`..` segments, literal or percent-encoded, before routing can normalise them away. */

import type { MiddlewareHandler } from "hono";
import { badRequest } from "../../errors.ts";
import { rawPathOf } from "../raw-path.ts";

/**
 * Answers 400 to any request whose raw path has a `.` or `..` segment (also as `%2e`), so that
 * `/v1/objects/a/../b/k` is refused instead of being silently rewritten into another origin.
 *
 * @returns the middleware
 */
export const rejectDotSegments = (): MiddlewareHandler =>
  async function rejectDotSegments(c, next) {
    for (const seg of rawPathOf(c).split("/")) {
      const s = seg.replace(/%2e/gi, ".");
      if (s === "." || s === "..") {
        throw badRequest(`Invalid path: "${seg}" segments are not allowed; name the object by its key alone`);
      }
    }
    await next();
  };
