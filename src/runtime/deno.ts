/** @module Deno adapter: HTTP via Deno.serve, arguments, environment and signals. */

import nodeProcess from "node:process";
import { statfs } from "node:fs/promises";
import type { LockFile } from "../cache/cache-dir-lock.ts";
import type { CliHost } from "../cli/run-cli.ts";
import type { FetchPool } from "../origin/s3-origin.ts";
import { type FetchHandler, hostPort, IDLE_CONNECTION_MS, type Listener, type ListenLimits } from "./listener.ts";
import { workerIndexBuilder } from "./index-builder.ts";
import { PlanningThread } from "./planning-thread.ts";
import { hostMemoryLimit } from "./memory-limit.ts";
import { canMapDeno, mapFileDeno, peerCredentialsDeno } from "./libc-deno.ts";
import { loadDenoPieceCopier } from "./native-gather-deno.ts";
import { withFd } from "./socket-fd.ts";
import { IdleConnectionSweeper, tuneListener } from "./tcp-listener-deno.ts";
import { cpuLimit } from "./cpu-limit.ts";

/**
 * Serves `fetch` with `Deno.serve`.
 *
 * @param fetch the handler
 * @param addr where to listen
 * @param tls PEM certificate and key, for HTTPS
 * @param limits `idleMs`: how long a connection may have nothing going on before it is closed, and a
 *   client may leave a response unread (TCP_USER_TIMEOUT; Deno.serve has no timeouts of its own);
 *   `queuedBytes` is not used (Deno bounds a connection's streams itself)
 * @returns the listener, once bound
 * @throws {Deno.errors.AddrInUse} when the address is taken
 */
export function listenDeno(
  fetch: FetchHandler,
  addr: { hostname: string; port: number },
  tls?: { cert: string; key: string },
  limits: ListenLimits = {},
): Promise<Listener> {
  const idleMs = limits.idleMs ?? IDLE_CONNECTION_MS;
  // Made once the port is known and the listener's options could be set (Linux, FFI allowed).
  let sweeper: IdleConnectionSweeper | undefined;
  // Each request counts for its peer's connection until its handler answers (its response's
  // bytes are then the kernel's to hold: see `IdleConnectionSweeper`).
  const counted = async (s: IdleConnectionSweeper, req: Request, info: Deno.ServeHandlerInfo<Deno.NetAddr>) => {
    const peer = info.remoteAddr.port;
    s.began(peer);
    try {
      return await fetch(req, bindings(req, info));
    } finally {
      s.answered(peer);
    }
  };
  const handler = (req: Request, info: Deno.ServeHandlerInfo<Deno.NetAddr>) =>
    sweeper === undefined ? fetch(req, bindings(req, info)) : counted(sweeper, req, info);
  return new Promise((resolve, reject) => {
    let server: Deno.HttpServer<Deno.NetAddr> | undefined;
    let closing = false;
    let retry: ReturnType<typeof setTimeout> | undefined;
    let loggedAt = -Infinity;
    let port = addr.port;
    let url = "";
    const listener: Listener = {
      get url() {
        return url;
      },
      close: async () => {
        closing = true;
        clearTimeout(retry);
        sweeper?.stop();
        await server?.shutdown();
      },
    };
    // Deno.serve ends its accept loop for good on an accept error: with every file descriptor
    // taken (connections that never send a byte are never timed out by Deno) `finished` rejects
    // with EMFILE, which went unhandled and ended the process. The listener is made again on
    // the same port instead, once a second, until it holds.
    const relisten = (e: unknown) => {
      if (closing) return;
      const now = performance.now();
      if (now - loggedAt > RELISTEN_LOG_MS) {
        loggedAt = now;
        console.error(`rackfeed: the HTTP listener stopped (${(e as Error)?.message ?? e}); listening again every ${RELISTEN_MS / 1000} s until it holds`);
      }
      retry = setTimeout(() => {
        try {
          serve(false);
        } catch (err) {
          relisten(err);
        }
      }, RELISTEN_MS);
    };
    const serve = (first: boolean) => {
      // Deno.serve speaks HTTP/1.1 and h2c (prior knowledge) on one port, and with a
      // certificate negotiates h2 or http/1.1 by ALPN.
      server = Deno.serve({
        hostname: addr.hostname,
        port,
        ...(tls ?? {}),
        onListen: ({ hostname: boundHost, port: bound }) => {
          port = bound;
          // Nagle's algorithm off, as Node's HTTP servers have it, a client that stops reading
          // cut, and idle connections closed (see tcp-listener-deno.ts): Deno.serve does none of
          // it. Over TLS each small response on a keep-alive connection took ~44 ms, a stalled
          // reader kept its response's bytes for good, and silent connections took every fd.
          const untuned = tuneListener(boundHost, bound, idleMs);
          if (untuned === undefined) {
            sweeper ??= new IdleConnectionSweeper(boundHost, bound, idleMs);
            sweeper.start();
          } else if (first) {
            console.error(
              `rackfeed: TCP_NODELAY and TCP_USER_TIMEOUT not set on the HTTP listener, and idle connections not closed (${untuned}): ` +
                "small responses over TLS may wait ~40 ms each for the client's delayed ACK, and connections that stall or sit idle stay open",
            );
          }
          if (!first) return;
          url = `${tls ? "https" : "http"}://${hostPort(addr.hostname, bound)}`;
          resolve(listener);
        },
      }, handler);
      server.finished.catch(relisten);
    };
    try {
      serve(true);
    } catch (e) {
      reject(e);
    }
  });
}

/** What `listenDeno` passes its handler as Hono's `c.env` for one request. */
function bindings(req: Request, info: Deno.ServeHandlerInfo<Deno.NetAddr>): DenoBindings {
  // A getter: Deno makes `completed` when it is first read, and rejects it when a stream
  // body is not delivered (a client that resets an HTTP/2 stream). Read for every request,
  // it went unhandled on routes that never look at it, and ended the process.
  return {
    get completed() {
      return info.completed;
    },
    // A getter too: Deno makes the signal lazily; only batches watch it.
    get signal() {
      return req.signal;
    },
    // Deno.serve does not say which protocol a request came over: HTTP/1.1 requires a Host
    // header, and Deno makes none from HTTP/2's :authority.
    get httpVersion() {
      return req.headers.has("host") ? "1.1" : "2";
    },
  };
}

/** How long after its listener failed (EMFILE) the HTTP server listens again. */
const RELISTEN_MS = 1000;
/** At most one log line per this long about a failing listener. */
const RELISTEN_LOG_MS = 60_000;

/** What the Deno listener passes handlers as Hono's `c.env`. */
export interface DenoBindings {
  /**
   * Deno.serve's `info.completed`: settles once the response is done with (written out, or the
   * connection gone); it rejects when a stream body was not delivered, so whoever reads it must
   * handle that.
   */
  readonly completed: Promise<void>;
  /**
   * The request's signal: Deno aborts it when the client goes (an HTTP/1.1 connection closed, an
   * HTTP/2 stream reset or its connection closed), also while the handler still works. With
   * `deno.json`'s `"unstable": ["no-legacy-abort"]` it is not aborted after a successful response
   * (and Deno prints no warning about that).
   */
  readonly signal: AbortSignal;
  /** "2" for an HTTP/2 request, else "1.1" (for `httpTransport`, the `transport` label of metrics). */
  readonly httpVersion: "1.1" | "2";
}

/**
 * `WhenDone` on Deno: `info.completed`. Deno completes a stream body (what `denoBody` sends) only
 * once it has been read and written, and also when an HTTP/1.1 connection is gone; it rejects
 * when an HTTP/2 stream with a stream body is reset, which ends the lease as not reusable. (A
 * `Uint8Array` body Deno copies first and completes at once, which would let a slow reader's
 * copy escape the in-flight bound.)
 *
 * @param env the bindings `listenDeno` passes (`DenoBindings`)
 * @param done called once, with false: the body is never reused on Deno (see below)
 * @returns false where `env` carries no `completed` (then `done` is never called)
 */
export function whenDoneDeno(env: unknown, done: (reusable: boolean) => void): boolean {
  const completed = (env as Partial<DenoBindings> | undefined)?.completed;
  if (!completed) return false;
  // Its bytes count as in flight until then, but the body is never reused: over HTTP/2, Deno
  // reports a response complete while its data may still wait to be sent, with no copy, and a
  // pooled body reused then sent another batch's bytes (5-15 in ~2 000 batches under mixed
  // load). Deno does not say which protocol a request came over (a Host header is no proof).
  completed.then(() => done(false), () => done(false));
  return true;
}

/**
 * `ClientGone` on Deno: the request's signal is aborted (see `DenoBindings.signal`). Deno makes
 * that signal only when it is first read, and a signal made after the client left is aborted only
 * a moment later, so it is read here, before any wait, and probed after it.
 */
export function clientGoneDeno(env: unknown): () => boolean {
  const signal = (env as Partial<DenoBindings> | undefined)?.signal;
  return () => signal?.aborted === true;
}

/** The CLI host for Deno. */
export function denoHost(): CliHost {
  return {
    args: [...Deno.args],
    env: Deno.env.toObject(),
    cwd: Deno.cwd(),
    readTextFile: (p) => Deno.readTextFileSync(p),
    listen: listenDeno,
    now: () => performance.now(),
    print: (line) => console.log(line),
    printError: (line) => console.error(line),
    onShutdown: (handler) => {
      let fired = false;
      for (const sig of ["SIGINT", "SIGTERM"] as const) {
        Deno.addSignalListener(sig, () => {
          if (fired) Deno.exit(130);
          fired = true;
          handler();
        });
      }
    },
    runtime: `deno ${Deno.version.deno}`,
    progressStream: Deno.stderr.isTerminal() ? nodeProcess.stderr : undefined,
    wrapBody: denoBody,
    whenDone: whenDoneDeno,
    clientGone: clientGoneDeno,
    pid: Deno.pid,
    isAlive,
    lockFile: lockFileDeno,
    // statfs needs --allow-sys: asked without it, Deno prompts on a terminal (start-up hung).
    // Without it the disk budget is not fitted to the file system's room.
    fileSystem: (dir) =>
      granted({ name: "sys", kind: "statfs" as Deno.SysPermissionDescriptor["kind"] }) ? statfs(dir) : Promise.resolve(undefined),
    // Physical memory needs --allow-sys: asked without it, Deno prompts on a terminal (start-up
    // hung). Without it, cgroup limits alone are read.
    memoryLimit: () =>
      hostMemoryLimit(granted({ name: "sys", kind: "systemMemoryInfo" }) ? {} : { totalmem: () => NaN }),
    buildOffThread: workerIndexBuilder("deno"),
    startPlanningThread: (log) => new PlanningThread("deno", log),
    cpus: cpuLimit({ cpus: () => navigator.hardwareConcurrency ?? 1 }),
    // Deno's node:http client left sockets of aborted S3 requests open (fds grew under origin
    // faults, bench/RESULTS.md "S3 origin soak"); its own fetch closes them.
    s3HttpAuto: "fetch",
    s3FetchPool: s3FetchPoolDeno,
    // Getters: libc is opened only by commands that serve shm.
    get mapFile() {
      return canMapDeno() ? (path: string, bytes: number) => mapFileDeno(path, bytes, true) : undefined;
    },
    get copier() {
      return loadDenoPieceCopier();
    },
    get peers() {
      return peerIdentity();
    },
  };
}

/**
 * SO_PEERCRED through FFI, and this process's user; undefined (every shm peer then needs the
 * read token) without `--allow-ffi`, or without `--allow-sys`, which `Deno.uid()` needs.
 */
function peerIdentity(): CliHost["peers"] {
  if (!canMapDeno()) return undefined;
  let uid: number | null;
  try {
    // Asked first: on a terminal, Deno.uid() without the permission would prompt for it.
    if (Deno.permissions.querySync({ name: "sys", kind: "uid" }).state !== "granted") return undefined;
    uid = Deno.uid();
  } catch {
    return undefined;
  }
  return uid === null ? undefined : { of: (socket) => withFd(socket, peerCredentialsDeno), uid };
}

/** An S3 origin's own fetch pool on Deno: an `HttpClient` keeping at most `maxIdle` idle connections, closed with the origin. */
export function s3FetchPoolDeno(maxIdle: number): FetchPool {
  const client = Deno.createHttpClient({ poolMaxIdlePerHost: maxIdle });
  let closed = false;
  return {
    init: { client },
    // Deno's close() throws the second time; closing twice is harmless here.
    close: () => {
      if (closed) return;
      closed = true;
      client.close();
    },
  };
}

/** The cache directory's kernel lock on Deno: `FsFile.tryLock`, an exclusive `flock` as on Node. */
export const lockFileDeno: LockFile = async (path) => {
  const file = await Deno.open(path, { read: true, write: true, create: true });
  try {
    if (!(await file.tryLock(true))) {
      file.close();
      return undefined;
    }
    const { ino } = await file.stat();
    // deno-lint-ignore require-await -- a failed close rejects the promise instead of throwing
    return { ino: ino ?? -1, release: async () => file.close() };
  } catch (e) {
    try {
      file.close();
    } catch {
      // already closed
    }
    throw e;
  }
};

/**
 * Whether Deno grants a permission now, asked without a prompt: asking by using what it guards
 * prompts on a terminal and holds the event loop until someone answers.
 */
function granted(d: Deno.PermissionDescriptor): boolean {
  return Deno.permissions.querySync(d).state === "granted";
}

/** Whether a process id is running (signal 0 probes without signalling); true where Deno may not tell (no --allow-run). */
export function isAlive(pid: number): boolean {
  // Asked without the permission, Deno prompts on a terminal and holds the event loop (with
  // --no-prompt it throws): a process we cannot probe is taken as alive, whose files are kept.
  if (!granted({ name: "run" })) return true;
  try {
    Deno.kill(pid, 0 as unknown as Deno.Signal);
    return true;
  } catch (e) {
    return !(e instanceof Deno.errors.NotFound) && !String((e as Error).message).includes("ESRCH");
  }
}

/**
 * How Deno sends one view of bytes (a cached block, a batch body): as a one-chunk stream, never
 * as the `Uint8Array` itself. Deno copies a `Uint8Array` body and then reports the response
 * complete while a slow reader still holds the copy, outside every bound of ours; a stream chunk
 * goes out as is, and `info.completed` waits until it is written, so the batch bodies in flight
 * stay within `--batch-inflight-bytes`. It is also no slower: 8 MiB bodies went 35–50 % faster
 * over HTTP/1.1, 1 MiB ones the same or faster, h2c the same (bench/RESULTS.md transport "Session 8").
 */
export function denoBody(bytes: Uint8Array): BodyInit {
  return oneChunkStream(bytes);
}

/** A body of one chunk: the cached view itself, never copied or detached. */
export function oneChunkStream(bytes: Uint8Array): ReadableStream<Uint8Array> {
  // A default (not "bytes") stream: a byte stream would transfer, i.e. detach, the cached buffer.
  return new ReadableStream({
    start(controller) {
      controller.enqueue(bytes);
      controller.close();
    },
  });
}
