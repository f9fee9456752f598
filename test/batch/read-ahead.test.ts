import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { blockKeys, planSamples } from "../../src/batch/block-plans.ts";
import { type ConsumerKey, IDLE_CONSUMER_MS, ReadAhead } from "../../src/batch/read-ahead.ts";
import { stepSamples } from "../../src/batch/steps.ts";
import { makeWorkspace, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { syntheticDataset } from "../helpers/token-data.ts";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

// A full collection on demand, for the test that a replaced dataset version is let go of.
setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

const ADMIN = "admin-token-for-tests";
let ws: Workspace;

beforeAll(async () => {
  ws = await makeWorkspace();
  const { idx, bin } = syntheticDataset(3000, 100, 1500); // ~2.4 M tokens, ~4.7 MB
  await ws.put("tok/big.idx", idx);
  await ws.put("tok/big.bin", bin);
  await ws.put("noise.bin", new Uint8Array(8 * 2 ** 20).fill(7));
});
afterAll(async () => {
  await ws.remove();
});

async function withServer(args: string[], fn: (rf: RunningServer) => Promise<void>, now?: () => number): Promise<void> {
  const rf = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "4KiB", "--memory-bytes", "16MiB", "--disk-bytes", "1MiB", ...args], now ? { now } : {});
  try {
    const res = await fetch(`${rf.url}/v1/datasets/big`, {
      method: "PUT",
      headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
      body: JSON.stringify({ sources: [{ prefix: "data/tok/big" }], seq_length: 512, seed: 9, split: "100,0,0", split_index: 0, num_samples: 4000 }),
    });
    expect(res.status).toBe(201);
    await fn(rf);
  } finally {
    await rf.close();
  }
}

/**
 * A trainer that takes `steps` steps of `stepMs` compute each (at least until the fills in flight
 * have landed); returns the x-rackfeed-cache of
 * each batch. With `noiseBytes`, another client streams that much of an unrelated object through
 * the memory tier during each step.
 */
async function trainer(rf: RunningServer, steps: number, stepMs: number, noiseBytes = 0): Promise<string[]> {
  const seen: string[] = [];
  let noiseAt = 0;
  for (let step = 0; step < steps; step++) {
    const res = await fetch(`${rf.url}/v1/datasets/big/batches/${step}?rank=1&world=2&micro_batch=8`);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    seen.push(res.headers.get("x-rackfeed-cache")!);
    if (noiseBytes > 0) {
      const end = noiseAt + noiseBytes - 1;
      await (await fetch(`${rf.url}/v1/objects/data/noise.bin`, { headers: { range: `bytes=${noiseAt}-${end}` } })).arrayBuffer();
      noiseAt = (noiseAt + noiseBytes) % (8 * 2 ** 20);
    }
    // The step's compute outlasts the fills read-ahead started: it ends only once they have
    // landed (on a loaded machine a fixed pause alone could end first, and a batch that read-ahead
    // did warm would be counted as "filling").
    await waitFor(() => rf.server.cache.stats().inFlight === 0, "read-ahead's fills to land");
    await new Promise((r) => setTimeout(r, stepMs));
  }
  return seen;
}

/** Step `step` of the consumer rank 1/2 × 8 over HTTP, read to its end. */
async function batchOf(rf: RunningServer, step: number): Promise<void> {
  const res = await fetch(`${rf.url}/v1/datasets/big/batches/${step}?rank=1&world=2&micro_batch=8`);
  expect(res.status).toBe(200);
  await res.arrayBuffer();
}

/** The read-ahead's view of the consumer rank 0/1 × 2 now. */
function consumerOf2(rf: RunningServer) {
  return rf.server.readAhead.lookahead().find((c) => c.rank === 0 && c.world === 1 && c.microBatch === 2)!;
}

/** The read-ahead's view of that consumer now. */
function consumerOf(rf: RunningServer) {
  return rf.server.readAhead.lookahead().find((c) => c.rank === 1 && c.world === 2)!;
}

describe("schedule-aware read-ahead", () => {
  it("lets go of a replaced dataset version: consumers not seen since are forgotten, and the old version can be collected", async () => {
    await withServer([], async (rf) => {
      const register = async (seed: number) => {
        const res = await fetch(`${rf.url}/v1/datasets/big`, {
          method: "PUT",
          headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
          body: JSON.stringify({ sources: [{ prefix: "data/tok/big" }], seq_length: 512, seed, split: "100,0,0", split_index: 0, num_samples: 4000 }),
        });
        expect(res.status).toBe(200); // replaced
        await res.arrayBuffer();
      };
      const old = new WeakRef(await rf.server.datasets.get("big"));
      // Consumers that read a step or two and are gone (a job that ended, an evaluation pass).
      for (const microBatch of [2, 3, 5]) {
        const res = await fetch(`${rf.url}/v1/datasets/big/batches/1?rank=0&world=1&micro_batch=${microBatch}`);
        expect(res.status).toBe(200);
        await res.arrayBuffer();
      }
      expect(rf.server.readAhead.lookahead().filter((c) => c.dataset === "big")).toHaveLength(3);
      await register(10);
      expect(rf.server.readAhead.lookahead().filter((c) => c.dataset === "big")).toHaveLength(0);
      for (let i = 0; i < 5 && old.deref() !== undefined; i++) {
        await new Promise((r) => setTimeout(r, 20));
        gc();
      }
      expect(old.deref(), "the old version is still reachable").toBeUndefined();
      // A consumer that goes on is tracked again, on the version it reads.
      const again = await fetch(`${rf.url}/v1/datasets/big/batches/2?rank=0&world=1&micro_batch=2`);
      expect(again.status).toBe(200);
      await again.arrayBuffer();
      expect(consumerOf2(rf).step).toBe(2);

      // An open shm consumer reads the version it opened until it reconnects: its steps, observed
      // on that version after a replacement, are still warmed ahead.
      const opened = await rf.server.datasets.get("big");
      const key: ConsumerKey = { dataset: "big", rank: 0, world: 1, microBatch: 7 };
      for (let s = 0; s < 5; s++) rf.server.readAhead.observe(opened, key, s);
      await register(11);
      for (let s = 5; s < 20; s++) rf.server.readAhead.observe(opened, key, s);
      const shm = rf.server.readAhead.lookahead().find((c) => c.microBatch === 7)!;
      expect(shm.step).toBe(19);
      expect(shm.stepsScheduled).toBeGreaterThan(0);
    });
  });

  it("makes a steady consumer see only memory hits after warm-up", async () => {
    await withServer([], async (rf) => {
      const seen = await trainer(rf, 30, 15);
      // Never a miss after warm-up; on a loaded machine a block may still be arriving ("filling").
      expect(seen.slice(3).filter((x) => x === "miss")).toEqual([]);
      expect(seen.slice(3).filter((x) => x === "hit").length).toBeGreaterThan(20);
      expect(await rf.metric("rackfeed_readahead_blocks_total")).toBeGreaterThan(0);
      const labels = { dataset: "big", rank: "1", world: "2", micro_batch: "8" };
      expect(await rf.metric("rackfeed_readahead_steps", labels)).toBeGreaterThan(5);
      expect(await rf.metric("rackfeed_readahead_seconds", labels)).toBeGreaterThan(0);
      expect(await rf.metric("rackfeed_consumer_step_seconds", labels)).toBeGreaterThan(0.01);
      expect(await rf.metric("rackfeed_batch_seconds_count", { cache: "hit" })).toBeGreaterThan(20);
    });
  });

  it("without read-ahead the same consumer misses on most steps (the contrast)", async () => {
    await withServer(["--read-ahead-seconds", "0"], async (rf) => {
      const seen = await trainer(rf, 30, 15);
      expect(seen.filter((s) => s === "miss").length).toBeGreaterThan(20);
      expect(await rf.metric("rackfeed_readahead_blocks_total")).toBe(0);
    });
  });

  it("under a tight memory budget and a competing reader, Belady eviction keeps the blocks the schedule needs next; LRU does not", async () => {
    const run = async (eviction: string) => {
      let misses = 0;
      await withServer(["--memory-bytes", "1MiB", "--memory-eviction", eviction, "--read-ahead-max-steps", "4"], async (rf) => {
        const seen = await trainer(rf, 25, 15, 1024 * 1024);
        misses = seen.slice(3).filter((x) => x === "miss").length;
      });
      return misses;
    };
    const belady = await run("belady");
    const lru = await run("lru");
    expect(belady).toBe(0);
    expect(lru).toBeGreaterThan(15);
  }, 120_000); // two servers, 25 paced steps each with 1 MiB of competing reads: ~25 s here, more under load

  it("forgets a consumer idle for IDLE_CONSUMER_MS, on the next batch or the next scrape (it would keep its dataset version alive and cost every scrape)", async () => {
    let skew = 0;
    await withServer([], async (rf) => {
      const consumers = async () => ((await (await fetch(`${rf.url}/v1/status`)).json()).consumers as { rank: number; world: number }[]).map((c) => `${c.rank}/${c.world}`).sort();
      const batch = async (rank: number, world: number) => {
        const res = await fetch(`${rf.url}/v1/datasets/big/batches/0?rank=${rank}&world=${world}&micro_batch=8`);
        expect(res.status).toBe(200);
        await res.arrayBuffer();
      };
      await batch(0, 1);
      await batch(1, 2);
      expect(await consumers()).toEqual(["0/1", "1/2"]);
      skew += IDLE_CONSUMER_MS / 2;
      await batch(1, 2); // seen again: not idle
      skew += IDLE_CONSUMER_MS / 2;
      await batch(0, 3); // the next consumer seen sweeps the idle ones
      expect(await consumers()).toEqual(["0/3", "1/2"]);
      // A server nobody reads from any more forgets them too, when asked who its consumers are.
      skew += IDLE_CONSUMER_MS;
      expect(await rf.metric("rackfeed_dataset_consumers", { dataset: "big" })).toBe(0);
      expect(await consumers()).toEqual([]);
    }, () => performance.now() + skew);
  });

  it("keeps the look-ahead window when a step arrives after a later one (requests in flight), and starts over after a real jump back", async () => {
    await withServer([], async (rf) => {
      const get = (step: number) => batchOf(rf, step);
      const consumer = () => consumerOf(rf);
      for (let s = 0; s < 10; s++) await get(s);
      await get(11);
      const before = consumer();
      expect(before.step).toBe(11);
      expect(before.stepsScheduled).toBeGreaterThan(0);
      const warm = vi.spyOn(rf.server.cache, "warm");
      try {
        await get(10); // the straggler of a client with two requests in flight
        expect(warm).not.toHaveBeenCalled(); // the window was not dropped and scheduled again
        expect(consumer().step).toBe(11);
        expect(consumer().stepsScheduled).toBe(before.stepsScheduled);
        await get(12); // in order again: the window moves on by one step
        expect(consumer().step).toBe(12);
        warm.mockClear();
        await get(5); // served before: a resume from an earlier checkpoint, scheduled afresh
        expect(consumer().step).toBe(5);
        expect(warm).toHaveBeenCalled();
      } finally {
        warm.mockRestore();
      }
    });
  });

  it("takes a skipped step that comes long after it (its request died with a client) as a resume, not a straggler", async () => {
    await withServer([], async (rf) => {
      const get = (step: number) => batchOf(rf, step);
      const consumer = () => consumerOf(rf);
      for (let s = 0; s < 10; s++) await get(s);
      for (let s = 11; s < 40; s++) await get(s); // step 10 never came
      const warm = vi.spyOn(rf.server.cache, "warm");
      try {
        await get(10); // the trainer resumes from its checkpoint at step 10
        expect(consumer().step).toBe(10);
        expect(warm).toHaveBeenCalled();
      } finally {
        warm.mockRestore();
      }
    });
  });

  it("learns the step time of a client whose steps always arrive out of order", async () => {
    let skew = 0;
    await withServer([], async (rf) => {
      const get = (step: number) => batchOf(rf, step);
      await get(0);
      // Two requests in flight, answered in the order 2, 1, 4, 3, …: one step every 500 ms.
      for (let s = 1; s < 30; s += 2) {
        for (const step of [s + 1, s]) {
          skew += 500;
          await get(step);
        }
      }
      const c = consumerOf(rf);
      expect(c.stepSeconds).toBeGreaterThan(0.4);
      expect(c.stepSeconds).toBeLessThan(0.7);
    }, () => performance.now() + skew);
  });

  it("does not switch a consumer back to a dataset version it has moved past (a request begun before a re-registration)", async () => {
    await withServer([], async (rf) => {
      const get = (step: number) => batchOf(rf, step);
      const consumer = () => consumerOf(rf);
      for (let s = 0; s < 5; s++) await get(s);
      const old = await rf.server.datasets.get("big");
      const res = await fetch(`${rf.url}/v1/datasets/big`, {
        method: "PUT",
        headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
        body: JSON.stringify({ sources: [{ prefix: "data/tok/big" }], seq_length: 512, seed: 10, split: "100,0,0", split_index: 0, num_samples: 4000 }),
      });
      expect(res.status).toBe(200); // replaced
      expect(await rf.server.datasets.get("big")).not.toBe(old);
      for (let s = 5; s < 8; s++) await get(s); // the new version: the window starts over once
      const before = consumer();
      const warm = vi.spyOn(rf.server.cache, "warm");
      try {
        // What the route does when a batch of the old version, begun before the PUT, ends now.
        rf.server.readAhead.observe(old, { dataset: "big", rank: 1, world: 2, microBatch: 8 }, 4);
        expect(warm).not.toHaveBeenCalled();
        expect(consumer().step).toBe(before.step);
        expect(consumer().stepsScheduled).toBe(before.stepsScheduled);
      } finally {
        warm.mockRestore();
      }
    });
  });

  it("starts over from a consumer's new position after a jump (resume at another step)", async () => {
    await withServer([], async (rf) => {
      await trainer(rf, 5, 10);
      const res = await fetch(`${rf.url}/v1/datasets/big/batches/150?rank=1&world=2&micro_batch=8`);
      await res.arrayBuffer();
      await new Promise((r) => setTimeout(r, 50));
      const next = await fetch(`${rf.url}/v1/datasets/big/batches/151?rank=1&world=2&micro_batch=8`);
      await next.arrayBuffer();
      expect(next.headers.get("x-rackfeed-cache")).not.toBe("miss");
    });
  });

  it("keeps no next uses until Belady eviction first asks, then answers as if it had kept them all along", async () => {
    await withServer([], async (rf) => {
      const reg = await rf.server.datasets.get("big");
      const cache = rf.server.cache;
      let t = 1000;
      const make = () => new ReadAhead({ cache, now: () => t, budgetSeconds: 2, maxSteps: 6, maxBytesPerConsumer: 2 ** 30, maxConsumers: 16 });
      const eager = make();
      const lazy = make();
      expect(eager.nextUse("no such block")).toBe(Infinity); // the first question starts its bookkeeping
      const a: ConsumerKey = { dataset: "big", rank: 0, world: 2, microBatch: 8 };
      const b: ConsumerKey = { dataset: "big", rank: 1, world: 2, microBatch: 8 };
      // Two consumers a step per ms, one straggler, one jump back (a resume), a second key object for `a`.
      const served: [ConsumerKey, number][] = [];
      for (let s = 0; s < 12; s++) served.push([a, s], [b, s]);
      served.push([a, 13], [a, 12], [b, 3], [{ ...a }, 14], [b, 4], [b, 5]);
      for (const [c, step] of served) {
        t += 1;
        eager.observe(reg, c, step);
        lazy.observe(reg, c, step);
      }
      const keysOf = (c: ConsumerKey, step: number) => blockKeys(cache, reg, planSamples(reg, stepSamples(step, c.rank, c.world, c.microBatch), c.microBatch, cache.blockBytes));
      const all = new Set<string>();
      for (let s = 0; s < 24; s++) for (const k of [...keysOf(a, s), ...keysOf(b, s)]) all.add(k);
      const answers = (ra: ReadAhead) => [...all].map((k) => ra.nextUse(k));
      const want = answers(eager);
      expect(answers(lazy)).toEqual(want);
      // Not vacuous: the steps ahead of each consumer are protected, a step only served long ago is not.
      for (const k of keysOf(a, 15)) expect(lazy.nextUse(k)).toBeLessThan(Infinity);
      for (const k of keysOf(b, 6)) expect(lazy.nextUse(k)).toBeLessThan(Infinity);
      expect(want.filter((v) => v === Infinity).length).toBeGreaterThan(0);
      // From the first question on, the lazy one keeps them step by step too.
      for (let s = 15; s < 20; s++) {
        t += 1;
        eager.observe(reg, a, s);
        lazy.observe(reg, a, s);
      }
      expect(answers(lazy)).toEqual(answers(eager));
    });
  });

  it("keeps a block protected for a consumer that needs it after another consumer has served its own step with it", async () => {
    await withServer([], async (rf) => {
      const reg = await rf.server.datasets.get("big");
      const cache = rf.server.cache;
      let t = 1000;
      const ra = new ReadAhead({ cache, now: () => t, budgetSeconds: 2, maxSteps: 6, maxBytesPerConsumer: 2 ** 30, maxConsumers: 16 });
      ra.nextUse("no such block"); // bookkeeping from the start
      // Two trainers reading the same samples (two jobs on one dataset), one 3 steps behind.
      const ahead: ConsumerKey = { dataset: "big", rank: 0, world: 1, microBatch: 8 };
      const behind: ConsumerKey = { dataset: "big-second-job", rank: 0, world: 1, microBatch: 8 };
      for (let s = 0; s < 3; s++) {
        t += 1;
        ra.observe(reg, ahead, s);
      }
      for (let s = 0; s < 3; s++) {
        t += 1;
        ra.observe(reg, ahead, s + 3);
        ra.observe(reg, behind, s);
      }
      // Step 4's blocks: served to the first trainer already, due for the second at its step 4.
      const keys = blockKeys(cache, reg, planSamples(reg, stepSamples(4, 0, 1, 8), 8, cache.blockBytes));
      for (let s = 6; s < 9; s++) {
        t += 1;
        ra.observe(reg, ahead, s);
      }
      for (const k of keys) expect(ra.nextUse(k)).toBeLessThan(Infinity);
      for (let s = 3; s < 12; s++) {
        t += 1;
        ra.observe(reg, behind, s);
        ra.observe(reg, ahead, s + 6);
      }
      // Served to both now, and behind both windows (steps 12-23): no longer needed unless a later step shares it.
      const old = blockKeys(cache, reg, planSamples(reg, stepSamples(4, 0, 1, 8), 8, cache.blockBytes));
      const later = new Set<string>();
      for (let s = 12; s < 24; s++) for (const k of blockKeys(cache, reg, planSamples(reg, stepSamples(s, 0, 1, 8), 8, cache.blockBytes))) later.add(k);
      for (const k of old) if (!later.has(k)) expect(ra.nextUse(k)).toBe(Infinity);
    });
  });
});
