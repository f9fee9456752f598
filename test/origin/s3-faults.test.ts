// Origin faults between rackfeed and a real S3 server (RGW), injected by a loopback HTTP proxy:
// 503 SlowDown, 500, connection resets mid-body, stalls, latency, a dead origin. rackfeed must
// serve correct bytes with bounded retries, or a clear 502/504 within a bounded time, and count
// what happened in /metrics.

import type { S3Client } from "@aws-sdk/client-s3";
import { readFileSync } from "node:fs";
import { writeFile } from "node:fs/promises";
import { createServer as createTlsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { worstCaseMs } from "../../src/origin/retry.ts";
import { type FaultProxy, type FaultRule, latency, onceEach, startFaultProxy } from "../helpers/fault-proxy.ts";
import { expectSameBytes, makeWorkspace, patternBytes, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { put, s3Client, s3ConfigFile, s3Server, uniquePrefix } from "../helpers/s3.ts";
import { selfSignedCert } from "../helpers/tls.ts";
import type { S3TestServer } from "../setup/s3-server.ts";

const BLOCK = 128 * 1024;
const PART = 32 * 1024;
const SIZE = 6 * BLOCK + 999;

let s3: S3TestServer;
let client: S3Client;
let ws: Workspace;
let prefix: string;
const data = patternBytes(SIZE, 5);
const open: { close(): Promise<void> }[] = [];

async function startBehind(proxyUrl: string, args: string[] = []): Promise<RunningServer> {
  const cfg = join(ws.dir, `s3-${Math.random().toString(36).slice(2)}.json`);
  await writeFile(cfg, s3ConfigFile("s3", s3, prefix, proxyUrl));
  const rf = await startServer(ws, [
    "--config",
    cfg,
    "--cache-dir",
    join(ws.dir, `cache-${Math.random().toString(36).slice(2)}`),
    "--block-bytes",
    String(BLOCK),
    "--part-bytes",
    String(PART),
    "--metadata-ttl",
    "0",
    "--origin-backoff",
    "10ms",
    "--origin-backoff-max",
    "100ms",
    ...args,
  ]);
  open.push(rf);
  return rf;
}

async function proxy(rule: FaultRule): Promise<FaultProxy> {
  const p = await startFaultProxy(s3.endpoint, rule);
  open.push(p);
  return p;
}

/** Reads the whole object and a spread of ranges through `rf`, checking every byte. */
async function readAndCheck(rf: RunningServer): Promise<void> {
  const whole = await fetch(`${rf.url}/v1/objects/s3/obj.bin`);
  expect(whole.status).toBe(200);
  expectSameBytes(new Uint8Array(await whole.arrayBuffer()), data, "whole object");
  for (const [a, b] of [[0, 10], [BLOCK - 5, 3 * BLOCK + 5], [SIZE - 2000, SIZE - 1]]) {
    const r = await fetch(`${rf.url}/v1/objects/s3/obj.bin`, { headers: { range: `bytes=${a}-${b}` } });
    expect(r.status).toBe(206);
    expectSameBytes(new Uint8Array(await r.arrayBuffer()), data.subarray(a, b + 1), `bytes ${a}-${b}`);
  }
}

const isRangedGet = (req: { method?: string; headers: Record<string, unknown> }) => req.method === "GET" && req.headers.range !== undefined;

// A server that cannot start fails every test here (never skips them), with the reason.
let setupError: unknown;
beforeAll(async () => {
  try {
    s3 = s3Server();
    client = s3Client(s3);
    prefix = uniquePrefix("faults");
    ws = await makeWorkspace();
    await put(client, s3.bucket, `${prefix}obj.bin`, data);
  } catch (e) {
    setupError = e;
  }
});

beforeEach(() => {
  if (setupError) throw setupError;
});

afterAll(async () => {
  for (const o of open.reverse()) await o.close();
  await ws?.remove();
  client?.destroy();
});

describe("S3 origin faults (fault proxy in front of RGW)", () => {
  // Both HTTP clients an S3 origin can use (node:http's pool, the runtime's fetch) under the same faults.
  for (const http of ["node", "fetch"] as const) {
    it(`retries 503 SlowDown and 500 answers to stats and reads, serving correct bytes and counting retries (--s3-http ${http})`, async () => {
      const p = await proxy(onceEach((_, n) => (n % 3 === 0 ? { kind: "slowdown" } : n % 5 === 0 ? { kind: "error500" } : undefined)));
      // No hedges here: a hedge that wins would leave its peer's fault without a retry to count.
      const rf = await startBehind(p.url, ["--s3-http", http, "--origin-hedge", "0"]);
      await readAndCheck(rf);
      expect(p.counts.faults.slowdown).toBeGreaterThan(0);
      const retries = await rf.metric("rackfeed_origin_retries_total", { origin: "s3" });
      expect(retries).toBe(p.counts.faults.slowdown + p.counts.faults.error500);
      expect(await rf.metric("rackfeed_origin_errors_total", { origin: "s3" })).toBe(retries);
      expect(await rf.metric("rackfeed_cache_fill_errors_total")).toBe(0);
    });

    it(`retries reads whose connection is reset mid-body (--s3-http ${http})`, async () => {
      const p = await proxy(onceEach((req, n) => (isRangedGet(req) && n % 2 === 0 ? { kind: "reset", afterBytes: 1000 } : undefined)));
      const rf = await startBehind(p.url, ["--s3-http", http, "--origin-hedge", "0"]);
      await readAndCheck(rf);
      expect(p.counts.faults.reset).toBeGreaterThan(0);
      expect(await rf.metric("rackfeed_origin_retries_total", { origin: "s3" })).toBe(p.counts.faults.reset);
      expect(await rf.metric("rackfeed_origin_timeouts_total", { origin: "s3" })).toBe(0);
    });

    it(`abandons a stalled body after --origin-timeout and retries it (--s3-http ${http})`, async () => {
      const p = await proxy(onceEach((req, n) => (isRangedGet(req) && n % 4 === 0 ? { kind: "stall", afterBytes: 100 } : undefined)));
      const rf = await startBehind(p.url, ["--s3-http", http, "--origin-timeout", "300ms", "--origin-hedge", "0"]);
      const t0 = performance.now();
      await readAndCheck(rf);
      expect(p.counts.faults.stall).toBeGreaterThan(0);
      expect(await rf.metric("rackfeed_origin_timeouts_total", { origin: "s3" })).toBeGreaterThan(0);
      expect(performance.now() - t0).toBeLessThan(15_000);
    });

    it(`abandons a body that trickles (bytes keep coming, too slowly to re-arm --origin-timeout for ever) and retries it (--s3-http ${http})`, async () => {
      // The first part's GET gets 512 bytes every 100 ms: its 32 KiB would take 6.4 s, and the stall
      // timeout never fires.
      let trickled = false;
      const p = await proxy((_, req) => (!trickled && isRangedGet(req) && (trickled = true) ? { kind: "trickle", bytes: 512, everyMs: 100 } : { kind: "pass" }));
      const rf = await startBehind(p.url, ["--s3-http", http, "--origin-timeout", "400ms", "--origin-hedge", "0"]);
      const t0 = performance.now();
      const r = await fetch(`${rf.url}/v1/objects/s3/obj.bin`, { headers: { range: "bytes=0-99" } });
      expect(r.status).toBe(206);
      expectSameBytes(new Uint8Array(await r.arrayBuffer()), data.subarray(0, 100));
      expect(p.counts.faults.trickle).toBe(1);
      // The attempt ends at 400 ms + 32 KiB at 256 KiB/s = 525 ms, then the retry is not trickled.
      expect(await rf.metric("rackfeed_origin_timeouts_total", { origin: "s3" })).toBe(1);
      expect(performance.now() - t0).toBeLessThan(4000);
    });
  }

  it("serves correct bytes through 40 ms of added latency", async () => {
    const p = await proxy(() => ({ kind: "delay", ms: 40 }));
    const rf = await startBehind(p.url);
    await readAndCheck(rf);
    expect(await rf.metric("rackfeed_origin_errors_total", { origin: "s3" })).toBe(0);
  });

  it("grows its parts to 4 × time to first byte × per-connection bandwidth (and keeps them with --part-sizing fixed)", async () => {
    const far = patternBytes(24 * 256 * 1024, 12); // 24 blocks of 256 KiB
    await put(client, s3.bucket, `${prefix}far.bin`, far);
    // 30 ms to first byte and 1 MB/s per response: 4 × 0.03 s × 1e6 B/s = 120 kB -> 128 KiB parts
    // (256 KiB if RGW's own time counts too), up from 64 KiB.
    const p = await proxy(latency(30, 1_000_000));
    const flags = ["--block-bytes", "256KiB", "--part-bytes", "64KiB", "--origin-concurrency", "16"];
    const auto = await startBehind(p.url, flags);
    const got = await fetch(`${auto.url}/v1/objects/s3/far.bin`);
    expectSameBytes(new Uint8Array(await got.arrayBuffer()), far, "far.bin (auto)");
    const part = await auto.metric("rackfeed_origin_part_bytes", { origin: "s3" });
    expect([128 * 1024, 256 * 1024]).toContain(part);
    expect(await auto.metric("rackfeed_origin_first_byte_seconds", { origin: "s3" })).toBeGreaterThanOrEqual(0.03);
    const autoReads = await auto.metric("rackfeed_origin_requests_total", { origin: "s3", op: "read" });
    expect(autoReads).toBeLessThan(96); // 24 blocks × 4 parts of 64 KiB with fixed parts

    const fixed = await startBehind(p.url, [...flags, "--part-sizing", "fixed"]);
    const again = await fetch(`${fixed.url}/v1/objects/s3/far.bin`);
    expectSameBytes(new Uint8Array(await again.arrayBuffer()), far, "far.bin (fixed)");
    expect(await fixed.metric("rackfeed_origin_requests_total", { origin: "s3", op: "read" })).toBe(96);
    expect(await fixed.metric("rackfeed_origin_part_bytes", { origin: "s3" })).toBe(0); // not exported
  });

  it("raises its reads in flight to what a far origin's latency × bandwidth needs (Little's law), and keeps a fixed limit when told", async () => {
    // Four readers at once (quarters of the object): enough demand to fill any limit.
    const readQuarters = (url: string, want: Uint8Array) =>
      Promise.all([0, 1, 2, 3].map(async (q) => {
        const [a, b] = [q * want.length / 4, (q + 1) * want.length / 4 - 1];
        const r = await fetch(`${url}/v1/objects/s3/farther.bin`, { headers: { range: `bytes=${a}-${b}` } });
        expectSameBytes(new Uint8Array(await r.arrayBuffer()), want.subarray(a, b + 1), `farther.bin ${a}-${b}`);
      }));
    const far = patternBytes(16 * 256 * 1024, 15); // 16 blocks of 256 KiB
    await put(client, s3.bucket, `${prefix}farther.bin`, far);
    // 200 ms to first byte: parts grow to whole 256 KiB blocks, and a 16 MiB/s target needs at
    // least 16 MiB/s × 0.2 s ÷ 256 KiB = 12.8 reads in flight, far above --origin-concurrency 2.
    const p = await proxy(latency(200));
    // No hedges: every request the proxy sees is one the limit let through.
    const flags = ["--block-bytes", "256KiB", "--part-bytes", "64KiB", "--origin-concurrency", "2", "--origin-target-bandwidth", "16MiB", "--origin-hedge", "0"];
    const adaptive = await startBehind(p.url, [...flags, "--origin-concurrency-max", "32"]);
    await readQuarters(adaptive.url, far);
    // Little's law: at least 16 MiB/s × 0.2 s ÷ the largest part (a 256 KiB block) = 12.8 reads;
    // the exact figure (unit-tested) also counts each part's transfer time.
    const ceiling = await adaptive.metric("rackfeed_origin_concurrency_ceiling", { origin: "s3" });
    expect(ceiling).toBeGreaterThanOrEqual(13);
    expect(ceiling).toBeLessThanOrEqual(32);
    expect(await adaptive.metric("rackfeed_origin_concurrency_limit", { origin: "s3" })).toBeGreaterThan(2);

    const p2 = await proxy(latency(200));
    const fixed = await startBehind(p2.url, [...flags, "--origin-concurrency-max", "2"]);
    await readQuarters(fixed.url, far);
    expect(await fixed.metric("rackfeed_origin_concurrency_ceiling", { origin: "s3" })).toBe(2);
    expect(await fixed.metric("rackfeed_origin_concurrency_limit", { origin: "s3" })).toBe(2);
    // The proxy saw the difference: far more requests at once with the adaptive limit. (Its own
    // count runs a little high: it paces a response's end after the client has all the bytes.)
    expect(p.counts.maxInFlight).toBeGreaterThanOrEqual(2 * p2.counts.maxInFlight);
  }, 60_000);

  it("halves its reads in flight when the origin throttles, and wins them back once it stops", async () => {
    const big = patternBytes(64 * 128 * 1024, 14); // 64 blocks of 128 KiB = 256 parts of 32 KiB
    await put(client, s3.bucket, `${prefix}throttled.bin`, big);
    let throttling = true;
    const slow = onceEach((req) => (throttling && isRangedGet(req) ? { kind: "slowdown" } : undefined));
    const p = await proxy((n, req) => slow(n, req));
    const rf = await startBehind(p.url, ["--origin-concurrency", "16", "--part-sizing", "fixed", "--origin-hedge", "0", "--origin-retries", "8"]);
    expect(await rf.metric("rackfeed_origin_concurrency_limit", { origin: "s3" })).toBe(16);
    await readAndCheck(rf); // every ranged GET answered SlowDown once, then served
    expect(await rf.metric("rackfeed_origin_throttled_total", { origin: "s3" })).toBe(p.counts.faults.slowdown);
    const cut = await rf.metric("rackfeed_origin_concurrency_limit", { origin: "s3" });
    expect(cut).toBeLessThan(16);
    throttling = false;
    const res = await fetch(`${rf.url}/v1/objects/s3/throttled.bin`);
    expectSameBytes(new Uint8Array(await res.arrayBuffer()), big, "throttled.bin");
    // 256 clean reads give back one slot per window: from 8 to 16 takes 8 + 9 + ... + 15 = 92.
    expect(await rf.metric("rackfeed_origin_concurrency_limit", { origin: "s3" })).toBeGreaterThan(cut);
    expect(await rf.metric("rackfeed_origin_concurrency_limit", { origin: "s3" })).toBe(16);
  });

  it("hedges a part much slower than its peers, and the hedge wins", async () => {
    let slowDone = false;
    const p = await proxy((n, req) => {
      // After enough parts to learn the typical time, one GET takes 3 s; its hedge passes quickly.
      if (isRangedGet(req) && n > 20 && !slowDone) {
        slowDone = true;
        return { kind: "delay", ms: 3000 };
      }
      return { kind: "delay", ms: 10 };
    });
    const rf = await startBehind(p.url, ["--origin-hedge", "3", "--origin-concurrency", "4"]);
    // Block by block, so the hedge delay has samples from earlier blocks.
    let slowest = 0;
    for (let i = 0; i * BLOCK < SIZE; i++) {
      const a = i * BLOCK;
      const b = Math.min(SIZE, a + BLOCK) - 1;
      const t0 = performance.now();
      const r = await fetch(`${rf.url}/v1/objects/s3/obj.bin`, { headers: { range: `bytes=${a}-${b}` } });
      expectSameBytes(new Uint8Array(await r.arrayBuffer()), data.subarray(a, b + 1), `block ${i}`);
      slowest = Math.max(slowest, performance.now() - t0);
    }
    expect(slowDone).toBe(true);
    // The block with the 3 s part did not wait for it. (Timed per block, not over all seven: on a
    // loaded machine the others' ordinary reads need not eat into the margin.)
    expect(slowest).toBeLessThan(2500);
    expect(await rf.metric("rackfeed_origin_hedged_requests_total", { origin: "s3", won: "true" })).toBeGreaterThanOrEqual(1);
  });

  // An endpoint whose certificate nothing trusts gives the same answer every time.
  for (const http of ["node", "fetch"] as const) {
    it(`answers 502 at once, without retries, naming the way to trust a private CA, when the endpoint's TLS certificate is refused (--s3-http ${http})`, async () => {
      const { key, cert } = selfSignedCert(ws.dir, "tls");
      let connections = 0; // one attempt, no retry
      const tls = createTlsServer({ key: readFileSync(key), cert: readFileSync(cert) }, (_req, res) => res.end());
      tls.on("connection", () => connections++);
      await new Promise<void>((r) => tls.listen(0, "127.0.0.1", r));
      open.push({ close: () => new Promise<void>((r) => tls.close(() => r())) });
      const rf = await startBehind(`https://127.0.0.1:${(tls.address() as AddressInfo).port}`, ["--s3-http", http, "--origin-retries", "3"]);
      const t0 = performance.now();
      const res = await fetch(`${rf.url}/v1/objects/s3/obj.bin`);
      expect(res.status).toBe(502);
      const body = await res.json();
      expect(body.message).toMatch(/Origin "s3" failed stat "obj.bin": .*certificate is refused: expired, or signed by a CA not trusted here; for a private CA set NODE_EXTRA_CA_CERTS/);
      expect(body.message).not.toMatch(/attempts/);
      expect(performance.now() - t0).toBeLessThan(2000);
      expect(connections).toBe(1);
      expect(await rf.metric("rackfeed_origin_retries_total", { origin: "s3" })).toBe(0);
    });
  }

  // fetch's own message is "fetch failed": the reason (ECONNREFUSED) must come from its cause.
  for (const http of ["node", "fetch"] as const) {
    it(`answers 502 with a clear message within a bounded time when the origin refuses connections (--s3-http ${http})`, async () => {
      const p = await startFaultProxy(s3.endpoint);
      const deadUrl = p.url;
      await p.close();
      const rf = await startBehind(deadUrl, ["--s3-http", http, "--origin-retries", "2"]);
      const t0 = performance.now();
      const res = await fetch(`${rf.url}/v1/objects/s3/obj.bin`);
      const ms = performance.now() - t0;
      expect(res.status).toBe(502);
      const body = await res.json();
      expect(body.error).toBe("ORIGIN_UNAVAILABLE");
      expect(body.message).toMatch(/Origin "s3" failed stat "obj.bin": .*ECONNREFUSED.*\(3 attempts\)/);
      expect(ms).toBeLessThan(2000);
      expect(await rf.metric("rackfeed_origin_errors_total", { origin: "s3" })).toBe(3);
      expect(await rf.metric("rackfeed_origin_retries_total", { origin: "s3" })).toBe(2);
    });
  }

  it("answers 504 within a bounded time when the origin accepts but never answers", async () => {
    const p = await proxy(() => ({ kind: "stall", afterBytes: 0 }));
    const rf = await startBehind(p.url, ["--origin-timeout", "200ms", "--origin-retries", "1"]);
    const t0 = performance.now();
    const res = await fetch(`${rf.url}/v1/objects/s3/obj.bin`, { headers: { range: "bytes=0-99" } });
    const ms = performance.now() - t0;
    expect(res.status).toBe(504);
    const body = await res.json();
    expect(body.error).toBe("ORIGIN_TIMEOUT");
    expect(body.message).toMatch(/Origin "s3" failed stat "obj.bin": no answer within 200 ms \(2 attempts\)/);
    // Bound: 2 attempts x 200 ms + one backoff (<= 10 ms), with 2 s of slack for a loaded machine.
    expect(ms).toBeLessThan(worstCaseMs({ retries: 1, baseMs: 10, capMs: 100 }, 200) + 2000);
    expect(await rf.metric("rackfeed_origin_timeouts_total", { origin: "s3" })).toBe(2);
  });

  it("fails the requests queued behind a silent origin at once when it is judged down, tries it one at a time, and serves again when it answers", async () => {
    let silent = true;
    const p = await proxy(() => (silent ? { kind: "stall", afterBytes: 0 } : { kind: "pass" }));
    const rf = await startBehind(p.url, ["--origin-timeout", "300ms", "--origin-retries", "0", "--origin-concurrency", "2"]);
    // Twelve requests for twelve objects: two take the origin's two slots and time out; the ten
    // queued behind them would each have waited for a slot and then timed out in turn.
    const answers = await Promise.all(Array.from({ length: 12 }, async (_, k) => {
      const res = await fetch(`${rf.url}/v1/objects/s3/k${k}.bin`);
      return { status: res.status, body: await res.json() };
    }));
    expect(answers.map((a) => a.status)).toEqual(Array(12).fill(504));
    const down = answers.filter((a) => /is down/.test(a.body.message));
    expect(down.length).toBeGreaterThanOrEqual(9);
    expect(down[0].body.message).toBe('Origin "s3" is down: its last 2 requests got no answer in time; requests fail at once while one at a time tries it again');
    expect(await rf.metric("rackfeed_origin_requests_total", { origin: "s3", op: "stat" })).toBeLessThanOrEqual(3);
    expect(await rf.metric("rackfeed_origin_down", { origin: "s3" })).toBe(1);
    // The origin answers again: the next request goes to it, and the origin is up.
    silent = false;
    const back = await fetch(`${rf.url}/v1/objects/s3/obj.bin`);
    expect(back.status).toBe(200);
    expectSameBytes(new Uint8Array(await back.arrayBuffer()), data, "obj.bin after the origin came back");
    expect(await rf.metric("rackfeed_origin_down", { origin: "s3" })).toBe(0);
  });
});
