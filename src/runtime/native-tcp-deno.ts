/**
 * @module TCP socket options through rackfeed's own native library (`native/tcp.c`, built into
 * native/build/librackfeed.so) on Deno: a server allowed FFI for that library only (the Docker
 * image, `--allow-ffi=/app/native/build/librackfeed.so`) has them too.
 */

import { openNativeLibrary } from "./native-library-deno.ts";

const SYMBOLS = {
  rackfeed_tcp_tune: { parameters: ["i32", "i32"], result: "i32" },
  rackfeed_tcp_option: { parameters: ["i32", "i32"], result: "i32" },
  rackfeed_tcp_hold: { parameters: ["i32", "f64", "buffer"], result: "i32" },
  rackfeed_tcp_release: { parameters: ["i32", "i32"], result: "i32" },
  rackfeed_tcp_list: { parameters: ["buffer", "i32", "buffer", "i32"], result: "i32" },
} as const;

/** Values per row of `rackfeed_tcp_list`. */
const LIST_ROW = 6;
/** Most sockets `list` returns (a listener's connections are bounded by file descriptors anyway). */
const LIST_MAX = 1 << 20;

/** `TCP_NODELAY`: Nagle's algorithm off when non-zero (IPPROTO_TCP, Linux). */
export const TCP_NODELAY = 1;
/** `TCP_USER_TIMEOUT`: ms that sent data may stay unacknowledged before the kernel drops the connection (Linux). */
export const TCP_USER_TIMEOUT = 18;

/** How long ago a TCP connection last sent and last received data (ms), from the kernel's `tcp_info`. */
export interface TcpQuiet {
  readonly sentMs: number;
  readonly receivedMs: number;
}

/** `TcpQuiet`, and the bytes the kernel holds for the connection (sent and not yet acknowledged, or not yet sent). */
export interface TcpState extends TcpQuiet {
  readonly queuedBytes: number;
}

/** One of this process's TCP sockets on a local port, as `NativeTcp.list` finds it. */
export interface TcpSocket extends TcpQuiet {
  readonly fd: number;
  /** The socket's inode: what tells it from a later socket given the same descriptor number. */
  readonly inode: number;
  readonly state: "listen" | "established";
  /** The peer's port; 0 for a listening socket. */
  readonly remotePort: number;
}

/** The native library's TCP calls. */
export interface NativeTcp {
  /**
   * This process's TCP sockets on local address `host` (an IP literal, a listener's; a wildcard
   * such as 0.0.0.0 or :: takes every address) and port `port`, listening or established.
   *
   * @throws {Error} when `host` is no IP literal, or the descriptors cannot be listed
   */
  list(host: string, port: number): TcpSocket[];
  /** Sets TCP_NODELAY and TCP_USER_TIMEOUT (ms) on a socket: 0, or -errno. */
  tune(fd: number, userTimeoutMs: number): number;
  /** An integer TCP option's value, or -errno. */
  option(fd: number, option: number): number;
  /**
   * Shuts down both directions of the TCP connection behind `fd` when it is still the socket of
   * `inode` and `cut` says so of how long it has been quiet: the runtime that owns `fd` then reads
   * its end and closes it itself. `fd` is another owner's, which may close it and reuse its
   * number at any moment, so the library takes a duplicate first, checks that it is that socket,
   * and shuts down the duplicate (`rackfeed_tcp_hold`, `rackfeed_tcp_release`).
   *
   * @returns whether it was shut down
   */
  shutDownIfQuiet(fd: number, inode: number, cut: (state: TcpState) => boolean): boolean;
}

let loaded: NativeTcp | null | undefined;

/**
 * Loads the library's TCP calls once.
 *
 * @returns them, or undefined where the library is not built (no C compiler) or FFI for it is not allowed
 */
export function loadNativeTcp(): NativeTcp | undefined {
  if (loaded === undefined) {
    try {
      const s = openNativeLibrary(SYMBOLS);
      const quiet = new Uint32Array(3);
      const quietBytes = new Uint8Array(quiet.buffer);
      let rows = new Float64Array(LIST_ROW * 256);
      loaded = {
        list(host, port) {
          const cHost = new TextEncoder().encode(`${host}\0`);
          let n = s.rackfeed_tcp_list(cHost, port, rows, rows.length / LIST_ROW);
          // Full: there may be more; again with room for four times as many.
          while (n === rows.length / LIST_ROW && rows.length / LIST_ROW < LIST_MAX) {
            rows = new Float64Array(rows.length * 4);
            n = s.rackfeed_tcp_list(cHost, port, rows, rows.length / LIST_ROW);
          }
          if (n < 0) throw new Error(`Cannot list this process's sockets on ${host}:${port} (errno ${-n})`);
          const found: TcpSocket[] = [];
          for (let i = 0; i < n; i++) {
            const r = i * LIST_ROW;
            found.push({
              fd: rows[r],
              inode: rows[r + 1],
              state: rows[r + 2] === 10 ? "listen" : "established",
              remotePort: rows[r + 3],
              sentMs: rows[r + 4],
              receivedMs: rows[r + 5],
            });
          }
          return found;
        },
        tune: (fd, userTimeoutMs) => s.rackfeed_tcp_tune(fd, userTimeoutMs),
        option: (fd, option) => s.rackfeed_tcp_option(fd, option),
        shutDownIfQuiet(fd, inode, cut) {
          const own = s.rackfeed_tcp_hold(fd, inode, quietBytes);
          if (own < 0) return false;
          let yes = false;
          try {
            yes = cut({ sentMs: quiet[0], receivedMs: quiet[1], queuedBytes: quiet[2] });
          } finally {
            // Released whatever `cut` did: the duplicate is this process's own descriptor.
            if (s.rackfeed_tcp_release(own, yes ? 1 : 0) !== 0) yes = false;
          }
          return yes;
        },
      };
    } catch {
      loaded = null;
    }
  }
  return loaded ?? undefined;
}
