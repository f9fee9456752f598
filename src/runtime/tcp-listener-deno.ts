/**
 * @module TCP options for the sockets `Deno.serve` accepts, which Deno.serve sets none of and
 * offers no option for. Linux copies them from a listening socket to the sockets it accepts, so
 * they are set once, on the listener, which this finds among the process's file descriptors by its
 * port (`/proc/net/tcp`, `/proc/net/tcp6`). Linux only; needs `--allow-ffi` and `--allow-read`.
 *
 * - TCP_NODELAY: with Nagle's algorithm on, a small response over TLS on a keep-alive connection
 *   went out in two segments, the second held until the client's delayed ACK: ~44 ms per 4 KB
 *   batch or small object, against ~0.4 ms in cleartext and on Node (whose servers set it).
 * - TCP_USER_TIMEOUT: Deno.serve never times a connection out, so a client that stops reading a
 *   response (its receive window at zero) held the response's bytes, and its place under
 *   `--object-inflight-bytes` or `--batch-inflight-bytes`, for good. With it the kernel drops a
 *   connection whose sent bytes stay unacknowledged that long, zero-window probes included; a
 *   reader that reads, however slowly, acknowledges and is kept. Node cuts such a reader itself.
 */

import { TCP_NODELAY, TCP_USER_TIMEOUT, tcpOptionDeno } from "./libc-deno.ts";

/** TCP state "listen" in `/proc/net/tcp`. */
const TCP_LISTEN = "0A";
/** TCP state "established" in `/proc/net/tcp`. */
const TCP_ESTABLISHED = "01";

/**
 * The socket inodes in a `/proc/net/tcp` or `/proc/net/tcp6` table whose local port is `port` and
 * whose state is `state` (listening, by default).
 *
 * @param table the file's text: a header line, then one socket per line
 * @param port the local port
 * @param state the state's two hex digits (`0A` listening, `01` established)
 */
export function socketInodesOnPort(table: string, port: number, state = TCP_LISTEN): string[] {
  const suffix = `:${port.toString(16).toUpperCase().padStart(4, "0")}`;
  const inodes: string[] = [];
  // "sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ..."
  for (const line of table.split("\n").slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length > 9 && f[1].endsWith(suffix) && f[3] === state) inodes.push(f[9]);
  }
  return inodes;
}

/** This process's file descriptors that are the sockets of `inodes`. */
function fdsOfSockets(inodes: readonly string[]): number[] {
  const wanted = new Set(inodes.map((i) => `socket:[${i}]`));
  const fds: number[] = [];
  if (wanted.size === 0) return fds;
  for (const e of Deno.readDirSync("/proc/self/fd")) {
    try {
      if (wanted.has(Deno.readLinkSync(`/proc/self/fd/${e.name}`))) fds.push(Number(e.name));
    } catch {
      // closed since it was listed (the directory's own fd, among others)
    }
  }
  return fds;
}

/**
 * This process's TCP sockets on local port `port` in a state (`listen` or `established`): their
 * file descriptors.
 */
export function tcpSocketFds(port: number, state: "listen" | "established" = "listen"): number[] {
  const code = state === "listen" ? TCP_LISTEN : TCP_ESTABLISHED;
  const inodes: string[] = [];
  for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    try {
      inodes.push(...socketInodesOnPort(Deno.readTextFileSync(file), port, code));
    } catch {
      // no IPv6 table (IPv6 off), or not Linux
    }
  }
  return fdsOfSockets(inodes);
}

/**
 * Sets TCP_NODELAY and TCP_USER_TIMEOUT on this process's listening socket(s) on `port`, so that
 * every connection accepted from then on has them.
 *
 * @param port the listener's port
 * @param unackedMs TCP_USER_TIMEOUT: how long sent bytes may stay unacknowledged (a client that
 *   stopped reading) before the kernel drops the connection
 * @returns why it could not, or undefined once both are set
 */
export function tuneListener(port: number, unackedMs: number): string | undefined {
  if (Deno.build.os !== "linux") return `not Linux (${Deno.build.os})`;
  for (const name of ["ffi", "read"] as const) {
    if (Deno.permissions.querySync({ name }).state !== "granted") return `no --allow-${name}`;
  }
  try {
    const fds = tcpSocketFds(port);
    if (fds.length === 0) return `no listening socket found on port ${port}`;
    for (const fd of fds) {
      if (tcpOptionDeno(fd, TCP_NODELAY, 1) !== 1) return `setsockopt(TCP_NODELAY) failed on fd ${fd}`;
      if (tcpOptionDeno(fd, TCP_USER_TIMEOUT, unackedMs) !== unackedMs) return `setsockopt(TCP_USER_TIMEOUT) failed on fd ${fd}`;
    }
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}
