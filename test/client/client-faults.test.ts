import { readFileSync } from "node:fs";
import * as http2 from "node:http2";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient, RackfeedError } from "../../src/client/mod.ts";
import { http2Fetch } from "../../src/client/node.ts";
import { type Fault, type FaultProxy, type FaultRule, onceEach, startFaultProxy } from "../helpers/fault-proxy.ts";
import { expectSameBytes, freePort, makeWorkspace, type RunningServer, startServer, waitFor, within, type Workspace } from "../helpers/rackfeed.ts";
import { startSilentProxy } from "../helpers/silent-proxy.ts";
import { selfSignedCert } from "../helpers/tls.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 128, seed: 5, split: "100,0,0", split_index: 0, num_samples: 2000 };
let ws: Workspace;
let rf: RunningServer;
let args: string[];

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 1500, 50, 600);
  args = [...(await datasetFlags(ws, "d", REG)), "--block-bytes", "16KiB"];
  rf = await startServer(ws, args);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const pass: Fault = { kind: "pass" };
const isBatch = (url: string | undefined, step: number) => url?.startsWith(`/v1/datasets/d/batches/${step}?`) === true;

/** A fault proxy in front of the server for `fn`, closed afterwards. */
async function withProxy<T>(rule: FaultRule, fn: (proxy: FaultProxy) => Promise<T>): Promise<T> {
  const proxy = await startFaultProxy(rf.url, rule);
  try {
    return await fn(proxy);
  } finally {
    await proxy.close();
  }
}

/** Rank 0 of 1's batch of `step` with micro-batch 4, straight from the server. */
const direct = async (step: number) =>
  new Uint8Array(await (await fetch(`${rf.url}/v1/datasets/d/batches/${step}?rank=0&world=1&micro_batch=4`)).arrayBuffer());

/** Collects `batches()` (rank 0 of 1, micro-batch 4) with copies of their bytes. */
async function collect(c: RackfeedClient, opts: { endStep: number; prefetch?: number }) {
  const got: { step: number; bytes: Uint8Array }[] = [];
  for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 4, ...opts })) {
    got.push({ step: b.step, bytes: new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength).slice() });
  }
  return got;
}


describe("RackfeedClient under network faults", () => {
  it("retries a batch whose body is cut mid-transfer (connection reset): every step once, in order, with the server's bytes", async () => {
    // 4 × 129 uint16 = 1032 body bytes: step 3's first answer stops after 300 of them.
    const rule = onceEach((req) => (isBatch(req.url, 3) ? { kind: "reset", afterBytes: 300 } : undefined));
    await withProxy(rule, async (proxy) => {
      const c = new RackfeedClient({ url: proxy.url, backoffMs: 5 });
      const got = await collect(c, { endStep: 6 });
      expect(proxy.counts.faults.reset).toBe(1);
      expect(got.map((g) => g.step)).toEqual([0, 1, 2, 3, 4, 5]);
      for (const g of got) expectSameBytes(g.bytes, await direct(g.step), `step ${g.step}`);
      expect(c.retried).toBe(1);
    });
  });

  it("abandons an attempt whose answer stalls past timeoutMs and retries it", async () => {
    // Step 2's first answer sends its headers and 300 body bytes, then nothing (the socket stays open).
    const rule = onceEach((req) => (isBatch(req.url, 2) ? { kind: "stall", afterBytes: 300 } : undefined));
    await withProxy(rule, async (proxy) => {
      const c = new RackfeedClient({ url: proxy.url, timeoutMs: 500, backoffMs: 5 });
      const t0 = performance.now();
      const got = await within(collect(c, { endStep: 6 }), 5000, "batches() over a stalled answer");
      expect(proxy.counts.faults.stall).toBe(1);
      expect(performance.now() - t0).toBeGreaterThanOrEqual(500); // it did wait for the stalled attempt
      expect(got.map((g) => g.step)).toEqual([0, 1, 2, 3, 4, 5]);
      for (const g of got) expectSameBytes(g.bytes, await direct(g.step), `step ${g.step}`);
      expect(c.retried).toBe(1);
    });
  });

  it("waits what Retry-After asks plus up to half of it at random: clients told the same do not come back in the same instant", async () => {
    // Each batch's first answer is 503 with Retry-After: 1, as a restarting server gives every rank.
    const rule = onceEach((req) => (req.url?.includes("/batches/") ? { kind: "slowdown", retryAfter: 1 } : undefined));
    await withProxy(rule, async (proxy) => {
      const waits: number[] = [];
      const c = new RackfeedClient({ url: proxy.url, sleep: (ms) => (waits.push(ms), Promise.resolve()) });
      const got = await collect(c, { endStep: 12 });
      expect(got.map((g) => g.step)).toEqual(Array.from({ length: 12 }, (_, i) => i));
      expect(proxy.counts.faults.slowdown).toBe(12);
      expect(waits.length).toBe(12);
      for (const ms of waits) {
        expect(ms).toBeGreaterThanOrEqual(1000);
        expect(ms).toBeLessThanOrEqual(1500);
      }
      expect(new Set(waits).size).toBeGreaterThan(1);
    });
  });

  it("gives up an HTTP/2 connection that went silent once an attempt timed out: its retries take a new one", async () => {
    // Over HTTP/2 every request shares one connection; one that goes quiet without closing (a NAT
    // that dropped the flow) took every retry too, until retryForMs gave up on a healthy server.
    const { key, cert } = selfSignedCert(ws.dir, "silent");
    const tls = await startServer(ws, [...args, "--tls-cert", cert, "--tls-key", key, "--cache-dir", join(ws.dir, "c-silent"), "--shm-dir", "off"]);
    const proxy = await startSilentProxy(Number(new URL(tls.url).port), 12_000);
    const c = new RackfeedClient({ url: `https://${proxy.hostPort}`, fetch: http2Fetch({ ca: readFileSync(cert, "utf8") }), timeoutMs: 1000, retryForMs: 8000, backoffMs: 5 });
    try {
      const got = await within(collect(c, { endStep: 30 }), 20_000, "batches() over a silent HTTP/2 connection");
      expect(proxy.silenced).toBe(true);
      expect(got.map((g) => g.step)).toEqual(Array.from({ length: 30 }, (_, i) => i));
      for (const g of got) expectSameBytes(g.bytes, await direct(g.step), `step ${g.step}`);
      expect(c.retried).toBeGreaterThan(0);
      expect(proxy.connections).toBeGreaterThan(1);
    } finally {
      await c.close();
      await proxy.close();
      await tls.close();
    }
  }, 30_000);

  it("lets other requests on a connection it gives up after a timeout finish there: only the timed-out one fails", async () => {
    // An HTTP/2 server where one object never answers and another answers after 700 ms, both on one connection.
    const { key, cert } = selfSignedCert(ws.dir, "collateral");
    const server = http2.createSecureServer({ key: readFileSync(key), cert: readFileSync(cert) }, (req, res) => {
      if (req.url.endsWith("/slow")) return; // never answers
      setTimeout(() => res.end("fine"), req.url.endsWith("/fine") ? 700 : 0);
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const url = `https://127.0.0.1:${(server.address() as { port: number }).port}`;
    const c = new RackfeedClient({ url, fetch: http2Fetch({ ca: readFileSync(cert, "utf8") }), timeoutMs: 1000, retries: 0 });
    try {
      await c.readObject("o", "warm"); // the connection is up
      const slow = c.readObject("o", "slow").then(() => "read", (e) => e);
      await sleep(600);
      // In flight on the same connection (from 600 to 1300 ms) when the other times out at 1000 ms.
      const fine = c.readObject("o", "fine");
      expect(new TextDecoder().decode(await fine)).toBe("fine");
      const err = await slow;
      expect(err).toBeInstanceOf(RackfeedError);
      expect(err.message).toMatch(/No complete answer in 1000 ms/);
    } finally {
      await c.close();
      server.close();
    }
  });

  it("ends batches() with the reason of its signal, its requests in flight cancelled", async () => {
    // Every batch after step 0 takes 2 s to come: the caller aborts while it waits for step 1.
    await withProxy((_n, req) => (isBatch(req.url, 0) || !req.url?.includes("/batches/") ? pass : { kind: "delay", ms: 2000 }), async (proxy) => {
      const c = new RackfeedClient({ url: proxy.url });
      const ac = new AbortController();
      const reason = new Error("trainer stopped");
      const seen: number[] = [];
      const t0 = performance.now();
      const loop = (async () => {
        for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 4, endStep: 4, prefetch: 3, signal: ac.signal })) {
          seen.push(b.step);
          setTimeout(() => ac.abort(reason), 100);
        }
      })();
      const err = await loop.then(() => undefined, (e) => e);
      expect(err).toBe(reason);
      expect(seen).toEqual([0]);
      expect(performance.now() - t0).toBeLessThan(1500); // not after step 1 came
      await waitFor(() => proxy.counts.inFlight === 0, "no request in flight at the proxy", 1000);
    });
  });

  it("leaves no request in flight after the caller breaks out of batches()", async () => {
    // Batch requests only: the loop's end sends its step timings (POST /v1/telemetry) by design.
    let batchRequests = 0;
    const rule: FaultRule = (_n, req) => {
      if (!req.url?.includes("/batches/")) return pass;
      batchRequests++;
      return isBatch(req.url, 0) ? pass : { kind: "delay", ms: 1500 };
    };
    await withProxy(rule, async (proxy) => {
      const c = new RackfeedClient({ url: proxy.url });
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 4, endStep: 100, prefetch: 8 })) {
        expect(b.step).toBe(0);
        // Steps 1-7 are on their way (held 1.5 s at the proxy) when the caller stops.
        await waitFor(() => proxy.counts.inFlight >= 7, "the prefetched requests to reach the proxy", 1000);
        break;
      }
      const requests = batchRequests;
      // Well before the held answers would have come (1.5 s).
      await waitFor(() => proxy.counts.inFlight === 0, "no request in flight at the proxy after break", 700);
      await sleep(1000);
      expect(batchRequests).toBe(requests); // and none is retried afterwards
      await c.close();
    });
  });

  it("rides out a server restart of several seconds with the default retry options: every step once, in order", async () => {
    const port = await freePort();
    const listen = ["--listen", `127.0.0.1:${port}`, "--cache-dir", join(ws.dir, "restart-cache")];
    let server: RunningServer | undefined = await startServer(ws, [...args, ...listen]);
    // Defaults only. The down time is longer than the most that the former default (8 retries,
    // 50 ms doubled up to 2 s: 7.15 s of backoff at most) could wait, so this fails without retryForMs.
    const DOWN_MS = 7500;
    const c = new RackfeedClient({ url: `http://127.0.0.1:${port}` });
    const got: { step: number; bytes: Uint8Array }[] = [];
    let restarted: Promise<void> | undefined;
    let downFor = 0;
    try {
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 4, endStep: 8 })) {
        got.push({ step: b.step, bytes: new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength).slice() });
        if (b.step === 3) {
          const old = server!;
          server = undefined;
          await old.close();
          const t0 = performance.now();
          restarted = sleep(DOWN_MS).then(async () => {
            server = await startServer(ws, [...args, ...listen]);
            downFor = performance.now() - t0;
          });
        }
      }
    } finally {
      await restarted;
      await server?.close();
    }
    expect(downFor).toBeGreaterThanOrEqual(DOWN_MS);
    expect(got.map((g) => g.step)).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(c.retried).toBeGreaterThan(0);
    for (const g of got) expectSameBytes(g.bytes, await direct(g.step), `step ${g.step}`);
  }, 30_000);
});
