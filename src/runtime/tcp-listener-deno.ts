/**
 * @module TCP_NODELAY for the sockets `Deno.serve` accepts. Deno.serve leaves Nagle's algorithm
 * on and offers no option for it, and over TLS a small response on a keep-alive connection went
 * out in two segments, the second held until the client's delayed ACK: ~44 ms per 4 KB batch or
 * small object, against ~0.4 ms in cleartext and on Node (whose HTTP servers set TCP_NODELAY).
 * Linux copies TCP_NODELAY from a listening socket to the sockets it accepts, so it is set once,
 * on the listener, which this finds among the process's file descriptors by its port
 * (`/proc/net/tcp`, `/proc/net/tcp6`). Linux only; needs `--allow-ffi` and `--allow-read`.
 */

import { tcpNoDelayDeno } from "./libc-deno.ts";

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
 * Sets TCP_NODELAY on this process's listening socket(s) on `port`, so that every connection
 * accepted from then on has it.
 *
 * @returns why it could not, or undefined once it is set
 */
export function noDelayOnListener(port: number): string | undefined {
  if (Deno.build.os !== "linux") return `not Linux (${Deno.build.os})`;
  for (const name of ["ffi", "read"] as const) {
    if (Deno.permissions.querySync({ name }).state !== "granted") return `no --allow-${name}`;
  }
  try {
    const fds = tcpSocketFds(port);
    if (fds.length === 0) return `no listening socket found on port ${port}`;
    for (const fd of fds) if (tcpNoDelayDeno(fd, true) !== true) return `setsockopt failed on fd ${fd}`;
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}
