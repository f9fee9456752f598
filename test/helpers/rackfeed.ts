/** @module Test fixtures: a real rackfeed server on 127.0.0.1:0 over a temporary origin and cache directory. */

import { readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { connect, createServer as netServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { loadConfig } from "../../src/config/load.ts";
import { clientGoneNode, listenNode, whenDoneNode } from "../../src/runtime/node.ts";
import { loadNodePieceCopier } from "../../src/runtime/native-gather-node.ts";
import type { Listener } from "../../src/runtime/listener.ts";
import { createServer, type RackfeedServer, type ServerEnv } from "../../src/server.ts";

/** A temporary origin root and cache directory, removed by `remove()`. */
export interface Workspace {
  readonly dir: string;
  readonly origin: string;
  readonly cache: string;
  /** Writes `bytes` at `key` under the origin root, creating folders. */
  put(key: string, bytes: Uint8Array | string): Promise<void>;
  remove(): Promise<void>;
}

/** Makes a fresh workspace under the system temp directory. */
export async function makeWorkspace(): Promise<Workspace> {
  const dir = await mkdtemp(join(tmpdir(), "rackfeed-test-"));
  const origin = join(dir, "origin");
  const cache = join(dir, "cache");
  await mkdir(origin, { recursive: true });
  return {
    dir,
    origin,
    cache,
    async put(key, bytes) {
      const p = join(origin, key);
      await mkdir(dirname(p), { recursive: true });
      await writeFile(p, bytes);
    },
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}

/** A running server with its URL. */
export interface RunningServer {
  readonly url: string;
  readonly server: RackfeedServer;
  /** `GET`s `/metrics` and returns the value of one sample (0 when absent). */
  metric(name: string, labels?: Record<string, string>): Promise<number>;
  close(): Promise<void>;
}

/**
 * Starts rackfeed on 127.0.0.1:0 with origin `data` at the workspace's origin root and the NVMe
 * tier in its cache directory; `args` are further `serve` flags (they win over these defaults).
 */
export async function startServer(
  ws: Workspace,
  args: readonly string[] = [],
  env: Partial<ServerEnv> = {},
): Promise<RunningServer> {
  const config = loadConfig({
    // The shm path only when a test names its directory (the default /dev/shm is shared).
    args: ["--listen", "127.0.0.1:0", "--cache-dir", ws.cache, "--origin", `data=${ws.origin}`, ...(args.includes("--shm-dir") ? [] : ["--shm-dir", "off"]), ...args],
    env: {},
    readTextFile: (p) => readFileSync(p, "utf8"),
    cwd: ws.dir,
  });
  const server = await createServer(config, {
    now: () => performance.now(),
    log: () => {},
    // As `rackfeed serve` on Node: HTTP batch bodies are reused, and bounded in flight.
    whenDone: whenDoneNode,
    clientGone: clientGoneNode,
    // and batches are copied natively (test/batch/piece-copier.test.ts fails where the library is not built).
    copier: loadNodePieceCopier(),
    ...env,
  });
  const listener: Listener = await listenNode(server.fetch, config.listen, config.tls, { queuedBytes: config.batchInflightBytes });
  if (args.includes("--shm-dir")) {
    try {
      await server.startShm(Number(new URL(listener.url).port));
    } catch (e) {
      await listener.close();
      await server.close();
      throw e;
    }
  }
  return {
    url: listener.url,
    server,
    async metric(name, labels = {}) {
      const text = await (await fetch(`${listener.url}/metrics`)).text();
      return readMetric(text, name, labels);
    },
    async close() {
      await listener.close();
      await server.close();
    },
  };
}

/** The value of the sample `name{labels}` in a Prometheus text exposition (0 when absent). */
export function readMetric(text: string, name: string, labels: Record<string, string> = {}): number {
  for (const line of text.split("\n")) {
    if (line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)/.exec(line);
    if (!m || m[1] !== name) continue;
    const have = Object.fromEntries([...(m[2] ?? "").matchAll(/(\w+)="([^"]*)"/g)].map((x) => [x[1], x[2]]));
    if (Object.entries(labels).every(([k, v]) => have[k] === v)) return Number(m[3]);
  }
  return 0;
}

/** Deterministic pseudo-random bytes (xorshift), so a failure names reproducible offsets. */
export function patternBytes(length: number, seed = 1): Uint8Array {
  const out = new Uint8Array(length);
  let x = (seed * 2654435761) >>> 0 || 1;
  for (let i = 0; i < length; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out[i] = x & 0xff;
  }
  return out;
}

/**
 * Asserts two byte arrays are equal, naming the first differing offset. (vitest's deep
 * equality walks typed arrays element by element and takes seconds on a few MiB.)
 */
export function expectSameBytes(got: Uint8Array, want: Uint8Array, what = "bytes"): void {
  if (got.length !== want.length) throw new Error(`${what}: length ${got.length}, expected ${want.length}`);
  if (Buffer.compare(Buffer.from(got.buffer, got.byteOffset, got.length), Buffer.from(want.buffer, want.byteOffset, want.length)) === 0) return;
  let i = 0;
  while (got[i] === want[i]) i++;
  throw new Error(`${what}: first difference at offset ${i}: ${got[i]}, expected ${want[i]}`);
}

/** Sends the request target exactly as given (fetch and curl would normalize dot segments). */
export function rawGet(url: string, target: string): Promise<{ status: number; text: string }> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const sock = connect({ host: hostname, port: Number(port) });
    const chunks: Buffer[] = [];
    sock.setTimeout(5000, () => sock.destroy(new Error(`no answer to ${target}`)));
    sock.on("data", (d) => chunks.push(d));
    sock.on("error", reject);
    sock.on("close", () => {
      const text = Buffer.concat(chunks).toString("latin1");
      resolve({ status: Number(/^HTTP\/1\.[01] (\d{3})/.exec(text)?.[1] ?? 0), text });
    });
    sock.write(`GET ${target} HTTP/1.1\r\nHost: ${hostname}\r\nConnection: close\r\n\r\n`);
  });
}


/** A TCP port free on 127.0.0.1 right now (for a server that must come back on the same port). */
export function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = netServer().listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/** `p`, or a rejection naming `what` after `ms` (a hang would otherwise only time the test out). */
export function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  return Promise.race([
    p,
    new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`${what}: still waiting after ${ms} ms`)), ms))),
  ]).finally(() => clearTimeout(timer));
}

/** Polls `cond` every 10 ms until it holds; throws naming `what` after `timeoutMs`. */
export async function waitFor(cond: () => boolean | Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
