import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient, RackfeedError } from "../../src/client/mod.ts";
import { MAX_QUEUED_STEPS } from "../../src/client/client.ts";
import { createClient, http2Fetch } from "../../src/client/node.ts";
import { expectSameBytes, freePort, makeWorkspace, patternBytes, readMetric, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { startFaultProxy } from "../helpers/fault-proxy.ts";
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
  await ws.put("obj.bin", patternBytes(100_000, 3));
  args = [...(await datasetFlags(ws, "d", REG)), "--block-bytes", "16KiB"];
  rf = await startServer(ws, args);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

const direct = async (url: string, step: number) =>
  new Uint8Array(await (await fetch(`${url}/v1/datasets/d/batches/${step}?rank=1&world=2&micro_batch=4`)).arrayBuffer());

describe("RackfeedClient", () => {
  it("reads objects and ranges of them", async () => {
    const c = new RackfeedClient({ url: rf.url });
    expectSameBytes(await c.readObject("data", "obj.bin"), patternBytes(100_000, 3));
    expectSameBytes(await c.readObject("data", "obj.bin", { start: 99_990 }), patternBytes(100_000, 3).subarray(99_990));
    expectSameBytes(await c.readObject("data", "obj.bin", { start: 5, end: 10 }), patternBytes(100_000, 3).subarray(5, 10));
  });

  it("iterates a rank's batches from any step with prefetch, typed by the dataset's dtype", async () => {
    const c = new RackfeedClient({ url: rf.url });
    const seen: number[] = [];
    for await (const b of c.batches("d", { rank: 1, world: 2, microBatch: 4, startStep: 10, endStep: 20, prefetch: 3 })) {
      seen.push(b.step);
      expect(b.tokens).toBeInstanceOf(Uint16Array);
      expect(b.shape).toEqual([4, 129]);
      expect(b.firstSample).toBe((b.step * 2 + 1) * 4);
      expect(b.waitSeconds).toBeGreaterThanOrEqual(0);
      expectSameBytes(new Uint8Array(b.tokens.buffer), await direct(rf.url, b.step), `step ${b.step}`);
    }
    expect(seen).toEqual([10, 11, 12, 13, 14, 15, 16, 17, 18, 19]);
  });

  it("keeps prefetch requests in flight beyond the batch the caller holds, over HTTP (prefetch 1 included)", async () => {
    for (const prefetch of [1, 3]) {
      const proxy = await startFaultProxy(rf.url);
      try {
        const c = new RackfeedClient({ url: proxy.url });
        const it = c.batches("d", { rank: 0, world: 1, microBatch: 4, startStep: 0, endStep: 50, prefetch });
        expect((await it.next()).value?.step).toBe(0);
        // While the caller works on step 0: steps 1 .. prefetch are asked for, and no more.
        await waitFor(() => proxy.counts.requests === 1 + prefetch, `${1 + prefetch} requests with prefetch ${prefetch} (saw ${proxy.counts.requests})`);
        await new Promise((r) => setTimeout(r, 100));
        expect(proxy.counts.requests).toBe(1 + prefetch);
        await it.return(undefined);
      } finally {
        await proxy.close();
      }
    }
  });

  it("adds no abort listener per request: 64 requests in flight raise no listener-leak warning", async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on("warning", onWarning);
    try {
      const c = new RackfeedClient({ url: rf.url });
      let n = 0;
      for await (const _ of c.batches("d", { rank: 0, world: 1, microBatch: 4, endStep: 100, prefetch: 64 })) n++;
      expect(n).toBe(100);
      await new Promise((r) => setTimeout(r, 50)); // warnings are emitted on a later tick
    } finally {
      process.off("warning", onWarning);
    }
    expect(warnings.filter((w) => /MaxListeners|listener/i.test(w))).toEqual([]);
  });

  it("sends a step's three timings in one report when its t_compute comes a step late, so every step is judged healthy or not", async () => {
    const c = new RackfeedClient({ url: rf.url, reportEvery: 4, reportIntervalMs: 0 });
    const judged = async () =>
      (await rf.metric("rackfeed_steps_total", { dataset: "d", healthy: "true" })) + (await rf.metric("rackfeed_steps_total", { dataset: "d", healthy: "false" }));
    const before = await judged();
    let previous: number | undefined;
    for await (const b of c.batches("d", { rank: 1, world: 2, microBatch: 4, startStep: 100, endStep: 140 })) {
      // An asynchronous GPU: the copy's time now, the previous step's compute at this synchronisation.
      c.reportStep(b.step, { t_h2d: 0.001 });
      if (previous !== undefined) c.reportStep(previous, { t_compute: 0.05 });
      previous = b.step;
    }
    c.reportStep(previous!, { t_compute: 0.05 });
    await c.close();
    expect(await judged()).toBe(before + 40);
  });

  it("reports t_wait, and t_h2d/t_compute given by the caller, as server histograms", async () => {
    const c = new RackfeedClient({ url: rf.url, reportEvery: 1000 });
    const before = await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" });
    for await (const b of c.batches("d", { rank: 0, world: 2, microBatch: 4, endStep: 6 })) {
      c.reportStep(b.step, { t_h2d: 0.001, t_compute: b.step < 3 ? 0.5 : 0 });
    }
    await c.close();
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" })).toBe(before + 6);
    expect(await rf.metric("rackfeed_t_h2d_seconds_count", { dataset: "d" })).toBeGreaterThanOrEqual(6);
    expect(await rf.metric("rackfeed_steps_total", { dataset: "d", healthy: "true" })).toBeGreaterThanOrEqual(3);
    expect(await rf.metric("rackfeed_steps_total", { dataset: "d", healthy: "false" })).toBeGreaterThanOrEqual(3);
  });

  it("queues at most MAX_QUEUED_STEPS steps, reporting them at once whatever reportEvery and reportIntervalMs say, and loses none of 25 000", async () => {
    const c = new RackfeedClient({ url: rf.url, reportEvery: 1_000_000, reportIntervalMs: 3_600_000 });
    const consumer = { dataset: "d", rank: 0, world: 1, microBatch: 3 };
    const before = await rf.metric("rackfeed_t_h2d_seconds_count", { dataset: "d" });
    let most = 0;
    for (let step = 0; step < 25_000; step++) {
      c.reportStep(step, { t_h2d: 0.002 }, consumer);
      most = Math.max(most, c.queuedSteps);
      // A trainer's loop lets I/O run now and then (its reports need it): here every 512 steps.
      if (step % 512 === 511) await new Promise((r) => setTimeout(r, 5));
    }
    expect(most).toBeLessThanOrEqual(MAX_QUEUED_STEPS);
    expect(most).toBeGreaterThan(MAX_QUEUED_STEPS / 2); // it filled, and went in reports of that size
    await c.close();
    expect(c.droppedSteps).toBe(0);
    expect(c.queuedSteps).toBe(0);
    expect(await rf.metric("rackfeed_t_h2d_seconds_count", { dataset: "d" })).toBe(before + 25_000);
  });

  it("does not retry a 4xx and raises the server's message", async () => {
    const c = new RackfeedClient({ url: rf.url });
    const err = await c.batch("nope", 0, { rank: 0, world: 1, microBatch: 1 }).catch((e) => e);
    expect(err).toBeInstanceOf(RackfeedError);
    expect(err.status).toBe(404);
    expect(err.message).toMatch(/Unknown dataset "nope"/);
    expect(c.retried).toBe(0);
  });

  it("survives a server restart mid-iteration: resumes at the next step with no duplicate and no gap", async () => {
    const port = await freePort();
    const listen = ["--listen", `127.0.0.1:${port}`, "--cache-dir", join(ws.dir, "restart-cache")];
    let server: RunningServer | undefined = await startServer(ws, [...args, ...listen]);
    const c = new RackfeedClient({ url: `http://127.0.0.1:${port}`, backoffMs: 20, maxBackoffMs: 200, retries: 50 });
    const got: { step: number; bytes: Uint8Array }[] = [];
    let restarted: Promise<void> | undefined;
    for await (const b of c.batches("d", { rank: 1, world: 2, microBatch: 4, endStep: 12, prefetch: 2 })) {
      got.push({ step: b.step, bytes: new Uint8Array(b.tokens.buffer.slice(0)) });
      if (b.step === 4) {
        const old = server!;
        server = undefined;
        await old.close();
        restarted = new Promise((r) => setTimeout(r, 300)).then(async () => {
          server = await startServer(ws, [...args, ...listen]);
        });
      }
    }
    await restarted;
    try {
      expect(got.map((g) => g.step)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
      expect(c.retried).toBeGreaterThan(0);
      for (const g of got) expectSameBytes(g.bytes, await direct(rf.url, g.step), `step ${g.step}`);
    } finally {
      await server?.close();
    }
  });
});

describe("createClient (rackfeed/client/node)", () => {
  it("close() closes the connections of its fetch (a client made per epoch left them open), and a later call opens new ones", async () => {
    const { key, cert } = selfSignedCert(ws.dir, "closing");
    const tls = await startServer(ws, [...args, "--tls-cert", cert, "--tls-key", key, "--shm-dir", "off", "--cache-dir", join(ws.dir, "c-closing")]);
    // Counted at a proxy in front: file descriptors of this process move with other tests' servers.
    const proxy = await startSilentProxy(Number(new URL(tls.url).port), Infinity);
    const url = `https://${proxy.hostPort}`;
    try {
      const clients = Array.from({ length: 5 }, () => createClient({ url, ca: readFileSync(cert, "utf8"), shm: false }));
      for (const c of clients) await c.batch("d", 0, { rank: 0, world: 1, microBatch: 4 });
      expect(proxy.open).toBe(5); // a connection each, kept alive
      for (const c of clients) await c.close();
      await waitFor(() => proxy.open === 0, "the clients' connections to close");
      const again = await clients[0].batch("d", 1, { rank: 0, world: 1, microBatch: 4 });
      expect(again.tokens.length).toBe(4 * 129);
      expect(proxy.open).toBe(1);
      await clients[0].close();
    } finally {
      await proxy.close();
      await tls.close();
    }
  });


  it("takes the shm path when co-located, else HTTP/2 over TLS (ALPN), with the same bytes", async () => {
    const { key, cert } = selfSignedCert(ws.dir, "auto");
    const ca = readFileSync(cert, "utf8");
    const tls = await startServer(ws, [...args, "--tls-cert", cert, "--tls-key", key, "--shm-dir", join(ws.dir, "shm-auto"), "--cache-dir", join(ws.dir, "c-auto")]);
    const metrics = http2Fetch({ ca });
    const served = async (transport: string) => readMetric(await (await metrics(`${tls.url}/metrics`)).text(), "rackfeed_served_bytes_total", { transport });
    const local = createClient({ url: tls.url, ca });
    const remote = createClient({ url: tls.url, ca, shm: false });
    try {
      expect(await local.transport()).toBe("shm");
      expect(await remote.transport()).toBe("http");
      const over: Record<string, Uint8Array[]> = { shm: [], http: [] };
      for (const c of [local, remote]) {
        for await (const b of c.batches("d", { rank: 1, world: 2, microBatch: 4, startStep: 3, endStep: 8 })) {
          over[b.transport].push(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength).slice());
        }
      }
      expect(over.shm.length).toBe(5);
      expect(over.http.length).toBe(5);
      over.shm.forEach((b, i) => expectSameBytes(b, over.http[i], `step ${i + 3}`));
      // The HTTP path negotiated HTTP/2: the server counts the batches' bytes as http2.
      expect(await served("http2")).toBeGreaterThanOrEqual(over.http.reduce((n, b) => n + b.length, 0));
      expect(await served("shm")).toBe(over.shm.reduce((n, b) => n + b.length, 0));
      expect(await served("http1")).toBe(0);
    } finally {
      await local.close();
      await remote.close();
      await tls.close();
    }
  });

  it("falls back to HTTP/1.1 for a cleartext URL whose server offers no shm path (fetch speaks no h2c)", async () => {
    const plain = await startServer(ws, [...args, "--shm-dir", "off", "--cache-dir", join(ws.dir, "c-plain")]);
    const served = async (transport: string) => readMetric(await (await fetch(`${plain.url}/metrics`)).text(), "rackfeed_served_bytes_total", { transport });
    const c = createClient({ url: plain.url });
    try {
      expect(await c.transport()).toBe("http");
      let bytes = 0;
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 4, endStep: 3 })) {
        expect(b.transport).toBe("http");
        bytes += b.tokens.byteLength;
      }
      expect(bytes).toBeGreaterThan(0);
      expect(await served("http1")).toBe(bytes);
      expect(await served("http2")).toBe(0);
      expect(await served("shm")).toBe(0);
    } finally {
      await c.close();
      await plain.close();
    }
  });
});
