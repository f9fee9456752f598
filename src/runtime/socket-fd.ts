/** @module The file descriptor behind a `node:net` socket, on Node and on Deno. */

import type * as net from "node:net";

/**
 * Applies `f` to a connected socket's file descriptor. Neither runtime documents one for a
 * `node:net` socket; both keep it on the handle (`_handle.fd`), which is what this reads.
 *
 * @returns what `f` returns, or undefined when the socket has no descriptor (closed, or not a real socket)
 */
export function withFd<T>(socket: net.Socket, f: (fd: number) => T | undefined): T | undefined {
  const fd = (socket as unknown as { _handle?: { fd?: unknown } })._handle?.fd;
  return typeof fd === "number" && fd >= 0 ? f(fd) : undefined;
}
