/** @module Node adapter: HTTP via @hono/node-server, process arguments, environment and signals. */

import { getRequestListener } from "@hono/node-server";
import * as http from "node:http";
import * as http2 from "node:http2";
import type { Http2Session } from "node:http2";
import * as net from "node:net";
import type { Duplex } from "node:stream";
import * as fs from "node:fs";
import { availableParallelism } from "node:os";
import { readFileSync } from "node:fs";
import type { CliHost } from "../cli/run-cli.ts";
import { type FetchHandler, hostPort, IDLE_CONNECTION_MS, type Listener, type ListenLimits } from "./listener.ts";
import { workerIndexBuilder } from "./index-builder.ts";
import { PlanningThread } from "./planning-thread.ts";
import { hostMemoryLimit } from "./memory-limit.ts";
import { loadNodePieceCopier } from "./native-gather-node.ts";
import { loadNodeFlock, loadNodeMapping, loadNodePeerCredentials } from "./libc-node.ts";
import type { LockFile } from "../cache/cache-dir-lock.ts";
import { withFd } from "./socket-fd.ts";
import { NOT_IN_HOST } from "../http/middleware/reject-bad-host.ts";
import { cpuLimit } from "./cpu-limit.ts";

/**
 * Serves `fetch` on Node. Cleartext: one port speaks HTTP/1.1 and HTTP/2 with prior knowledge
 * (h2c): the first bytes of each connection decide (the HTTP/2 preface starts "PRI * HTTP/2.0"),
 * and the socket goes to a `node:http` or a `node:http2` server sharing one request listener
 * (@hono/node-server's). With `tls`, a `node:http2` secure server negotiates `h2` or
 * `http/1.1` by ALPN.
 *
 * @param fetch the handler
 * @param addr where to listen
 * @param tls PEM certificate and key, for HTTPS
 * @returns the listener, once bound
 * @throws {Error} when the address cannot be bound (e.g. EADDRINUSE)
 */
export function listenNode(
  fetch: FetchHandler,
  addr: { hostname: string; port: number },
  tls?: { cert: string; key: string },
  limits: ListenLimits = {},
): Promise<Listener> {
  const idleMs = limits.idleMs ?? IDLE_CONNECTION_MS;
  const serve = getRequestListener(fetch as Parameters<typeof getRequestListener>[0], { errorHandler: requestErrorAnswer });
  const listener = (req: http.IncomingMessage | http2.Http2ServerRequest, res: http.ServerResponse | http2.Http2ServerResponse) => {
    if (req.httpVersionMajor === 1) closeWhenUnread(res as http.ServerResponse, idleMs); // HTTP/2: `closeWhenStalled`
    normalizeHost(req);
    return serve(req as http.IncomingMessage, res as http.ServerResponse);
  };
  const h2Options = {
    // Larger windows than the 64 KiB default: a batch is megabytes, and a small window makes
    // the server wait for WINDOW_UPDATEs; flow control still bounds what a slow reader costs.
    // At most 256 streams open per session (Node advertises 2^32 - 1 by default, Deno 200): each
    // costs memory whether or not its reader reads (5 000 stalled streams on one connection: +40 MB).
    settings: { initialWindowSize: 8 * 2 ** 20, maxFrameSize: 2 ** 20 - 1, maxConcurrentStreams: H2_MAX_STREAMS },
    // MB a session may hold queued before its new streams are refused with ENHANCE_YOUR_CALM,
    // and after 100 refusals the session dropped with every batch in it. The default (10) is
    // about one 8 MiB batch; 128 was ~50 unread 2.4 MB batches (a client that reads as it
    // pleases, nghttp). The batch bodies in flight are bounded for the whole server already
    // (`queuedBytes`): a session may hold them all, plus room for streamed objects and headers.
    maxSessionMemory: Math.max(SESSION_MEMORY_MB, Math.ceil((limits.queuedBytes ?? 0) / 1e6) + SESSION_MEMORY_MB),
  };
  let server: net.Server;
  // HTTP/2 sessions are closed at shutdown: a client's idle session would otherwise hold
  // server.close() open for as long as the client keeps it.
  const sessions = new Set<Http2Session>();
  let closing = false;
  const track = (s: Http2Session) => {
    if (closing) s.close(); // a handshake that finished after close() began
    sessions.add(s);
    s.once("close", () => sessions.delete(s));
    closeWhenIdle(s, idleMs);
    renewBeforeCalm(s, h2Options.maxSessionMemory * 1e6);
    s.on("stream", (stream: http2.ServerHttp2Stream) => closeWhenStalled(stream, idleMs));
    s.once("goaway", () => destroyWhenGone(s));
  };
  // Idle keep-alive connections are closed after this (node:http's default, or the idle time if shorter).
  const keepAliveMs = Math.min(idleMs, H1_KEEP_ALIVE_MS);
  const h1 = http.createServer({ keepAliveTimeout: keepAliveMs }, listener);
  h1.on("clientError", answerClientError);
  // h1 gets its connections from the port-sharing server below and never listens itself, so
  // its connection tracking (idle keep-alive sockets closed at shutdown, header and request
  // timeouts) is started here as `listen` would start it.
  h1.emit("listening");
  if (tls) {
    // A TLS connection that never finishes its handshake is cut after the idle time too (Node's
    // default is 120 s), like a cleartext one that never sends a byte.
    const secure = http2.createSecureServer({ ...h2Options, cert: tls.cert, key: tls.key, allowHTTP1: true, handshakeTimeout: idleMs }, listener);
    secure.on("session", track);
    // HTTP/1.1 over TLS (ALPN http/1.1, or none) is node:http's code run on this server, with
    // none of an http.Server's timeouts set: a connection that sent no request after its
    // handshake, or sat idle after a response, was never closed (the file descriptors of
    // cleartext, again). Until its first request it gets the idle time, as cleartext does;
    // after a response, the keep-alive timeout.
    (secure as unknown as { keepAliveTimeout: number }).keepAliveTimeout = keepAliveMs;
    secure.on("secureConnection", (socket: net.Socket & { alpnProtocol?: string | false }) => {
      if (socket.alpnProtocol !== "h2") socket.setTimeout(idleMs, () => socket.destroy()); // h2: closeWhenIdle
    });
    // A request disarms it (node:http arms the keep-alive timeout after the response, which then
    // ends the connection through the same listener, as node:http would).
    secure.on("request", (req: http.IncomingMessage | http2.Http2ServerRequest) => {
      if (req.httpVersionMajor === 1) req.socket.setTimeout(0);
    });
    server = secure;
  } else {
    const h2 = http2.createServer(h2Options, listener);
    h2.on("session", track);
    server = net.createServer((socket) => {
      // Until the socket is handed to h1 or h2 (which handle its errors), nothing else listens:
      // a client that resets before sending a byte (a port scanner, a TCP health check) would
      // raise an unhandled 'error' and end the process.
      const early = () => socket.destroy();
      socket.on("error", early);
      // Nothing times out a connection before its first byte (node:http's header timeout starts
      // once it has the socket): one that never sends held its file descriptor for good, and
      // ~20 000 of them left none for anyone else (every new client refused, the NVMe tier's
      // and the origin's files unopenable).
      socket.setTimeout(idleMs, early);
      socket.once("data", (first) => {
        socket.setTimeout(0);
        socket.off("timeout", early);
        socket.off("error", early);
        socket.pause();
        socket.unshift(first);
        const target = first.subarray(0, H2_PREFACE.length).equals(H2_PREFACE.subarray(0, Math.min(first.length, H2_PREFACE.length)))
          ? h2
          : h1;
        target.emit("connection", socket);
        // http2 reads the unshifted bytes through its native handle and must not see the
        // socket flowing in JS as well; the HTTP/1.1 parser needs the flow restarted.
        if (target === h1) socket.resume();
      });
    });
  }
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(addr.port, addr.hostname, () => {
      server.off("error", reject);
      const port = (server.address() as net.AddressInfo).port;
      resolve({
        url: `${tls ? "https" : "http"}://${hostPort(addr.hostname, port)}`,
        close: () =>
          new Promise<void>((done) => {
            closing = true;
            server.close(() => done());
            h1.close(); // not listening: this closes its idle connections and stops its timeout checks
            // A session closed already and still here waits on a peer that is gone (see track).
            for (const s of sessions) (s.closed ? s.destroy() : s.close());
            (server as http.Server).closeIdleConnections?.();
          }),
      });
    });
  });
}

/**
 * The Node response behind @hono/node-server's bindings: what emits `finish`/`close` (the HTTP/2
 * stream, not its compatibility response; see `whenDoneNode`), the HTTP/1.1 socket (a pipelined
 * response waiting behind another hears nothing else when it dies), and whether it is over already.
 */
function nodeResponse(env: unknown): { target: http2.ServerHttp2Stream | http.ServerResponse; socket?: net.Socket; gone: boolean } | undefined {
  const e = env as { incoming?: { socket?: net.Socket | null }; outgoing?: unknown } | undefined;
  const out = e?.outgoing;
  if (out instanceof http2.Http2ServerResponse) return { target: out.stream, gone: out.stream.destroyed || out.stream.closed };
  if (out instanceof http.ServerResponse) {
    const socket = e?.incoming?.socket ?? undefined;
    return { target: out, socket, gone: out.destroyed || socket?.destroyed === true };
  }
  return undefined;
}

/**
 * `ClientGone` on Node: the HTTP/2 stream is closed, or the HTTP/1.1 response or its socket is
 * destroyed (a pipelined response waiting behind another hears nothing else when the socket dies).
 *
 * Node tracks it without being asked, so the probe reads it when called.
 *
 * @param env Hono's `c.env` on @hono/node-server (`{ incoming, outgoing }`)
 * @returns the probe: whether nobody can receive the response any more
 */
export function clientGoneNode(env: unknown): () => boolean {
  return () => nodeResponse(env)?.gone === true;
}

/**
 * `WhenDone` on Node, from @hono/node-server's bindings (`env.outgoing`). HTTP/1.1: reusable at
 * the response's `finish`, emitted after the socket's callback for its last write, i.e. once the
 * kernel has every byte, or once the socket is gone (libuv has cancelled its writes by the time
 * their callbacks run, so nothing reads the body then either). HTTP/2: reusable at the stream's
 * own `finish`, not the compatibility response's (that one fires on stream close, which can come
 * before the session's socket write that still points at the body completes); a stream's write
 * callbacks run only once that write is done, and a reset stream never finishes. `close`
 * without `finish` (of the response, the stream or an HTTP/1.1 socket) ends it as not reusable,
 * and so does a response that is over before this is called.
 *
 * @param env Hono's `c.env` on @hono/node-server (`{ incoming, outgoing }`)
 * @param done called once: `done(true)` when the body may be reused, `done(false)` otherwise
 * @returns false where `env` carries no Node response (then `done` is never called)
 */
export function whenDoneNode(env: unknown, done: (reusable: boolean) => void): boolean {
  const r = nodeResponse(env);
  if (!r) return false;
  // Already over: the client left while the batch was assembled, and `close` has fired.
  if (r.gone) {
    done(false);
    return true;
  }
  const { target, socket } = r;
  let over = false;
  const end = (reusable: boolean) => {
    if (over) return;
    over = true;
    target.off("finish", finished);
    target.off("close", closed);
    socket?.off("close", closed);
    done(reusable);
  };
  const finished = () => end(true);
  const closed = () => end(false);
  target.once("finish", finished);
  target.once("close", closed);
  socket?.once("close", closed);
  return true;
}

const H2_PREFACE = Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");


/** An HTTP/1.1 keep-alive connection with no request is closed after this (node:http's default). */
const H1_KEEP_ALIVE_MS = 5000;

/**
 * Closes (GOAWAY) an HTTP/2 session that has had no stream open for `idleMs`: a client that sent
 * the preface and nothing else held its connection for good. Streams in progress, however slow,
 * are not counted as idle.
 */
function closeWhenIdle(s: Http2Session, idleMs: number): void {
  let open = 0;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const arm = () => {
    timer = setTimeout(() => {
      if (open === 0 && !s.closed && !s.destroyed) s.close();
    }, idleMs);
    timer.unref();
  };
  arm();
  s.on("stream", (stream: http2.ServerHttp2Stream) => {
    open++;
    clearTimeout(timer);
    stream.once("close", () => {
      if (--open === 0 && !s.closed && !s.destroyed) arm();
    });
  });
  s.once("close", () => clearTimeout(timer));
}

/** Statuses of the requests node:http cannot parse, by its error code (400 for every other). */
const CLIENT_ERROR_STATUS: Record<string, readonly [number, string, string]> = {
  HPE_HEADER_OVERFLOW: [431, "Request Header Fields Too Large", "HEADERS_TOO_LARGE"],
  ERR_HTTP_REQUEST_TIMEOUT: [408, "Request Timeout", "REQUEST_TIMEOUT"],
};

/**
 * Answers a cleartext HTTP/1.1 request node:http's parser refused (a lowercase or unknown method, a
 * control character in the target, headers past 16 KiB, a request that took too long) with a
 * status and a JSON body that says what was wrong, as every other refusal has: node:http's own
 * answer was an empty 400. A connection already answering, or gone, is only closed.
 */
function answerClientError(err: Error & { code?: string; reason?: string }, socket: Duplex): void {
  const answering = (socket as { _httpMessage?: { headersSent?: boolean } })._httpMessage?.headersSent === true;
  if (err.code === "ECONNRESET" || !socket.writable || answering) {
    socket.destroy();
    return;
  }
  const [status, reason, code] = CLIENT_ERROR_STATUS[err.code ?? ""] ?? [400, "Bad Request", "BAD_REQUEST"];
  const what = err.reason ?? err.message;
  const body = JSON.stringify({
    error: code,
    message: status === 408
      ? "The request did not arrive whole in time: send its head and body without pausing"
      : `Cannot parse the request (${what}${err.code ? `, ${err.code}` : ""}): expected HTTP/1.1 with an upper-case method, a target without control characters and headers under 16 KiB`,
  });
  socket.end(`HTTP/1.1 ${status} ${reason}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
}

/**
 * Writes a valid Host (or `:authority`) in the form URLs give it: @hono/node-server refuses
 * (400, no body) any whose host name a URL writes differently — `LOCALHOST`, `127.000.000.001`,
 * an IDN — which Deno serves. One that is more than a host and a port is left for
 * `rejectBadHost` to refuse by name.
 */
function normalizeHost(req: http.IncomingMessage | http2.Http2ServerRequest): void {
  const key = req.httpVersionMajor === 2 && req.headers[":authority"] !== undefined ? ":authority" : "host";
  const host = req.headers[key];
  if (typeof host !== "string" || NOT_IN_HOST.test(host)) return;
  try {
    const normal = new URL(`http://${host}`).host;
    if (normal !== "" && normal !== host) req.headers[key] = normal;
  } catch {
    // Not a host at all: refused below, by name.
  }
}

/**
 * The answer to a request @hono/node-server cannot make a `Request` of (a Host that is no host,
 * a target it refuses): a 400 whose body says what, as every other refusal's does (it sent an
 * empty 400).
 */
function requestErrorAnswer(e: unknown): Response {
  const bad = e instanceof Error && e.name === "RequestError";
  const message = bad
    ? `${e.message}: the request's Host header or target cannot form a URL (expected a host name or address, an optional port, and a path)`
    : `Cannot serve the request: ${e instanceof Error ? e.message : String(e)}`;
  return Response.json({ error: bad ? "BAD_REQUEST" : "INTERNAL", message }, { status: bad ? 400 : 500 });
}

/**
 * Closes (GOAWAY, NO_ERROR) an HTTP/2 session once its client has reset streams whose bodies were
 * still being written, for about half the session's memory bound. Node (20.x) keeps counting what
 * such a stream had queued against `maxSessionMemory` after the stream is gone (the memory itself
 * is freed), so a client that cancels large reads (the SDK's prefetch when its caller breaks)
 * had its new streams refused with ENHANCE_YOUR_CALM after a few hundred, then its session
 * dropped with every stream in it. The client opens a new session (undici fails one request it
 * had in flight on the old one, which the SDK retries).
 * A reset stream is counted at its whole body (its Content-Length): at most what it had queued.
 */
function renewBeforeCalm(s: Http2Session, memoryBytes: number): void {
  let stranded = 0;
  s.on("stream", (stream: http2.ServerHttp2Stream) => {
    stream.once("close", () => {
      if (stream.writableFinished || stream.rstCode === http2.constants.NGHTTP2_NO_ERROR) return;
      const bytes = Number(stream.sentHeaders?.["content-length"] ?? 0);
      if (!(bytes > 0)) return;
      stranded += bytes;
      if (stranded > memoryBytes / 2 && !s.closed && !s.destroyed) s.close();
    });
  });
}

/**
 * Cancels an HTTP/2 stream its client has stalled for `idleMs`: a request body that stopped
 * coming, or a response it stopped reading (flow control holds the rest in the server). Either
 * kept the stream, its connection and its batch's bytes for good: an open stream counts as
 * activity for `closeWhenIdle`. A stream the server itself is slow to answer (an origin's wait)
 * is no stall.
 */
function closeWhenStalled(stream: http2.ServerHttp2Stream, idleMs: number): void {
  // The stream's timer restarts with every frame it sends or receives.
  stream.setTimeout(idleMs);
  stream.on("timeout", () => {
    if (stream.destroyed || stream.closed) return;
    if (!stream.state.remoteClose || stream.bufferSize > 0) stream.close(http2.constants.NGHTTP2_CANCEL);
    else stream.setTimeout(idleMs);
  });
}

/** HTTP/1.1 sockets `closeWhenUnread` watches already. */
const watched = new WeakSet<net.Socket>();

/**
 * Closes an HTTP/1.1 connection that has had bytes of a response waiting for `idleMs` while its
 * client read none of them: it held the connection and the batch's bytes for good. One check per
 * connection, every `idleMs`, for as long as it is open (keep-alive requests share it). Progress
 * is what libuv still has to write (`writeQueueSize`) going down: `bytesWritten` counts a
 * response as written once it is handed over, long before a slow client has read it.
 */
function closeWhenUnread(res: http.ServerResponse, idleMs: number): void {
  const socket = res.socket;
  if (!socket || watched.has(socket)) return;
  watched.add(socket);
  const handle = (socket as unknown as { _handle?: { writeQueueSize?: number } })._handle;
  // What libuv had still to write at the last check, and what had been handed to the socket;
  // -1: nothing was waiting then.
  let lastQueued = -1;
  let lastWritten = -1;
  const timer = setInterval(() => {
    const queued = handle?.writeQueueSize ?? 0;
    const waiting = queued + socket.writableLength > 0;
    if (waiting && queued === lastQueued && socket.bytesWritten === lastWritten) socket.destroy();
    lastQueued = waiting ? queued : -1;
    lastWritten = waiting ? socket.bytesWritten : -1;
  }, idleMs);
  timer.unref();
  socket.once("close", () => clearInterval(timer));
}

/** MB an HTTP/2 session may hold queued beyond the server's bound on batch bodies in flight. */
const SESSION_MEMORY_MB = 128;

/** Streams one HTTP/2 session may have open at once (advertised in SETTINGS). */
export const H2_MAX_STREAMS = 256;

/** How long an HTTP/2 session may go without a byte either way after the peer's GOAWAY before it is destroyed (ms). */
const GOAWAY_STALL_MS = 5000;

/**
 * Destroys an HTTP/2 session whose peer sent GOAWAY once it makes no progress. Node (20.x) closes
 * such a session gracefully and waits for its pending data to be written; when the peer is gone
 * (it destroyed its session while a stream was held back by flow control) that never happens,
 * and the session, its socket, its streams' batch leases and server.close() stay open for good
 * (seen in a soak: ~1 in 20 destroyed client sessions). But a GOAWAY also comes from a peer that
 * closes gracefully and reads on (Node's `session.close()`, undici closing a pool): its streams
 * must finish, however long they take. Destroyed 1 s after the GOAWAY, they were cut (a 3 MiB
 * object read over 2 s arrived short): now the session goes only once nothing has been read or
 * written on its socket for `GOAWAY_STALL_MS` (a reader's WINDOW_UPDATEs and our data count).
 */
function destroyWhenGone(s: Http2Session): void {
  const socket = s.socket;
  const moved = () => socket.bytesRead + socket.bytesWritten;
  let last = moved();
  let still = 0;
  const check = setInterval(() => {
    if (s.destroyed) return clearInterval(check);
    const now = moved();
    if (now !== last) {
      last = now;
      still = 0;
      return;
    }
    still += GOAWAY_CHECK_MS;
    if (still >= GOAWAY_STALL_MS) {
      clearInterval(check);
      s.destroy();
    }
  }, GOAWAY_CHECK_MS);
  check.unref();
  s.once("close", () => clearInterval(check));
}

/** How often a session after GOAWAY is checked for progress (ms). */
const GOAWAY_CHECK_MS = 500;

/** The CLI host for Node: real process, filesystem and signals. */
export function nodeHost(): CliHost {
  return {
    args: process.argv.slice(2),
    env: process.env,
    cwd: process.cwd(),
    readTextFile: (p) => readFileSync(p, "utf8"),
    listen: listenNode,
    whenDone: whenDoneNode,
    clientGone: clientGoneNode,
    now: () => performance.now(),
    print: (line) => process.stdout.write(`${line}\n`),
    printError: (line) => process.stderr.write(`${line}\n`),
    onShutdown: (handler) => {
      let fired = false;
      for (const sig of ["SIGINT", "SIGTERM"] as const) {
        process.on(sig, () => {
          if (fired) process.exit(130); // a second signal: the operator wants out now
          fired = true;
          handler();
        });
      }
    },
    runtime: `node ${process.version}`,
    progressStream: process.stderr.isTTY ? process.stderr : undefined,
    pid: process.pid,
    isAlive,
    get lockFile() {
      return nodeFileLock();
    },
    memoryLimit: () => hostMemoryLimit(),
    buildOffThread: workerIndexBuilder("node"),
    startPlanningThread: (log) => new PlanningThread("node", log),
    cpus: cpuLimit({ cpus: availableParallelism }),
    // Getters: koffi (a native addon, ~20 ms to load) is loaded only by commands that serve shm.
    get mapFile() {
      const map = loadNodeMapping();
      return map ? (path: string, bytes: number) => map(path, bytes, true) : undefined;
    },
    get copier() {
      return loadNodePieceCopier();
    },
    get peers() {
      const peer = loadNodePeerCredentials();
      // SO_PEERCRED gives the peer's effective uid: compare with ours.
      return peer && process.geteuid ? { of: (socket: net.Socket) => withFd(socket, peer), uid: process.geteuid() } : undefined;
    },
  };
}

/**
 * The cache directory's kernel lock on Node: `flock` through koffi.
 *
 * @returns the locker, or undefined where koffi cannot bind `flock` (the lock then goes by pid)
 */
export function nodeFileLock(): LockFile | undefined {
  const tryLock = loadNodeFlock();
  if (!tryLock) return undefined;
  return async (path) => {
    const file = await fs.promises.open(path, fs.constants.O_RDWR | fs.constants.O_CREAT, 0o644);
    try {
      if (!tryLock(file.fd)) {
        await file.close();
        return undefined;
      }
      const { ino } = await file.stat();
      // The handle stays referenced by the cache's lock table until released: Node closes a
      // collected FileHandle by itself, which would drop the lock.
      return { ino, release: () => file.close() };
    } catch (e) {
      await file.close().catch(() => {});
      throw e;
    }
  };
}

/** Whether a process id is running (signal 0 probes without signalling; EPERM means it runs as another user). */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM";
  }
}
