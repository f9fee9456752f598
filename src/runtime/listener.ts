/** @module The shape both runtime adapters return when they start serving HTTP. */

/** A fetch handler as Hono exposes it; `env` carries runtime-specific bindings (Node's `incoming`). */
export type FetchHandler = (req: Request, env?: unknown) => Response | Promise<Response>;

/** A listening HTTP server. */
export interface Listener {
  /** `http://host:port`, with the port actually bound. */
  readonly url: string;
  /** Stops accepting, lets requests in flight finish, then resolves. */
  close(): Promise<void>;
}

/**
 * Calls `done` once, when the response to the request that `env` (the runtime's bindings, Hono's
 * `c.env`) belongs to is over: `done(true)` when nothing reads its body any more (every byte
 * handed to the kernel, or the write cancelled with the connection), `done(false)` when it ended
 * otherwise and the runtime may still hold the body (an aborted HTTP/2 stream). Returns false,
 * and never calls `done`, when the runtime cannot tell.
 */
export type WhenDone = (env: unknown, done: (reusable: boolean) => void) => boolean;

/**
 * Starts watching the client of the request that `env` belongs to, and returns a probe: whether
 * that client is gone (its response can reach nobody). Taken before a request may wait, probed
 * after: a runtime may notice a departure only once it has been asked to watch (Deno).
 */
export type ClientGone = (env: unknown) => () => boolean;

/**
 * How long a connection may stay open without a request: before its first byte, and an HTTP/2
 * session with no stream open (node:http2 has no such timeout; an idle HTTP/1.1 connection is
 * closed by node:http after 5 s, and one whose headers do not come in 60 s too). Also how long a
 * client may leave a response unread (Node: its stream timers; Deno: TCP_USER_TIMEOUT).
 */
export const IDLE_CONNECTION_MS = 60_000;

/** What a listener may hold for its connections. */
export interface ListenLimits {
  /** A connection with nothing in progress, or whose client stopped reading, is closed after this (ms; default `IDLE_CONNECTION_MS`). */
  readonly idleMs?: number;
  /**
   * Response bytes the server may have queued for its clients, all together (HTTP batch bodies
   * in flight, `--batch-inflight-bytes`): one HTTP/2 connection may hold as much without its new
   * streams being refused.
   */
  readonly queuedBytes?: number;
}

/** Starts serving `fetch` on an address: HTTP/1.1 + h2c, or with `tls` HTTPS with ALPN h2/http1.1. */
export type Listen = (
  fetch: FetchHandler,
  addr: { hostname: string; port: number },
  tls?: { cert: string; key: string },
  limits?: ListenLimits,
) => Promise<Listener>;

/** Formats `host:port`, bracketing IPv6 literals. */
export function hostPort(hostname: string, port: number): string {
  return hostname.includes(":") ? `[${hostname}]:${port}` : `${hostname}:${port}`;
}
