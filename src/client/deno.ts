/**
 * @module Deno transport for the SDK's shm path: the Unix socket through `node:net` (as on Node)
 * and the ring mapped read-only through libc (FFI), so a batch is a typed array over the slot
 * itself: zero copies. Needs `--allow-ffi` (`-A`); without it, or off Linux, the ring is read
 * with positional reads, as on Node where koffi cannot map it.
 */

import { canMapDeno, mapFileDeno } from "../runtime/libc-deno.ts";
import { checkRingSize, connectUnix, mappedRing, nextTurn, readingTransport, STORES_IN_ORDER } from "./local-transport.ts";
import { type PooledFetch, RackfeedClient, type RackfeedClientOptions } from "./client.ts";
import { pooledFetch } from "./pooled-fetch.ts";
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
  return new RackfeedClient({ ...rest, fetch: rest.fetch ?? denoFetch(ca), local: rest.local ?? localTransport() });
}

/**
 * Deno's `fetch` over an `HttpClient` of its own, which it replaces after a timed-out attempt
 * (`abandonConnections`): the global `fetch`'s pool cannot be given up, and over HTTP/2 every
 * retry would go down the same dead connection.
 *
 * @param ca PEM of a private CA or a self-signed server certificate
 */
function denoFetch(ca: string | undefined): PooledFetch {
  return pooledFetch<Deno.HttpClient>({
    make: () => Deno.createHttpClient(ca === undefined ? {} : { caCerts: [ca] }),
    send: (client, input, init) => fetch(input, { ...init, client } as RequestInit),
    retire: (old) => old.close(), // requests in flight on it finish (Deno closes its pool, not them)
    close: (client) => client.close(),
  });
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
