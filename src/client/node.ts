/**
 * @module Node transports for the SDK: a `fetch` over undici with HTTP/2 enabled (ALPN `h2`
 * on HTTPS; undici does not speak h2c), and the shm path with rings mapped through koffi
 * (`client/local-transport.ts` has the socket and ring access both runtimes share). Kept out of
 * `client.ts` so the SDK itself stays web-standard.
 */

import { Agent, fetch as undiciFetch } from "undici";
import { loadNodeMapping } from "../runtime/libc-node.ts";
import { RackfeedClient, type RackfeedClientOptions } from "./client.ts";
import { pooledFetch, type PoolControls } from "./pooled-fetch.ts";
import { checkRingSize, connectUnix, mappedRing, nextTurn, readingTransport, STORES_IN_ORDER } from "./local-transport.ts";
import type { LocalTransport } from "./shm-consumer.ts";

export { checkRingSize, connectUnix, mappedRing, nextTurn, STORES_IN_ORDER } from "./local-transport.ts";

/**
 * A client that takes the best path by itself on Node: the shared-memory ring when the server
 * is on this host, else HTTP/2 when an HTTPS server offers it (ALPN), else HTTP/1.1.
 *
 * @param opts the client's options; `ca`: PEM of a private CA or a self-signed server
 * certificate; `fetch` or `local` given here win over the defaults
 * @example
 * ```ts
 * import { createClient } from "rackfeed/client/node";
 * const rf = createClient({ url: "https://rackfeed.rack7:8443", ca });
 * for await (const b of rf.batches("pile", { rank, world, microBatch: 4 })) train(b.tokens);
 * ```
 */
export function createClient(opts: RackfeedClientOptions & { readonly ca?: string }): RackfeedClient {
  const { ca, ...rest } = opts;
  return new RackfeedClient({ ...rest, fetch: rest.fetch ?? http2Fetch({ ca }), local: rest.local ?? localTransport() });
}

/** How long an abandoned agent may wait for its requests to end before it is destroyed (ms). */
const ABANDONED_GRACE_MS = 10 * 60_000;

/**
 * A `fetch` that negotiates HTTP/2 with HTTPS servers (many streams over one connection).
 *
 * @param opts `ca`: PEM of a private CA or a self-signed server certificate; `connections`: per origin
 * @returns a fetch for `RackfeedClientOptions.fetch`; after a timed-out attempt (`abandonConnections`)
 * new requests take new connections, and the old ones close once their requests are over;
 * `close()` closes its connections (a later request opens new ones)
 * @example
 * ```ts
 * const rf = new RackfeedClient({ url: "https://rackfeed.rack7:8443", fetch: http2Fetch({ ca }) });
 * ```
 */
export function http2Fetch(opts: { ca?: string; connections?: number } = {}): typeof fetch & PoolControls {
  return pooledFetch<Agent>({
    make: () => new Agent({ allowH2: true, connections: opts.connections ?? 4, connect: opts.ca ? { ca: opts.ca } : {} }),
    send: (dispatcher, input, init) => undiciFetch(input as string, { ...(init as object), dispatcher }) as unknown as Promise<Response>,
    retire: (old) => {
      // Closed, not destroyed: requests on its live connections (other streams, other sockets)
      // finish there; those on the dead one end by their own timeouts, and then it closes.
      // Destroyed only if that has not happened in a while (a request without a timeout). The
      // timer goes once the agent has closed: held, it kept every abandoned agent for the grace.
      const cutoff = setTimeout(() => old.destroy().catch(() => {}), ABANDONED_GRACE_MS);
      cutoff.unref?.();
      old.close().catch(() => {}).finally(() => clearTimeout(cutoff));
    },
    close: (agent) => agent.close(),
  }) as unknown as typeof fetch & PoolControls;
}

/**
 * The shm path's socket and ring access on Node: `node:net` for the Unix socket, and the ring
 * mapped read-only through libc (koffi), so a batch's tokens are a view of the slot itself:
 * zero copies. Where the ring cannot be mapped (no koffi binary for the platform, or
 * `map: false`) each batch is read with `pread` into one reused buffer instead.
 *
 * @param opts `map: false` forces positional reads
 * @example
 * ```ts
 * const rf = new RackfeedClient({ url: "http://127.0.0.1:8080", local: localTransport() });
 * ```
 */
export function localTransport(opts: { map?: boolean } = {}): LocalTransport {
  const map = opts.map === false ? undefined : loadNodeMapping();
  if (!map) return readingTransport();
  return {
    connect: connectUnix,
    openRing: (path, bytes) => mappedRing(map(checkRingSize(path, bytes), bytes, false)),
    pollSlots: STORES_IN_ORDER,
    nextTurn,
  };
}
