import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient } from "../../src/client/mod.ts";
import { localTransport } from "../../src/client/node.ts";
import { decodeTimings, encodeFrame, encodeTimings, FrameDecoder, MAX_TIMINGS_STEPS } from "../../src/shm/protocol.ts";
import { type FaultProxy, startFaultProxy } from "../helpers/fault-proxy.ts";
import { makeWorkspace, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { type GreetedControl, greetedControl } from "../helpers/shm-control.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 64, seed: 3, split: "100,0,0", split_index: 0, num_samples: 4000 };
/** One dataset per test: the telemetry metrics are labelled by dataset, so no test sees another's. */
const NAMES = ["sdk", "late", "raw", "bad", "odd", "abort", "clock", "twoA", "twoB", "burst", "remnant"];
let ws: Workspace;
let rf: RunningServer;
let shmDir: string;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 2000, 20, 300);
  const flags: string[] = [];
  for (const name of NAMES) flags.push(...(await datasetFlags(ws, name, REG)));
  shmDir = join(ws.dir, "shm");
  rf = await startServer(ws, [...flags, "--shm-dir", shmDir]);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

/** A proxy in front of the server that counts `POST /v1/telemetry` requests. */
async function countingProxy(): Promise<{ proxy: FaultProxy; reports: () => number }> {
  let reports = 0;
  const proxy = await startFaultProxy(rf.url, (_n, req) => {
    if (req.url === "/v1/telemetry") reports++;
    return { kind: "pass" };
  });
  return { proxy, reports: () => reports };
}

/** A raw control connection to the test server that has said hello. */
async function greeted(): Promise<GreetedControl> {
  return await greetedControl(join(shmDir, `rackfeed-${new URL(rf.url).port}.sock`));
}

const f64 = (...v: number[]) => new Uint8Array(new Float64Array(v).buffer);

describe("step timings over the shm socket", () => {
  it("an SDK consumer over shm reports its timings on its socket, not over HTTP: every step counted and judged", async () => {
    const { proxy, reports } = await countingProxy();
    try {
      const c = new RackfeedClient({ url: proxy.url, local: localTransport(), reportEvery: 16, reportIntervalMs: 0 });
      const steps = 400;
      let seen = 0;
      for await (const b of c.batches("sdk", { rank: 0, world: 1, microBatch: 2, endStep: steps })) {
        expect(b.transport).toBe("shm");
        c.reportStep(b.step, { t_h2d: 0.0001, t_compute: 1 });
        if (++seen === steps - 50) {
          // Well before the end, most steps' timings are on the server, and none came over HTTP.
          await waitFor(async () => (await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "sdk" })) >= steps - 100, "timings over the socket");
          expect(reports()).toBe(0);
        }
      }
      await c.close();
      expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "sdk" })).toBe(steps);
      expect(await rf.metric("rackfeed_t_h2d_seconds_count", { dataset: "sdk" })).toBe(steps);
      expect(await rf.metric("rackfeed_t_compute_seconds_count", { dataset: "sdk" })).toBe(steps);
      expect(await rf.metric("rackfeed_steps_total", { dataset: "sdk", healthy: "true" })).toBe(steps);
      // At most the steps left when the ring closed went over HTTP, in one report.
      expect(reports()).toBeLessThanOrEqual(1);
    } finally {
      await proxy.close();
    }
  });

  it("timings that come after the iteration ended (t_compute a step late) go over HTTP, and every step is still judged once", async () => {
    const { proxy, reports } = await countingProxy();
    try {
      const c = new RackfeedClient({ url: proxy.url, local: localTransport(), reportEvery: 8, reportIntervalMs: 0 });
      const steps = 120;
      let last = -1;
      for await (const b of c.batches("late", { rank: 0, world: 1, microBatch: 2, endStep: steps })) {
        c.reportStep(b.step, { t_h2d: 0.0001 });
        if (last >= 0) c.reportStep(last, { t_compute: 1 }); // an asynchronous GPU: known at the next step
        last = b.step;
      }
      const overShm = await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "late" });
      expect(overShm).toBeGreaterThan(0);
      c.reportStep(last, { t_compute: 1 });
      await c.close();
      expect(reports()).toBeGreaterThanOrEqual(1);
      expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "late" })).toBe(steps);
      expect(await rf.metric("rackfeed_steps_total", { dataset: "late", healthy: "true" })).toBe(steps);
    } finally {
      await proxy.close();
    }
  });

  it("after an abort, the consumer's queued timings still reach the server (on its socket before it closes), none into a closed socket", async () => {
    const c = new RackfeedClient({ url: rf.url, local: localTransport(), reportEvery: 1000, reportIntervalMs: 60_000 });
    const ac = new AbortController();
    const iterator = c.batches("abort", { rank: 0, world: 1, microBatch: 2, endStep: 100, signal: ac.signal });
    for (let i = 0; i < 10; i++) {
      const r = await iterator.next();
      expect(r.value!.transport).toBe("shm");
      c.reportStep(r.value!.step, { t_h2d: 0.001, t_compute: 0.5 });
    }
    ac.abort(new Error("stop"));
    await c.flush(); // the iterator has not run its end yet: the abort alone must take the socket out of use
    expect(c.queuedSteps).toBe(0);
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "abort" })).toBe(10);
    await iterator.next().catch(() => {});
    await c.close();
  });

  it("a measured wait the server would refuse (an injected clock that stepped back) goes as not measured: the batches go on", async () => {
    let skew = 0;
    let armed = -1;
    // A clock that is set back 5 s while the SDK waits for a batch (a wall clock after an NTP step).
    const now = () => {
      if (armed >= 0 && armed++ === 1) skew -= 5000;
      return performance.now() + skew;
    };
    const c = new RackfeedClient({ url: rf.url, local: localTransport(), reportEvery: 1, reportIntervalMs: 0, now });
    let n = 0;
    for await (const b of c.batches("clock", { rank: 0, world: 1, microBatch: 2, endStep: 200 })) {
      expect(b.transport).toBe("shm");
      n++;
      if (b.step === 20) armed = 0;
    }
    await c.close();
    expect(n).toBe(200);
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "clock" })).toBe(199);
  });

  it("flush() with several consumers keeps each one's steps still waiting for a timing: every step is judged once", async () => {
    const c = new RackfeedClient({ url: rf.url, local: localTransport(), reportEvery: 1000, reportIntervalMs: 60_000 });
    const names = ["twoA", "twoB"];
    const iterators = names.map((dataset) => c.batches(dataset, { rank: 0, world: 1, microBatch: 2, endStep: 40 }));
    const consumer = (dataset: string) => ({ dataset, rank: 0, world: 1, microBatch: 2 });
    const last: number[] = [-1, -1];
    for (let i = 0; i < 40; i++) {
      for (const [k, it] of iterators.entries()) {
        const step = (await it.next()).value!.step;
        c.reportStep(step, { t_h2d: 0.0001 }, consumer(names[k]));
        if (last[k] >= 0) c.reportStep(last[k], { t_compute: 1 }, consumer(names[k])); // an asynchronous GPU: a step late
        last[k] = step;
      }
      if (i % 5 === 4) await c.flush();
    }
    for (const [k, it] of iterators.entries()) {
      expect((await it.next()).done).toBe(true);
      c.reportStep(last[k], { t_compute: 1 }, consumer(names[k]));
    }
    await c.close();
    for (const name of names) {
      expect(await rf.metric("rackfeed_t_compute_seconds_count", { dataset: name }), name).toBe(40);
      expect(await rf.metric("rackfeed_steps_total", { dataset: name, healthy: "true" }), name).toBe(40);
    }
  });

  it("a timing that comes for a step already sent holds back no later step (it can never be completed)", async () => {
    const c = new RackfeedClient({ url: rf.url, local: localTransport() });
    const consumer = { dataset: "remnant", rank: 0, world: 1, microBatch: 2 };
    // A consumer reporting t_h2d with each step and t_compute a step late; the last after its loop.
    const loop = async (startStep: number, steps: number) => {
      let prev: number | undefined;
      for await (const b of c.batches("remnant", { rank: 0, world: 1, microBatch: 2, startStep, endStep: startStep + steps })) {
        c.reportStep(b.step, { t_h2d: 0.001 }, consumer);
        if (prev !== undefined) c.reportStep(prev, { t_compute: 0.5 }, consumer);
        prev = b.step;
      }
      c.reportStep(prev!, { t_compute: 0.5 }, consumer);
      await c.flush();
    };
    // A fresh client's first step goes before it knows the caller reports t_compute (so that step
    // is judged by no one: by design); its t_compute then comes alone, for step 50.
    await loop(50, 1);
    await loop(10, 3); // steps below 50: the last one's late t_compute must still travel with it
    await c.close();
    expect(await rf.metric("rackfeed_t_compute_seconds_count", { dataset: "remnant" })).toBe(4);
    const judged = (await rf.metric("rackfeed_steps_total", { dataset: "remnant", healthy: "true" })) + (await rf.metric("rackfeed_steps_total", { dataset: "remnant", healthy: "false" }));
    expect(judged).toBe(3);
  });

  it("delivers timings written just before the client closes its socket (more than the socket buffers hold)", async () => {
    const { s, next } = await greeted();
    s.write(encodeFrame({ t: "open", dataset: "burst", rank: 0, world: 1, microBatch: 1, startStep: 0, endStep: 2 }));
    expect((await next()).t).toBe("ring");
    const steps = Array.from({ length: 40 * MAX_TIMINGS_STEPS }, (_, i) => ({ step: i, t_wait: 0.001 }));
    s.write(encodeTimings(steps)); // ~1.3 MB, most of it still in the client's buffers when it closes
    s.close();
    await waitFor(async () => (await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "burst" })) === steps.length, "every step written before the close", 5_000);
  });

  it("takes a timings message of any client on an open consumer: NaN is a timing not measured", async () => {
    const { s, next, welcome } = await greeted();
    try {
      expect(welcome.timings).toBe(true);
      s.write(encodeFrame({ t: "open", dataset: "raw", rank: 0, world: 1, microBatch: 1, startStep: 0, endStep: 4 }));
      expect((await next()).t).toBe("ring");
      const frame = encodeFrame({ t: "timings", steps: f64(0, 1, 2), t_wait: f64(0.001, NaN, 0.002), t_h2d: f64(NaN, NaN, NaN), t_compute: f64(0.5, 0.5, 0.5) });
      s.write(frame);
      await waitFor(async () => (await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "raw" })) === 2, "two t_wait");
      expect(await rf.metric("rackfeed_t_compute_seconds_count", { dataset: "raw" })).toBe(3);
      expect(await rf.metric("rackfeed_t_h2d_seconds_count", { dataset: "raw" })).toBe(0);
      expect(await rf.metric("rackfeed_t_wait_seconds_sum", { dataset: "raw" })).toBeCloseTo(0.003, 9);
    } finally {
      s.close();
    }
  });

  it("takes timings outside 0–86 400 s as not measured, and keeps serving the consumer's batches", async () => {
    const { s, next } = await greeted();
    try {
      s.write(encodeFrame({ t: "open", dataset: "odd", rank: 0, world: 1, microBatch: 1, startStep: 0, endStep: 3 }));
      expect((await next()).t).toBe("ring");
      s.write(encodeFrame({ t: "timings", steps: f64(0, 1.5, -3), t_wait: f64(-1, 0.25, Infinity), t_h2d: f64(1e6, NaN, 0.1), t_compute: f64(NaN, NaN, NaN) }));
      await waitFor(async () => (await rf.metric("rackfeed_t_h2d_seconds_count", { dataset: "odd" })) === 1, "the one t_h2d in range");
      expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "odd" })).toBe(1);
      expect(await rf.metric("rackfeed_t_wait_seconds_sum", { dataset: "odd" })).toBe(0.25);
      // The connection serves on: its batches still come.
      const got: string[] = [];
      for (let m = await next(); got.push(String(m.t)), m.t !== "end"; m = await next());
      expect(got).toEqual(["batch", "batch", "batch", "end"]);
    } finally {
      s.close();
    }
  });

  it("answers a malformed timings message with an error frame naming the field", async () => {
    const good = { steps: f64(0, 1), t_wait: f64(0.1, 0.2), t_h2d: f64(NaN, NaN), t_compute: f64(NaN, NaN) };
    const many = f64(...Array.from({ length: MAX_TIMINGS_STEPS + 1 }, (_, i) => i));
    const cases: [Record<string, unknown>, boolean, RegExp][] = [
      [good, false, /"timings" needs an open consumer/],
      [{ ...good, t_wait: 0.1 }, true, /"timings" field "t_wait" must be bin \(float64 little-endian values\), got number/],
      [{ ...good, t_wait: [0.1, 0.2] }, true, /field "t_wait" must be bin .*got Array \(pack the values' bytes as bin, not as an array or an ext\)/],
      [{ ...good, t_h2d: f64(NaN) }, true, /same number of float64 values, got 16, 16, 8, 16 bytes/],
      [{ steps: many, t_wait: many, t_h2d: many, t_compute: many }, true, new RegExp(`holds ${MAX_TIMINGS_STEPS + 1} steps, at most ${MAX_TIMINGS_STEPS}`)],
    ];
    for (const [fields, open, message] of cases) {
      const { s, next } = await greeted();
      try {
        if (open) {
          s.write(encodeFrame({ t: "open", dataset: "bad", rank: 0, world: 1, microBatch: 1, startStep: 0, endStep: 2 }));
          expect((await next()).t).toBe("ring");
        }
        s.write(encodeFrame({ t: "timings", ...fields } as never));
        let reply = await next();
        while (reply.t === "batch" || reply.t === "end") reply = await next();
        expect(reply).toMatchObject({ t: "error", status: 400 });
        expect(String(reply.message)).toMatch(message);
      } finally {
        s.close();
      }
    }
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "bad" })).toBe(0);
  });
});

describe("encodeTimings", () => {
  it("cuts steps into frames of at most MAX_TIMINGS_STEPS that decode to the same timings, absent ones as NaN", () => {
    const steps = Array.from({ length: MAX_TIMINGS_STEPS * 2 + 5 }, (_, i) => ({ step: i, t_wait: i / 1e6, ...(i % 3 === 0 ? { t_h2d: i / 1e5 } : {}), ...(i % 2 === 0 ? { t_compute: i / 1e3 } : {}) }));
    const messages = new FrameDecoder().push(encodeTimings(steps));
    expect(messages.map((m) => m.t)).toEqual(["timings", "timings", "timings"]);
    const decoded = messages.map(decodeTimings);
    expect(decoded.map((d) => d.count)).toEqual([MAX_TIMINGS_STEPS, MAX_TIMINGS_STEPS, 5]);
    let i = 0;
    for (const d of decoded) {
      for (let k = 0; k < d.count; k++, i++) {
        expect(d.tWait[k]).toBe(i / 1e6);
        if (i % 3 === 0) expect(d.tH2d[k]).toBe(i / 1e5);
        else expect(d.tH2d[k]).toBeNaN();
        if (i % 2 === 0) expect(d.tCompute[k]).toBe(i / 1e3);
        else expect(d.tCompute[k]).toBeNaN();
      }
    }
    expect(i).toBe(steps.length);
  });
});
