/**
 * @module Deno transport for the SDK's shm path: the Unix socket through `node:net` (as on Node)
 * and the ring mapped read-only through libc (FFI), so a batch is a typed array over the slot
 * itself: zero copies. Needs `--allow-ffi` (`-A`); without it, or off Linux, the ring is read
 * with positional reads, as on Node where koffi cannot map it.
 */

import { canMapDeno, mapFileDeno } from "../runtime/libc-deno.ts";
import { checkRingSize, connectUnix, mappedRing, nextTurn, readingTransport, STORES_IN_ORDER } from "./local-transport.ts";
import { type PooledFetch, RackfeedClient, type RackfeedClientOptions } from "./client.ts";
import type { LocalTransport } from "./shm-consumer.ts";

/**
 * A client that takes the best path by itself on Deno: the shared-memory ring when the server
 * is on this host (mapped with `--allow-ffi`), else Deno's `fetch`, which negotiates HTTP/2
 * with HTTPS servers (ALPN) and uses HTTP/1.1 otherwise.
 *
 * @param opts the client's options; `ca`: PEM of a private CA or a self-signed server
 * certificate; `fetch` or `local` given here win over the defaults
 * @example
 * ```ts
 * import { createClient } from "rackfeed/client/deno";
 * const rf = createClient({ url: "https://rackfeed.rack7:8443", ca });
 * ```
 */
export function createClient(opts: RackfeedClientOptions & { readonly ca?: string }): RackfeedClient {
  const { ca, ...rest } = opts;
  return new RackfeedClient({ ...rest, fetch: rest.fetch ?? pooledFetch(ca), local: rest.local ?? localTransport() });
}

/**
 * Deno's `fetch` over an `HttpClient` of its own, which it replaces after a timed-out attempt
 * (`abandonConnections`): the global `fetch`'s pool cannot be given up, and over HTTP/2 every
 * retry would go down the same dead connection.
 *
 * @param ca PEM of a private CA or a self-signed server certificate
 */
function pooledFetch(ca: string | undefined): PooledFetch {
  const makeClient = () => Deno.createHttpClient(ca === undefined ? {} : { caCerts: [ca] });
  let client: Deno.HttpClient | undefined;
  // Which client each attempt went out on: attempts that time out together replace it once.
  const clientOf = new WeakMap<AbortSignal, Deno.HttpClient>();
  const pooled: PooledFetch = (input, init) => {
    const own = (client ??= makeClient());
    if (init?.signal) clientOf.set(init.signal, own);
    return fetch(input, { ...init, client: own } as RequestInit);
  };
  pooled.abandonConnections = (signal) => {
    const old = clientOf.get(signal);
    if (old === undefined || old !== client) return;
    client = undefined; // the next request makes a new one
    old.close(); // requests in flight on it finish (Deno closes its pool, not them)
  };
  pooled.close = () => {
    client?.close();
    client = undefined;
  };
  return pooled;
}

/**
 * The shm transport for Deno: mapped rings when FFI is allowed, else positional reads.
 *
 * @example
 * ```ts
 * import { localTransport } from "rackfeed/client/deno";
 * const rf = new RackfeedClient({ url: "http://127.0.0.1:8080", local: localTransport() });
 * ```
 */
export function localTransport(): LocalTransport {
  if (!canMapDeno()) return readingTransport();
  return {
    connect: connectUnix,
    pollSlots: STORES_IN_ORDER,
    nextTurn,
    // Deno hands out the mapping as an ArrayBuffer a caller can transfer: never unmapped (see mappedRing).
    openRing: (path: string, bytes: number) => mappedRing(mapFileDeno(checkRingSize(path, bytes), bytes, false), { unmap: false }),
  };
}
