/** @module `GET|HEAD /v1/objects/{origin}/{key...}`: object bytes through the block cache, with HTTP range and validator semantics. */

import type { Hono } from "hono";
import type { BlockCache } from "../../cache/block-cache.ts";
import { CacheServerError } from "../../errors.ts";
import { decodeObjectKey } from "../../origin/object-key.ts";
import type { OriginGateway } from "../../origin/origin-gateway.ts";
import { evaluateRange, ifNoneMatchHits, ifRangeAllows } from "../range.ts";
import { rawPathOf } from "../raw-path.ts";
import { httpTransport, pullStream, type ServedBytes } from "../served-bytes.ts";
import { type HeldBlocks, ResponseBlockHold } from "../held-blocks.ts";
import type { WhenDone } from "../../runtime/listener.ts";
import { ORIGIN_FAILURES, READ, routeDoc } from "../route-docs.ts";

/** What the object routes need. */
export interface ObjectRoutesDeps {
  readonly origins: ReadonlyMap<string, OriginGateway>;
  readonly cache: BlockCache;
  readonly served: ServedBytes;
  /** Wraps a one-view body for the runtime (see `ServerEnv.wrapBody`). */
  readonly wrapBody: (bytes: Uint8Array) => BodyInit;
  /** The bound on the blocks responses are sending; unset: unbounded. */
  readonly holds?: ObjectHolds;
}

/** The blocks object responses hold, and the runtime's word on when a one-view response is over. */
export interface ObjectHolds {
  readonly holds: HeldBlocks;
  /** Unset (no runtime bindings): a one-view body's block is given back as the response is made. */
  readonly whenDone?: WhenDone;
}

const PREFIX = "/v1/objects/";

/** One or more characters of any kind, line terminators included (a regex `.` excludes them). */
const ANY_KEY = "[^]+";

/**
 * Registers the object routes.
 *
 * @param app the Hono app
 * @param deps origins, cache and byte counters
 */
export function objectRoutes(app: Hono, deps: ObjectRoutesDeps): void {
  // `{[^]+}` lets the key span segments; the handler re-reads the raw path (dot segments, %2f).
  // Not `{.+}`: Hono matches the percent-decoded path, and a regex `.` stops at CR, LF, U+2028
  // and U+2029, so a key holding one (`%0a`, `%E2%80%A8`) fell through to the catch-all's
  // "No object key": U+2028/U+2029 are legal key characters, and CR/LF must get the
  // control-character 400 naming the segment (decodeObjectKey).
  app.on(
    ["GET", "HEAD"],
    `/v1/objects/:origin/:key{${ANY_KEY}}`,
    routeDoc("objects", "Bytes of an object through the cache, with Range, ETag, If-None-Match, If-Range", {
      responses: {
        200: { description: "The whole object", content: { "application/octet-stream": { schema: { type: "string", format: "binary" } } } },
        206: { description: "The requested range, with Content-Range" },
        304: { description: "Not modified (If-None-Match)" },
        404: { description: "Unknown origin or object" },
        416: { description: "Range not satisfiable; Content-Range: bytes */size" },
        ...READ,
        ...ORIGIN_FAILURES,
      },
    }),
    async (c) => {
      const raw = rawPathOf(c);
      const rest = raw.startsWith(PREFIX) ? raw.slice(PREFIX.length) : "";
      const segments = rest.split("/");
      let originName: string;
      try {
        originName = decodeURIComponent(segments[0] ?? "");
      } catch {
        throw new CacheServerError("BAD_REQUEST", `Invalid origin name "${segments[0]}": a percent-escape that is not UTF-8`);
      }
      const gw = deps.origins.get(originName);
      if (!gw) {
        throw new CacheServerError(
          "ORIGIN_NOT_FOUND",
          `Unknown origin "${originName}"; configured origins: ${[...deps.origins.keys()].join(", ") || "(none)"}`,
        );
      }
      const key = decodeObjectKey(segments.slice(1));
      const info = await gw.stat(key);

      const headers: Record<string, string> = {
        "content-type": "application/octet-stream",
        "accept-ranges": "bytes",
        etag: info.etag,
        "last-modified": info.lastModified.toUTCString(),
      };
      if (ifNoneMatchHits(c.req.header("if-none-match"), info.etag)) {
        return new Response(null, { status: 304, headers });
      }
      const rangeHeader = ifRangeAllows(c.req.header("if-range"), info.etag, info.lastModified)
        ? c.req.header("range")
        : undefined;
      const range = evaluateRange(rangeHeader, info.size);
      const start = range?.start ?? 0;
      const end = range?.end ?? info.size;
      headers["content-length"] = String(end - start);
      if (range) headers["content-range"] = `bytes ${start}-${end - 1}/${info.size}`;
      const status = range ? 206 : 200;
      if (c.req.method === "HEAD") return new Response(null, { status, headers });

      const chunks = deps.cache.readRange(gw, key, info, start, end);
      // Wait for the first bytes before answering, so an origin failure still gets its own
      // status (502/504) instead of a truncated 200.
      const first = await chunks.next();
      const transport = httpTransport(c.env);
      if (first.done) return new Response(new Uint8Array(0), { status, headers });
      const hold = deps.holds ? new ResponseBlockHold(deps.holds.holds) : undefined;
      try {
        // Room for the first block before the headers: past the bound this is a 503 to retry.
        const wait = hold?.take(first.value.buffer);
        if (wait) await wait;
      } catch (e) {
        await chunks.return(undefined);
        throw e;
      }
      // Given back when the runtime says the response is over, which also covers a body it never
      // reads (its client left before the headers went out); where it cannot say, when the body
      // is made (one view) or its stream ends.
      const watched = hold !== undefined && deps.holds!.whenDone?.(c.env, () => hold.end()) === true;
      if (first.value.length === end - start) {
        // The whole body lies in one cached block: one view, no stream machinery.
        if (!watched) hold?.end();
        deps.served.add(transport, first.value.length);
        return new Response(deps.wrapBody(first.value), { status, headers });
      }
      const body = pullStream(bodyChunks(first.value, chunks, hold), (n) => deps.served.add(transport, n));
      return new Response(body, { status, headers });
    },
  );
}

/**
 * The chunks of a body, `first` then `rest`; with a `hold`, each block held while the runtime
 * sends from it (`first`'s is held already): a chunk of another block is asked for only once the
 * runtime has taken the last (the stream is pulled), so `hold.take` gives that block back first.
 * A wait past the bound cuts the body.
 */
async function* bodyChunks(
  first: Uint8Array,
  rest: AsyncGenerator<Uint8Array, void, undefined>,
  hold: ResponseBlockHold | undefined,
): AsyncGenerator<Uint8Array, void, undefined> {
  try {
    yield first;
    for (;;) {
      const r = await rest.next();
      if (r.done) return;
      const wait = hold?.take(r.value.buffer);
      if (wait) await wait;
      yield r.value;
    }
  } finally {
    hold?.end();
    await rest.return(undefined);
  }
}
