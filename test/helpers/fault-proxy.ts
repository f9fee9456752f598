/**
 * @module A loopback HTTP fault proxy for origin tests and benchmarks: forwards requests to an
 * upstream (the S3 server) unchanged (Host included, so SigV4 signatures stay valid), and
 * injects latency, stalls, connection resets and 503 SlowDown answers on the requests a rule picks.
 */

import { createServer, type IncomingMessage, request, type Server, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";

/** What to do to one request. */
export type Fault =
  | { readonly kind: "pass" }
  /** Wait before forwarding; with `bytesPerSec`, also pace the response body to that rate (a per-connection bandwidth cap, like S3's). */
  | { readonly kind: "delay"; readonly ms: number; readonly bytesPerSec?: number }
  /** Forward, send the headers and `afterBytes` of the body, then go silent (keep the socket open). */
  | { readonly kind: "stall"; readonly afterBytes: number }
  /** Forward, send `afterBytes` of the body, then reset the connection. */
  | { readonly kind: "reset"; readonly afterBytes: number }
  /** Answer 503 SlowDown (S3's throttling reply) without forwarding, with `Retry-After` (seconds) if given. */
  | { readonly kind: "slowdown"; readonly retryAfter?: number }
  /** Forward, let the upstream answer whole, then reset the client's connection with none of it: a request done but its answer lost. */
  | { readonly kind: "lose-answer" }
  /** Answer 500 InternalError without forwarding. */
  | { readonly kind: "error500" }
  /** Forward, then send the body `bytes` at a time, one piece every `everyMs` (never quite silent, never done). */
  | { readonly kind: "trickle"; readonly bytes: number; readonly everyMs: number };

/** Decides the fault of each request: `n` counts requests from 1, `req` is the incoming request. */
export type FaultRule = (n: number, req: IncomingMessage) => Fault;

/** Settings of the proxy as a whole. */
export interface FaultProxyOptions {
  /**
   * Bytes per second that all response bodies together may take (a model of the origin's link:
   * a NIC or a bucket's aggregate bandwidth), shared first come, first served; unset = no cap.
   */
  readonly linkBytesPerSec?: number;
}

/** A running proxy. */
export interface FaultProxy {
  /** `http://127.0.0.1:PORT` */
  readonly url: string;
  /** Requests seen, faults injected by kind, requests in flight now and at most, TCP connections accepted and open now. */
  readonly counts: { requests: number; faults: Record<string, number>; inFlight: number; maxInFlight: number; connections: number; readonly open: number };
  /** Replaces the rule (and resets nothing else). */
  setRule(rule: FaultRule): void;
  /** Closes the listener and every connection (upstream ones too). */
  close(): Promise<void>;
}

/** A rule that delays every request by `ms` before forwarding it, and optionally caps each response at `bytesPerSec`. */
export function latency(ms: number, bytesPerSec?: number): FaultRule {
  return () => ({ kind: "delay", ms, ...(bytesPerSec ? { bytesPerSec } : {}) });
}

/**
 * A rule that injects `pick(req)`'s fault the first time each request (method, path, range) is
 * seen and passes its retries: a transient fault, so a test does not depend on how parallel
 * requests happen to be numbered.
 */
export function onceEach(pick: (req: IncomingMessage, n: number) => Fault | undefined): FaultRule {
  const seen = new Set<string>();
  return (n, req) => {
    const key = `${req.method} ${req.url} ${req.headers.range ?? ""}`;
    if (seen.has(key)) return { kind: "pass" };
    seen.add(key);
    return pick(req, n) ?? { kind: "pass" };
  };
}

/**
 * Starts a proxy on 127.0.0.1:0 in front of `upstream` (`http://host:port`).
 *
 * @param upstream where requests go
 * @param rule the fault of each request (default: pass everything)
 * @returns the proxy
 */
export async function startFaultProxy(upstream: string, rule: FaultRule = () => ({ kind: "pass" }), options: FaultProxyOptions = {}): Promise<FaultProxy> {
  const up = new URL(upstream);
  const linkRate = options.linkBytesPerSec;
  if (linkRate !== undefined && !(linkRate > 0)) throw new RangeError(`linkBytesPerSec must be > 0, got ${linkRate}`);
  /** When the shared link has sent every byte handed to it so far (performance.now() ms). */
  let linkFreeAt = 0;
  const sockets = new Set<Socket>();
  const counts = {
    requests: 0,
    faults: {} as Record<string, number>,
    inFlight: 0,
    maxInFlight: 0,
    connections: 0,
    get open() {
      return sockets.size;
    },
  };
  let current = rule;
  /** Responses whose connection closed (answered, or the client left). */
  const left = new WeakSet<ServerResponse>();
  const count = (kind: string) => (counts.faults[kind] = (counts.faults[kind] ?? 0) + 1);

  const forward = (req: IncomingMessage, res: ServerResponse, fault: Fault) => {
    // The client left (during a delay): forward nothing. An upstream answer nobody reads would
    // hold its connection open, and the upstream server's close() with it.
    if (left.has(res)) return;
    const out = request(
      { host: up.hostname, port: up.port, method: req.method, path: req.url, headers: req.headers },
      (upRes) => {
        if (fault.kind === "lose-answer") {
          upRes.resume();
          upRes.on("end", () => {
            count(fault.kind);
            res.socket?.resetAndDestroy();
          });
          return;
        }
        res.writeHead(upRes.statusCode ?? 502, upRes.headers);
        const rate = fault.kind === "delay" ? fault.bytesPerSec : undefined;
        if (rate || (linkRate && (fault.kind === "delay" || fault.kind === "pass"))) {
          const t0 = performance.now();
          let paced = 0;
          upRes.on("data", (chunk: Buffer) => {
            res.write(chunk);
            paced += chunk.length;
            const now = performance.now();
            // The chunk leaves when both its own connection (per-response cap) and the shared
            // link (bytes of every response queued first) have room for it.
            let until = rate ? t0 + (paced / rate) * 1000 : now;
            if (linkRate) {
              linkFreeAt = Math.max(linkFreeAt, now) + (chunk.length / linkRate) * 1000;
              until = Math.max(until, linkFreeAt);
            }
            const wait = until - now;
            if (wait > 1) {
              upRes.pause();
              setTimeout(() => upRes.resume(), wait);
            }
          });
          upRes.on("end", () => res.end());
          return;
        }
        if (fault.kind === "trickle") {
          const pieces: Buffer[] = [];
          upRes.on("data", (chunk: Buffer) => pieces.push(chunk));
          upRes.on("end", () => {
            const body = Buffer.concat(pieces);
            let at = 0;
            const next = () => {
              if (res.destroyed) return;
              if (at >= body.length) return void res.end();
              res.write(body.subarray(at, (at += fault.bytes)));
              setTimeout(next, fault.everyMs);
            };
            next();
          });
          return;
        }
        if (fault.kind !== "stall" && fault.kind !== "reset") {
          upRes.pipe(res);
          return;
        }
        let sent = 0;
        upRes.on("data", (chunk: Buffer) => {
          if (sent >= fault.afterBytes) return;
          const part = chunk.subarray(0, fault.afterBytes - sent);
          sent += part.length;
          res.write(part);
          if (sent >= fault.afterBytes) {
            count(fault.kind);
            if (fault.kind === "reset") {
              // Flush what was written, then RST: the client sees ECONNRESET mid-body.
              setTimeout(() => res.socket?.resetAndDestroy(), 5);
            }
            upRes.destroy();
          }
        });
        // A body shorter than `afterBytes` got through whole: finish it like a plain pass.
        upRes.on("end", () => {
          if (sent < fault.afterBytes) res.end();
        });
      },
    );
    out.on("error", () => res.socket?.destroy());
    // The client leaves mid-answer: drop the upstream request too (same reason).
    res.on("close", () => {
      if (!res.writableFinished) out.destroy();
    });
    req.pipe(out);
  };

  const server: Server = createServer((req, res) => {
    counts.requests++;
    counts.maxInFlight = Math.max(counts.maxInFlight, ++counts.inFlight);
    res.on("close", () => {
      counts.inFlight--;
      left.add(res);
    });
    const fault = current(counts.requests, req);
    // Stalls and resets count when they happen (a body shorter than `afterBytes` escapes them).
    if (fault.kind !== "pass" && fault.kind !== "stall" && fault.kind !== "reset" && fault.kind !== "lose-answer") count(fault.kind);
    switch (fault.kind) {
      case "slowdown":
      case "error500": {
        req.resume();
        const [status, code, msg] = fault.kind === "slowdown"
          ? [503, "SlowDown", "Please reduce your request rate."]
          : [500, "InternalError", "We encountered an internal error. Please try again."];
        const body = `<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>${code}</Code><Message>${msg}</Message></Error>`;
        const retryAfter = fault.kind === "slowdown" && fault.retryAfter !== undefined ? { "retry-after": String(fault.retryAfter) } : {};
        res.writeHead(status, { "content-type": "application/xml", "content-length": Buffer.byteLength(body), ...retryAfter });
        res.end(body);
        return;
      }
      case "delay":
        setTimeout(() => forward(req, res, fault), fault.ms);
        return;
      default:
        forward(req, res, fault);
    }
  });
  server.keepAliveTimeout = 60_000;
  server.on("connection", (s) => {
    counts.connections++;
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as AddressInfo).port;
  return {
    url: `http://127.0.0.1:${port}`,
    counts,
    setRule(r) {
      current = r;
    },
    close() {
      return new Promise((resolve) => {
        server.close(() => resolve());
        for (const s of sockets) s.destroy();
      });
    },
  };
}
