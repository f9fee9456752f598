/**
 * @module TCP options and idle timeouts for the connections `Deno.serve` accepts, which Deno.serve
 * sets none of and offers no option for. The listener and its connections are found among this
 * process's descriptors by their local port, and handled through rackfeed's own native library
 * (`native-tcp-deno.ts`, `native/tcp.c`): it needs FFI for that library only, and no read of
 * /proc/net/tcp (which Deno allows only with --allow-all). Linux only.
 *
 * Options are set once, on the listening socket: Linux copies them to the sockets it accepts.
 * - TCP_NODELAY: with Nagle's algorithm on, a small response over TLS on a keep-alive connection
 *   went out in two segments, the second held until the client's delayed ACK: ~44 ms per 4 KB
 *   batch or small object, against ~0.4 ms in cleartext and on Node (whose servers set it).
 * - TCP_USER_TIMEOUT: Deno.serve never times a connection out, so a client that stops reading a
 *   response (its receive window at zero) held the response's bytes, and its place under
 *   `--object-inflight-bytes` or `--batch-inflight-bytes`, for good. With it the kernel drops a
 *   connection whose sent bytes stay unacknowledged that long, zero-window probes included. A
 *   reader is kept while its window reopens within that time: a receiving kernel reopens it only
 *   once its reader has taken a good part of what it holds (~64 KB on loopback), so a reader
 *   slower than that per timeout (about 1 KiB/s at 60 s) is cut too. Node cuts a stalled reader
 *   itself.
 *
 * And what no socket option does: `IdleConnectionSweeper` closes the listener's connections that
 * have nothing going on (silent, trickling headers, idle keep-alive).
 */

import { loadNativeTcp, type NativeTcp } from "./native-tcp-deno.ts";

/** A connection that received bytes this recently is not cut by a sweep, the first time (ms). */
const RECENTLY_RECEIVED_MS = 1000;

/**
 * Sets TCP_NODELAY and TCP_USER_TIMEOUT on this process's listening socket(s) on `host`:`port`,
 * so that every connection accepted from then on has them.
 *
 * @param host the listener's address, an IP literal (what Deno.serve's `onListen` reports)
 * @param port the listener's port
 * @param unackedMs TCP_USER_TIMEOUT: how long sent bytes may stay unacknowledged (a client that
 *   stopped reading) before the kernel drops the connection
 * @returns why it could not, or undefined once both are set
 */
export function tuneListener(host: string, port: number, unackedMs: number): string | undefined {
  if (Deno.build.os !== "linux") return `not Linux (${Deno.build.os})`;
  const tcp = loadNativeTcp();
  if (!tcp) return "native/build/librackfeed.so not built (no C compiler at install), or no --allow-ffi for it";
  try {
    const listening = tcp.list(host, port).filter((s) => s.state === "listen");
    if (listening.length === 0) return `no listening socket found on ${host} port ${port}`;
    for (const s of listening) {
      const rc = tcp.tune(s.fd, unackedMs);
      if (rc !== 0) return `setsockopt failed on fd ${s.fd} (errno ${-rc})`;
    }
    return undefined;
  } catch (e) {
    return (e as Error).message;
  }
}

/**
 * Closes the connections of a `Deno.serve` listener that have nothing going on for `idleMs`, which
 * Deno.serve never does (session 16: ~20 000 silent connections took every file descriptor, and
 * an idle keep-alive connection was still open after 100 s). A connection is cut when it has sent
 * no data for `idleMs`, the kernel holds no bytes for it (sent and unacknowledged, or not yet
 * sent), and no request of its peer is being handled, none began and no handler answered within
 * `idleMs`. So it closes a connection that never sent a request (silent, or
 * trickling its headers), one idle after its responses (HTTP/1.1 keep-alive, or an HTTP/2
 * session with no stream), and an HTTP/2 session whose client lets a stream's window stay shut
 * (nothing queued in the kernel: the server holds the bytes back); and it keeps one whose request
 * the server is slow to answer, and one whose response is being read over HTTP/1.1, however
 * slowly (its receive window may stay shut for long while the client drains what it holds; the
 * bytes wait in the kernel). An HTTP/2 reader that takes less than one stream window per
 * `idleMs` looks like the stall above and is cut too (at 60 s, about 1 KiB/s with 64 KiB
 * windows). A response its client stopped reading altogether is TCP_USER_TIMEOUT's
 * (`tuneListener`). A response whose body the server itself sends nothing of for `idleMs` after
 * its handler answered (an origin stalled that long mid-object) cannot be told from that HTTP/2
 * stall, and is cut too. A connection that received bytes within the last second is left for the
 * next sweep, once: they may be a request not yet handed to its handler (the race of every
 * keep-alive timeout, narrowed).
 *
 * Requests are told apart by their peer's port alone: two peers on different hosts with the same
 * port only keep each other's connections open longer. Connections are found every `idleMs / 4`
 * (at most 15 s) among this process's descriptors by the listener's address and port (not the
 * port alone: another socket of the process may use the same port on another address), and shut
 * down (`shutdown(2)` on a duplicate, see `NativeTcp.shutDownIfQuiet`): Deno.serve then closes
 * them itself.
 */
export class IdleConnectionSweeper {
  readonly #tcp: NativeTcp;
  readonly #host: string;
  readonly #port: number;
  readonly #idleMs: number;
  readonly #now: () => number;
  /** Per peer port: requests being handled, and when a request last began or a handler last answered. */
  readonly #peers = new Map<number, { handling: number; last: number }>();
  #timer: ReturnType<typeof setInterval> | undefined;
  #closed = 0;
  /** The listener's connections at the last sweep: when each was first seen, by inode. */
  #seen = new Map<number, number>();
  /** Connections left at the last sweep because they had just received bytes, by inode. */
  #deferred = new Set<number>();

  /**
   * @param host the listener's address, an IP literal (what Deno.serve's `onListen` reports)
   * @param port the listener's port
   * @param idleMs how long a connection may have nothing going on
   * @param now a clock in ms (tests inject one)
   * @throws {Error} where the native library is not built or FFI for it is not allowed
   */
  constructor(host: string, port: number, idleMs: number, now: () => number = () => performance.now()) {
    if (!(idleMs > 0)) throw new RangeError(`idleMs must be positive, got ${idleMs}`);
    const tcp = loadNativeTcp();
    if (!tcp) throw new Error("IdleConnectionSweeper needs native/build/librackfeed.so and FFI for it");
    this.#tcp = tcp;
    this.#host = host;
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

  /** A request of the peer on `remotePort` began: its handler runs. */
  began(remotePort: number): void {
    const p = this.#peers.get(remotePort);
    if (p) {
      p.handling++;
      p.last = this.#now();
    } else this.#peers.set(remotePort, { handling: 1, last: this.#now() });
  }

  /** The handler of a request of the peer on `remotePort` answered (or failed): its response goes out. */
  answered(remotePort: number): void {
    const p = this.#peers.get(remotePort);
    if (!p) return;
    p.handling--;
    p.last = this.#now();
  }

  /**
   * Shuts down the listener's connections with nothing going on for the idle time, and forgets
   * peers with no request for that long.
   *
   * @returns how many it shut down
   */
  sweep(): number {
    const now = this.#now();
    const idle = this.#idleMs;
    for (const [port, p] of this.#peers) if (p.handling <= 0 && now - p.last >= idle) this.#peers.delete(port);
    let n = 0;
    try {
      const seen = new Map<number, number>();
      const deferred = new Set<number>();
      for (const s of this.#tcp.list(this.#host, this.#port)) {
        if (s.state !== "established") continue;
        // When each connection was first seen: one younger than the idle time is not looked at.
        const first = this.#seen.get(s.inode) ?? now;
        seen.set(s.inode, first);
        // A peer with a request being handled, or one begun or answered within the idle time, is busy.
        const peer = this.#peers.get(s.remotePort);
        if (now - first < idle || s.sentMs < idle || (peer && (peer.handling > 0 || now - peer.last < idle))) continue;
        const cut = this.#tcp.shutDownIfQuiet(s.fd, s.inode, ({ sentMs, receivedMs, queuedBytes }) => {
          if (sentMs < idle) return false;
          // A response being read, however slowly: its bytes wait in the kernel for the client's
          // window, also once Deno has written its last (a client that stopped reading is the
          // kernel's to drop, TCP_USER_TIMEOUT). Counting a response in flight until Deno's
          // `completed` instead pinned an HTTP/2 session whose client keeps a window shut.
          if (queuedBytes > 0) return false;
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
      this.#seen = seen;
      this.#deferred = deferred;
    } catch {
      // The descriptors could not be listed: nothing to sweep with this time.
    }
    this.#closed += n;
    return n;
  }
}
