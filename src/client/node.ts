/**
 * @module Node-only transport for the SDK: a `fetch` over undici with HTTP/2 enabled (ALPN `h2`
 * on HTTPS; undici does not speak h2c). Kept out of `client.ts` so the SDK itself stays web-standard.
 */

import { Agent, fetch as undiciFetch } from "undici";

/**
 * A `fetch` that negotiates HTTP/2 with HTTPS servers (many streams over one connection).
 *
 * @param opts `ca`: PEM of a private CA or a self-signed server certificate; `connections`: per origin
 * @returns a fetch for `RackfeedClientOptions.fetch`
 * @example
 * ```ts
 * const rf = new RackfeedClient({ url: "https://rackfeed.rack7:8443", fetch: http2Fetch({ ca }) });
 * ```
 */
export function http2Fetch(opts: { ca?: string; connections?: number } = {}): typeof fetch {
  const agent = new Agent({ allowH2: true, connections: opts.connections ?? 4, connect: opts.ca ? { ca: opts.ca } : {} });
  return ((input: string | URL | Request, init?: RequestInit) =>
    undiciFetch(input as string, { ...(init as object), dispatcher: agent })) as unknown as typeof fetch;
}
