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
 *
 * And what no socket option does: `IdleConnectionSweeper` closes the listener's connections that
 * have nothing going on (silent, trickling headers, idle keep-alive), found the same way.
 */

import { shutDownQuietSocketDeno, TCP_NODELAY, TCP_USER_TIMEOUT, tcpOptionDeno } from "./libc-deno.ts";

/** A connection that received bytes this recently is not cut by a sweep, the first time (ms). */
const RECENTLY_RECEIVED_MS = 1000;

/** TCP state "listen" in `/proc/net/tcp`. */
const TCP_LISTEN = "0A";
/** TCP state "established" in `/proc/net/tcp`. */
const TCP_ESTABLISHED = "01";

/** A socket in `/proc/net/tcp`: its inode, and its peer's port. */
export interface ProcTcpSocket {
  readonly inode: string;
  readonly remotePort: number;
}

/**
 * The sockets in a `/proc/net/tcp` or `/proc/net/tcp6` table whose local port is `port` and whose
 * state is `state` (listening, by default).
 *
 * @param table the file's text: a header line, then one socket per line
 * @param port the local port
 * @param state the state's two hex digits (`0A` listening, `01` established)
 */
export function socketsOnPort(table: string, port: number, state = TCP_LISTEN): ProcTcpSocket[] {
  const suffix = `:${port.toString(16).toUpperCase().padStart(4, "0")}`;
  const found: ProcTcpSocket[] = [];
  // "sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode ..."
  const local = `${suffix} `;
  for (const line of table.split("\n").slice(1)) {
    // Most lines are other ports' (with 20 000 connections, splitting each cost ~30 ms a sweep).
    if (!line.includes(local)) continue;
    const f = line.trim().split(/\s+/);
    if (f.length > 9 && f[1].endsWith(suffix) && f[3] === state) {
      found.push({ inode: f[9], remotePort: parseInt(f[2].slice(f[2].lastIndexOf(":") + 1), 16) });
    }
  }
  return found;
}

/** This process's descriptors of the sockets of `inodes`, by inode. */
function fdsOfSockets(inodes: readonly string[]): Map<string, number> {
  const wanted = new Map(inodes.map((i) => [`socket:[${i}]`, i]));
  const fds = new Map<string, number>();
  if (wanted.size === 0) return fds;
  for (const e of Deno.readDirSync("/proc/self/fd")) {
    try {
      const inode = wanted.get(Deno.readLinkSync(`/proc/self/fd/${e.name}`));
      if (inode !== undefined) fds.set(inode, Number(e.name));
    } catch {
      // closed since it was listed (the directory's own fd, among others)
    }
  }
  return fds;
}

/** The TCP sockets of the whole host on local port `port` in a state (the kernel's tables). */
function socketsInTables(port: number, state: "listen" | "established"): ProcTcpSocket[] {
  const code = state === "listen" ? TCP_LISTEN : TCP_ESTABLISHED;
  const sockets: ProcTcpSocket[] = [];
  for (const file of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    try {
      sockets.push(...socketsOnPort(Deno.readTextFileSync(file), port, code));
    } catch {
      // no IPv6 table (IPv6 off), or not Linux
    }
  }
  return sockets;
}

/** This process's TCP sockets on local port `port` in a state, with their descriptors. */
function ownSocketsOnPort(port: number, state: "listen" | "established"): (ProcTcpSocket & { fd: number })[] {
  const sockets = socketsInTables(port, state);
  const fds = fdsOfSockets(sockets.map((s) => s.inode));
  return sockets.flatMap((s) => {
    const fd = fds.get(s.inode);
    return fd === undefined ? [] : [{ ...s, fd }];
  });
}

/**
 * This process's TCP sockets on local port `port` in a state (`listen` or `established`): their
 * file descriptors.
 */
export function tcpSocketFds(port: number, state: "listen" | "established" = "listen"): number[] {
  return ownSocketsOnPort(port, state).map((s) => s.fd);
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

/**
 * Closes the connections of a `Deno.serve` listener that have nothing going on for `idleMs`, which
 * Deno.serve never does (session 16: ~20 000 silent connections took every file descriptor, and
 * an idle keep-alive connection was still open after 100 s): a connection is cut when no request
 * of its peer is being handled, none began within `idleMs`, and it has sent no data for `idleMs`.
 * That closes a connection that never sent a request (silent, or trickling its headers), and one
 * idle after its responses (HTTP/1.1 keep-alive, or an HTTP/2 session with no stream), and keeps
 * one whose request the server is slow to answer, and one whose response is being read. (A
 * response its client stopped reading is TCP_USER_TIMEOUT's: `tuneListener`.) A connection that
 * received bytes within the last second is left for the next sweep, once: they may be a request
 * not yet handed to its handler (the race of every keep-alive timeout, narrowed).
 *
 * Requests are told apart by their peer's port alone, as the kernel's table shows it: two peers
 * on different hosts with the same port only keep each other's connections open longer.
 * Connections are found every `idleMs / 4` (at most 15 s) in the kernel's table and this
 * process's descriptors, and shut down (`shutdown(2)` on a duplicate, see
 * `shutDownQuietSocketDeno`): Deno.serve then closes them itself.
 */
export class IdleConnectionSweeper {
  readonly #port: number;
  readonly #idleMs: number;
  readonly #now: () => number;
  /** Per peer port: requests being handled, and when the last one began. */
  readonly #peers = new Map<number, { running: number; began: number }>();
  #timer: ReturnType<typeof setInterval> | undefined;
  #closed = 0;
  /** Descriptors of the candidates of the last lookup, by inode. */
  #fds = new Map<string, number>();
  /** The listener's connections at the last sweep: when each was first seen, by inode. */
  #seen = new Map<string, number>();
  /** Connections left at the last sweep because they had just received bytes, by inode. */
  #deferred = new Set<string>();

  /**
   * @param port the listener's port
   * @param idleMs how long a connection may have nothing going on
   * @param now a clock in ms (tests inject one)
   */
  constructor(port: number, idleMs: number, now: () => number = () => performance.now()) {
    if (!(idleMs > 0)) throw new RangeError(`idleMs must be positive, got ${idleMs}`);
    this.#port = port;
    this.#idleMs = idleMs;
    this.#now = now;
  }

  /** Connections shut down so far. */
  get closed(): number {
    return this.#closed;
  }

  /** Sweeps every `idleMs / 4` (at most 15 s) until `stop`, on a timer that does not keep the process alive. */
  start(): void {
    this.#timer ??= setInterval(() => this.sweep(), Math.min(this.#idleMs / 4, 15_000));
    Deno.unrefTimer(this.#timer);
  }

  /** Stops sweeping (the listener is closing). */
  stop(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /** A request of the peer on `remotePort` is being handled. */
  began(remotePort: number): void {
    const p = this.#peers.get(remotePort);
    if (p) {
      p.running++;
      p.began = this.#now();
    } else this.#peers.set(remotePort, { running: 1, began: this.#now() });
  }

  /** The handler of a request of the peer on `remotePort` has answered (its body may still be going out). */
  answered(remotePort: number): void {
    const p = this.#peers.get(remotePort);
    if (p) p.running--;
  }

  /**
   * Shuts down the listener's connections with nothing going on for the idle time, and forgets
   * peers with no request for that long.
   *
   * @returns how many it shut down
   */
  sweep(): number {
    const now = this.#now();
    for (const [port, p] of this.#peers) if (p.running <= 0 && now - p.began >= this.#idleMs) this.#peers.delete(port);
    let n = 0;
    try {
      // When each connection was first seen: one younger than the idle time is not looked at.
      const seen = new Map<string, number>();
      const candidates: ProcTcpSocket[] = [];
      for (const s of socketsInTables(this.#port, "established")) {
        const first = this.#seen.get(s.inode) ?? now;
        seen.set(s.inode, first);
        // A peer with a request being handled, or one begun within the idle time, is busy.
        if (now - first >= this.#idleMs && !this.#peers.has(s.remotePort)) candidates.push(s);
      }
      this.#seen = seen;
      if (candidates.length === 0) return 0;
      // Descriptors are looked up (a readlink each, ~7 µs) only when a candidate's is not known
      // from an earlier sweep. A number taken since by another socket is harmless: the shutdown
      // checks the socket behind it first.
      if (candidates.some((s) => !this.#fds.has(s.inode))) this.#fds = fdsOfSockets(candidates.map((s) => s.inode));
      const deferred = new Set<string>();
      for (const s of candidates) {
        const fd = this.#fds.get(s.inode);
        if (fd === undefined) continue;
        const cut = shutDownQuietSocketDeno(fd, s.inode, ({ sentMs, receivedMs }) => {
          if (sentMs < this.#idleMs) return false;
          // Bytes just received may be a request on its way to its handler (an idle keep-alive
          // client asking again): left for the next sweep, once. Received again then with still
          // no request begun, it is a client trickling its headers.
          if (receivedMs < RECENTLY_RECEIVED_MS && !this.#deferred.has(s.inode)) {
            deferred.add(s.inode);
            return false;
          }
          return true;
        });
        if (cut) n++;
      }
      this.#deferred = deferred;
    } catch {
      // /proc unreadable or FFI refused: nothing to sweep with (tuneListener says so at start-up)
    }
    this.#closed += n;
    return n;
  }
}
