import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient, RackfeedError } from "../../src/client/mod.ts";
import { MAX_QUEUED_STEPS, MAX_REPORTS_IN_FLIGHT } from "../../src/client/client.ts";
import type { LocalTransport } from "../../src/client/shm-consumer.ts";
import { setImmediate } from "node:timers";
import {
  encodeFrame,
  encodeRingHeader,
  FrameDecoder,
  ringLayout,
  SHM_PROTOCOL_VERSION,
  slotHeaderOffset,
  slotOfStep,
  writeSlotHeader,
} from "../../src/shm/protocol.ts";
import { type Fault, type FaultProxy, type FaultRule, startFaultProxy } from "../helpers/fault-proxy.ts";
import { freePort, makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 128, seed: 5, split: "100,0,0", split_index: 0, num_samples: 2000 };
/** One dataset name per test (the same data): the telemetry metrics are labelled by dataset, so no test sees another's. */
const NAMES = ["fails", "close", "every", "negative", "interval", "pair", "stalled", "fast", "lost", "again"];
let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 1500, 50, 600);
  const flags: string[] = [];
  for (const name of NAMES) flags.push(...(await datasetFlags(ws, name, REG)));
  rf = await startServer(ws, [...flags, "--block-bytes", "16KiB"]);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

const pass: Fault = { kind: "pass" };

/** A fault proxy in front of the server for `fn`, closed afterwards. */
async function withProxy<T>(rule: FaultRule, fn: (proxy: FaultProxy) => Promise<T>): Promise<T> {
  const proxy = await startFaultProxy(rf.url, rule);
  try {
    return await fn(proxy);
  } finally {
    await proxy.close();
  }
}

/** A proxy rule that counts `POST /v1/telemetry` requests (`sent()`) and holds each `delayMs` (0: passes it on at once). */
function countedReports(delayMs = 0): { rule: FaultRule; sent: () => number } {
  let sent = 0;
  return {
    rule: (_n, req) => {
      if (req.url !== "/v1/telemetry") return pass;
      sent++;
      return delayMs > 0 ? { kind: "delay", ms: delayMs } : pass;
    },
    sent: () => sent,
  };
}

describe("RackfeedClient telemetry", () => {
  it("neither fails nor holds the for-await loop when the report at the end of the range fails (503)", async () => {
    await withProxy((_n, req) => (req.url === "/v1/telemetry" ? { kind: "slowdown" } : pass), async (proxy) => {
      // Each retry of the report waits 500 ms: a loop that waited for it would end a second late.
      const c = new RackfeedClient({ url: proxy.url, retries: 2, sleep: (ms) => new Promise((r) => setTimeout(r, Math.max(ms, 500))) });
      const seen: number[] = [];
      let last = 0;
      for await (const b of c.batches("fails", { rank: 0, world: 1, microBatch: 4, endStep: 5 })) {
        seen.push(b.step);
        last = performance.now();
      }
      const endedAfter = performance.now() - last;
      expect(seen).toEqual([0, 1, 2, 3, 4]);
      expect(endedAfter).toBeLessThan(400);
      await c.close(); // the failed report is telemetry's loss, not the caller's error
      expect(proxy.counts.faults.slowdown).toBe(3); // the report was sent, refused, and retried twice
      expect(c.retried).toBe(2);
    });
  });

  it("close() waits for the reports sent in the background: every t_wait is on the server when it returns", async () => {
    // Each report takes 800 ms to reach the server.
    await withProxy((_n, req) => (req.url === "/v1/telemetry" ? { kind: "delay", ms: 800 } : pass), async (proxy) => {
      const c = new RackfeedClient({ url: proxy.url, reportEvery: 8 });
      const before = await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "close" });
      let steps = 0;
      for await (const _ of c.batches("close", { rank: 1, world: 2, microBatch: 4, endStep: 16 })) steps++;
      await c.close();
      expect(steps).toBe(16);
      expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "close" })).toBe(before + 16);
      expect(proxy.counts.faults.delay).toBeGreaterThanOrEqual(2); // sent in more than one report
    });
  });

  it("sends at most one report per reportIntervalMs while steps come faster, and every step's t_wait still arrives", async () => {
    for (const [name, reportIntervalMs, reports] of [["interval", 3_600_000, 2], ["every", 0, 10]] as const) {
      const counted = countedReports();
      await withProxy(counted.rule, async (proxy) => {
        const c = new RackfeedClient({ url: proxy.url, reportEvery: 4, reportIntervalMs });
        const waits = () => rf.metric("rackfeed_t_wait_seconds_count", { dataset: name });
        const before = await waits();
        for await (const _ of c.batches(name, { rank: 0, world: 1, microBatch: 4, endStep: 40 })) { /* as fast as it comes */ }
        await c.close();
        expect(await waits()).toBe(before + 40);
        // The first report goes out after 4 steps; then one per interval (none within the hour), and the rest at the end.
        if (reportIntervalMs > 0) expect(counted.sent()).toBe(reports);
        else expect(counted.sent()).toBeGreaterThanOrEqual(reports);
      });
    }
  });

  it("keeps one report in flight per consumer: two consumers behind a slow /v1/telemetry send a few full reports, not one per step", async () => {
    const reports = countedReports(150);
    await withProxy(reports.rule, async (proxy) => {
      const c = new RackfeedClient({ url: proxy.url, reportEvery: 4, reportIntervalMs: 0 });
      const waits = () => rf.metric("rackfeed_t_wait_seconds_count", { dataset: "pair" });
      const before = await waits();
      const run = async (rank: number) => {
        for await (const _ of c.batches("pair", { rank, world: 2, microBatch: 4, endStep: 120, prefetch: 4 })) { /* as fast as it comes */ }
      };
      await Promise.all([run(0), run(1)]);
      await c.close();
      expect(await waits()).toBe(before + 240);
      // 240 steps in reports of 4 would be 60; each consumer waits for its report (150 ms) and sends what queued meanwhile.
      expect(reports.sent()).toBeLessThanOrEqual(30);
    });
  });

  it("stays bounded when reports are not answered: at most MAX_REPORTS_IN_FLIGHT per consumer, the oldest steps dropped past a full queue", async () => {
    const reports = countedReports(1500);
    await withProxy(reports.rule, async (proxy) => {
      const c = new RackfeedClient({ url: proxy.url, reportEvery: 1_000_000, reportIntervalMs: 3_600_000 });
      const consumer = { dataset: "stalled", rank: 0, world: 1, microBatch: 4 };
      const h2d = () => rf.metric("rackfeed_t_h2d_seconds_count", { dataset: "stalled" });
      const before = await h2d();
      const total = MAX_QUEUED_STEPS * (MAX_REPORTS_IN_FLIGHT + 3);
      for (let step = 0; step < total; step++) c.reportStep(step, { t_h2d: 0.001 }, consumer);
      expect(c.queuedSteps).toBe(MAX_QUEUED_STEPS);
      expect(c.droppedSteps).toBe(2 * MAX_QUEUED_STEPS);
      await new Promise((r) => setTimeout(r, 300));
      expect(reports.sent()).toBe(MAX_REPORTS_IN_FLIGHT); // all stalled in the proxy
      await c.close();
      expect(await h2d()).toBe(before + total - c.droppedSteps);
    });
  });

  it("close() resolves when the server is gone (the last report's failure is telemetry's loss, counted in droppedSteps); flush() says it failed", async () => {
    const port = await freePort();
    const c = new RackfeedClient({ url: `http://127.0.0.1:${port}`, retryForMs: 300, backoffMs: 10, maxBackoffMs: 50 });
    const consumer = { dataset: "gone", rank: 0, world: 1, microBatch: 4 };
    c.reportStep(0, { t_h2d: 0.001 }, consumer);
    await expect(c.flush()).rejects.toBeInstanceOf(RackfeedError);
    expect(c.droppedSteps).toBe(1);
    c.reportStep(1, { t_h2d: 0.001 }, consumer);
    c.reportStep(2, { t_h2d: 0.001 }, consumer);
    await expect(c.close()).resolves.toBeUndefined();
    expect(c.droppedSteps).toBe(3);
  });

  it("loses no timings of a consumer whose batches are always in the ring (its loop never waits for I/O, so it lets reports through)", async () => {
    // A ring in memory that a stand-in server keeps full: each released slot is published again
    // at once, so the SDK's polling never waits on its socket.
    const rows = 4, cols = 8, slots = 8, total = 6 * MAX_QUEUED_STEPS * MAX_REPORTS_IN_FLIGHT / 4;
    const layout = ringLayout(slots, rows * cols * 2);
    const ring = new Uint8Array(layout.fileBytes);
    ring.set(encodeRingHeader(layout), 0);
    const view = new DataView(ring.buffer);
    const publish = (step: number) => {
      const { slot, generation } = slotOfStep(step, 0, slots);
      writeSlotHeader(view, slotHeaderOffset(slot), { generation, length: rows * cols * 2, step, firstSample: step * rows, cache: "hit" });
    };
    let waits = 0;
    const local: LocalTransport = {
      pollSlots: true,
      nextTurn: () => new Promise((r) => setImmediate(r)),
      openRing: () => ({ mapped: ring, read: (o, into) => into.set(ring.subarray(o, o + into.length)), close: () => {} }),
      connect: () => {
        const decoder = new FrameDecoder();
        const out: Uint8Array[] = [];
        let wake: (() => void) | undefined;
        const reply = (m: Parameters<typeof encodeFrame>[0]) => {
          out.push(encodeFrame(m));
          wake?.();
        };
        return Promise.resolve({
          write(bytes: Uint8Array) {
            for (const m of decoder.push(bytes)) {
              if (m.t === "hello") reply({ t: "welcome", version: SHM_PROTOCOL_VERSION, instance: "stand-in" });
              else if (m.t === "open") {
                for (let st = 0; st < slots; st++) publish(st);
                reply({ t: "ring", path: "/stand-in", slots, slotBytes: layout.slotBytes, dataOffset: layout.dataOffset, fileBytes: layout.fileBytes, dtype: "uint16", rows, cols, endStep: total });
                reply({ t: "end", step: total });
              } else if (m.t === "release" && Number(m.generation) - 1 + slots < total) publish(Number(m.generation) - 1 + slots);
              else if (m.t === "wait") waits++;
            }
          },
          async read() {
            while (out.length === 0) await new Promise<void>((r) => (wake = r));
            return out.shift()!;
          },
          close() {},
        });
      },
    };
    // Reports go to the real server (through fetch: I/O), /v1/shm to the stand-in.
    const fetchVia = (async (input: RequestInfo | URL, init?: RequestInit) =>
      new URL(String(input)).pathname === "/v1/shm" ? Response.json({ socket: "/stand-in", instance: "stand-in" }) : await fetch(input, init)) as typeof fetch;
    const c = new RackfeedClient({ url: rf.url, fetch: fetchVia, local });
    const waitsOnServer = () => rf.metric("rackfeed_t_wait_seconds_count", { dataset: "fast" });
    const before = await waitsOnServer();
    let n = 0;
    for await (const b of c.batches("fast", { rank: 0, world: 1, microBatch: rows, endStep: total })) {
      expect(b.transport).toBe("shm");
      n++;
    }
    await c.close();
    expect(n).toBe(total);
    expect(waits).toBe(0); // never waited: the case where nothing else lets the reports' I/O run
    expect(c.droppedSteps).toBe(0);
    expect(await waitsOnServer()).toBe(before + total);
  }, 60_000);

  it("refuses a negative reportEvery or reportIntervalMs, an infinite timeout, or a NaN retry option in the constructor", () => {
    for (const k of ["retries", "retryForMs", "backoffMs", "maxBackoffMs", "timeoutMs"]) {
      expect(() => new RackfeedClient({ url: rf.url, [k]: Number.NaN }), k).toThrow(new RegExp(`Invalid ${k}: NaN`));
    }
    expect(() => new RackfeedClient({ url: rf.url, reportEvery: -1 })).toThrow(/Invalid reportEvery: -1; expected an integer from 0/);
    expect(() => new RackfeedClient({ url: rf.url, reportIntervalMs: -5 })).toThrow(/Invalid reportIntervalMs: -5/);
    expect(() => new RackfeedClient({ url: rf.url, timeoutMs: Infinity })).toThrow(/Invalid timeoutMs: Infinity; expected milliseconds from 0, finite/);
    // What worked before the checks still does: retrying for ever, fractional backoffs, reportEvery 0.
    expect(() => new RackfeedClient({ url: rf.url, retries: Infinity, retryForMs: Infinity, backoffMs: 2.5, reportEvery: 0, reportIntervalMs: 0.5 })).not.toThrow();
  });

  it("with reportEvery 1, counts every step in rackfeed_steps_total (a step travels in one report)", async () => {
    const c = new RackfeedClient({ url: rf.url, reportEvery: 1 });
    const healthy = () => rf.metric("rackfeed_steps_total", { dataset: "every", healthy: "true" });
    const waits = () => rf.metric("rackfeed_t_wait_seconds_count", { dataset: "every" });
    const before = { healthy: await healthy(), waits: await waits() };
    for await (const b of c.batches("every", { rank: 0, world: 2, microBatch: 4, endStep: 24 })) {
      c.reportStep(b.step, { t_h2d: 0, t_compute: 10 }); // every step is healthy
    }
    await c.close();
    expect(await healthy()).toBe(before.healthy + 24);
    expect(await waits()).toBe(before.waits + 24);
    expect(await rf.metric("rackfeed_steps_total", { dataset: "every", healthy: "false" })).toBe(0);
  });

  it("counts a report once when its answer was lost and the SDK sent it again (the server had recorded it)", async () => {
    // Every report's first try reaches the server, which records it; its answer never comes back
    // (the 1st, 3rd, 5th... report request: each retry passes).
    let reports = 0;
    const rule: FaultRule = (_n, req) => (req.url === "/v1/telemetry" && ++reports % 2 === 1 ? { kind: "lose-answer" } : pass);
    await withProxy(rule, async (proxy) => {
      const c = new RackfeedClient({ url: proxy.url, reportEvery: 8, reportIntervalMs: 0, backoffMs: 5 });
      const waits = () => rf.metric("rackfeed_t_wait_seconds_count", { dataset: "lost" });
      const steps = () => rf.metric("rackfeed_steps_total", { dataset: "lost", healthy: "true" });
      const before = { waits: await waits(), steps: await steps() };
      for await (const b of c.batches("lost", { rank: 0, world: 1, microBatch: 4, endStep: 32 })) c.reportStep(b.step, { t_h2d: 0, t_compute: 10 });
      await c.close();
      expect(proxy.counts.faults["lose-answer"]).toBeGreaterThan(0);
      expect(c.retried).toBeGreaterThan(0);
      expect(await waits()).toBe(before.waits + 32);
      expect(await steps()).toBe(before.steps + 32);
    });
  });

  it("counts a step read twice by the same consumer twice: a resume from an earlier step while the first readings are still queued", async () => {
    const c = new RackfeedClient({ url: rf.url, reportEvery: 1000, reportIntervalMs: 60_000 });
    const waits = () => rf.metric("rackfeed_t_wait_seconds_count", { dataset: "again" });
    const before = await waits();
    let read = 0;
    for await (const b of c.batches("again", { rank: 0, world: 1, microBatch: 1, endStep: 20 })) {
      // Its last two steps' timings never come (the trainer stopped mid-step): they stay queued,
      // waiting for them, when the same consumer reads them again below.
      if (b.step < 8) c.reportStep(b.step, { t_h2d: 0, t_compute: 1 });
      if (++read === 10) break; // steps 0-9
    }
    expect(c.queuedSteps).toBe(2);
    for await (const b of c.batches("again", { rank: 0, world: 1, microBatch: 1, startStep: 5, endStep: 20 })) {
      c.reportStep(b.step, { t_h2d: 0, t_compute: 1 });
      read++; // steps 5-19: 5-9 again
    }
    await c.close();
    expect(read).toBe(25);
    expect(c.droppedSteps).toBe(0);
    expect(await waits()).toBe(before + 25);
  });

  it("refuses a negative t_h2d at reportStep() with a RangeError, and the other steps' timings still arrive", async () => {
    const c = new RackfeedClient({ url: rf.url, reportEvery: 32 });
    const h2d = () => rf.metric("rackfeed_t_h2d_seconds_count", { dataset: "negative" });
    const waits = () => rf.metric("rackfeed_t_wait_seconds_count", { dataset: "negative" });
    const before = { h2d: await h2d(), waits: await waits() };
    for await (const b of c.batches("negative", { rank: 0, world: 1, microBatch: 4, endStep: 32 })) {
      if (b.step === 5) expect(() => c.reportStep(b.step, { t_h2d: -1e-6, t_compute: 0.1 })).toThrow(RangeError);
      else c.reportStep(b.step, { t_h2d: 0.001, t_compute: 0.1 });
    }
    await c.close();
    expect(await waits()).toBe(before.waits + 32);
    expect(await h2d()).toBe(before.h2d + 31);
  });
});
