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
 * Calls `sent` once nothing reads the body of the response to the request that `env` (the
 * runtime's bindings, Hono's `c.env`) belongs to any more: every byte handed to the kernel, or
 * the write cancelled with the connection; when in doubt it never calls `sent` (the body is then
 * left to the garbage collector). Returns false, and never calls `sent`, when the runtime cannot tell.
 */
export type WhenSent = (env: unknown, sent: () => void) => boolean;

/** Starts serving `fetch` on an address: HTTP/1.1 + h2c, or with `tls` HTTPS with ALPN h2/http1.1. */
export type Listen = (
  fetch: FetchHandler,
  addr: { hostname: string; port: number },
  tls?: { cert: string; key: string },
) => Promise<Listener>;

/** Formats `host:port`, bracketing IPv6 literals. */
export function hostPort(hostname: string, port: number): string {
  return hostname.includes(":") ? `[${hostname}]:${port}` : `${hostname}:${port}`;
}
