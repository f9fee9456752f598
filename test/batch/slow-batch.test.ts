import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { blockIndex, planSamples } from "../../src/batch/block-plans.ts";
import { type BatchCost, classifySlowBatch } from "../../src/batch/batch-stats.ts";
import { stepSamples } from "../../src/batch/steps.ts";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
import type { ObjectInfo } from "../../src/origin/origin.ts";
import { makeWorkspace, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { putSyntheticDataset } from "../helpers/token-data.ts";

const base: BatchCost = {
  blocksTotal: 8,
  blocksMissing: 0,
  missingFromOrigin: 0,
  blocksFilling: 0,
  fromMemory: 8,
  fromDisk: 0,
  fromOrigin: 0,
  fetchSeconds: 0,
  copySeconds: 0.2,
};

describe("classifySlowBatch", () => {
  it("blames assembly when every block was in memory or copying took longest", () => {
    expect(classifySlowBatch(base)).toBe("assembly");
    expect(classifySlowBatch({ ...base, fromMemory: 4, fromOrigin: 4, blocksMissing: 4, fetchSeconds: 0.1, copySeconds: 0.3 })).toBe("assembly");
  });
  it("blames exhausted read-ahead when unfetched blocks had to come from the origin", () => {
    expect(classifySlowBatch({ ...base, fromMemory: 5, fromOrigin: 3, blocksMissing: 3, missingFromOrigin: 3, fetchSeconds: 0.3, copySeconds: 0.001 })).toBe("readahead_exhausted");
  });
  it("blames the origin when read-ahead had started the fills but they were late", () => {
    expect(classifySlowBatch({ ...base, fromMemory: 5, fromOrigin: 3, blocksFilling: 3, fetchSeconds: 0.3, copySeconds: 0.001 })).toBe("origin_slow");
    // Also when the blocks nobody had started came from NVMe and only read-ahead's fills from the origin.
    expect(classifySlowBatch({ ...base, fromMemory: 2, fromDisk: 2, fromOrigin: 5, blocksMissing: 2, blocksFilling: 5, blocksTotal: 9, fetchSeconds: 0.3, copySeconds: 0.001 })).toBe("origin_slow");
  });
  it("blames the disk when the wait was for NVMe reads", () => {
    expect(classifySlowBatch({ ...base, fromMemory: 2, fromDisk: 6, blocksMissing: 6, fetchSeconds: 0.3, copySeconds: 0.001 })).toBe("disk_slow");
    // Also when read-ahead had started those reads and they were still arriving (nothing from the origin).
    expect(classifySlowBatch({ ...base, fromMemory: 2, fromDisk: 8, blocksMissing: 2, blocksFilling: 6, blocksTotal: 10, fetchSeconds: 0.1074, copySeconds: 0.0001 })).toBe("disk_slow");
  });
});

const BLOCK = 4096; // --block-bytes below

/**
 * An fs origin whose every read takes `delayMs`. While held (`hold`), a read of a `.bin` block
 * not in the given set first waits for `release()`, then takes its `delayMs` as usual.
 */
class SlowOrigin extends FsOrigin {
  #gate: { pass: ReadonlySet<number>; opened: Promise<void>; open: () => void } | undefined;
  constructor(root: string, readonly delayMs: number) {
    super({ name: "data", root });
  }
  hold(pass: ReadonlySet<number>): void {
    let open!: () => void;
    const opened = new Promise<void>((r) => (open = r));
    this.#gate = { pass, opened, open };
  }
  release(): void {
    this.#gate?.open();
    this.#gate = undefined;
  }
  override async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    const gate = this.#gate;
    if (gate && key.endsWith(".bin") && !gate.pass.has(Math.floor(offset / BLOCK))) await gate.opened;
    await new Promise((r) => setTimeout(r, this.delayMs));
    return await super.read(key, info, offset, dest);
  }
}

const ADMIN = "admin-token-for-tests";
let ws: Workspace;
beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 2000, 100, 1500);
});
afterAll(async () => {
  await ws.remove();
});

let servers = 0;
async function withServer(
  args: string[],
  fn: (rf: RunningServer, logs: string[]) => Promise<void>,
  origin = new SlowOrigin(ws.origin, 120),
): Promise<void> {
  const logs: string[] = [];
  const rf = await startServer(
    ws,
    // A fresh NVMe tier per server: a warm one would turn origin reads into disk reads.
    ["--admin-token", ADMIN, "--block-bytes", String(BLOCK), "--slow-batch", "40ms", "--cache-dir", `${ws.cache}-${++servers}`, ...args],
    { makeOrigin: () => origin, log: (m) => logs.push(m) },
  );
  try {
    const res = await fetch(`${rf.url}/v1/datasets/d`, {
      method: "PUT",
      headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
      body: JSON.stringify({ sources: [{ prefix: "data/tok/d" }], seq_length: 256, seed: 3, split: "100,0,0", split_index: 0, num_samples: 2000 }),
    });
    expect(res.status).toBe(201);
    await fn(rf, logs);
  } finally {
    await rf.close();
  }
}

const batch = (rf: RunningServer, step: number) =>
  fetch(`${rf.url}/v1/datasets/d/batches/${step}?rank=0&world=1&micro_batch=4`).then((r) => r.arrayBuffer());

describe("slow batches in a running server", () => {
  it("are attributed to exhausted read-ahead when the consumer has no look-ahead, logged with their numbers, and counted", async () => {
    await withServer(["--read-ahead-seconds", "0"], async (rf, logs) => {
      await batch(rf, 0);
      expect(await rf.metric("rackfeed_slow_batches_total", { cause: "readahead_exhausted" })).toBe(1);
      expect(await rf.metric("rackfeed_slow_batches_total", { cause: "origin_slow" })).toBe(0);
      expect(logs.find((l) => l.startsWith("slow batch:"))).toMatch(
        /slow batch: d rank 0\/1 × 4 step 0 took \d+\.\d ms, cause readahead_exhausted \(blocks \d+: 0 memory, 0 disk, \d+ origin/,
      );
    });
  });

  it("are attributed to the origin when read-ahead had already started the fills", async () => {
    const origin = new SlowOrigin(ws.origin, 120);
    await withServer([], async (rf) => {
      const reg = await rf.server.datasets.get("d");
      const blocksOf = (step: number) => new Set(planSamples(reg, stepSamples(step, 0, 1, 4), 4, BLOCK).blocks.map(blockIndex));
      const step0 = blocksOf(0);
      expect([...blocksOf(1)].some((b) => !step0.has(b)), "step 1 needs blocks that step 0 does not").toBe(true);
      // Batch 0's own reads pass; the fills read-ahead starts for steps 1 and 2 stay at the
      // origin until batch 1 waits on them (not a race between the origin and the next request).
      origin.hold(step0);
      await batch(rf, 0); // cold: read-ahead starts steps 1 and 2
      const coalesced = rf.server.cache.stats().coalesced;
      const second = batch(rf, 1);
      await waitFor(() => rf.server.cache.stats().coalesced > coalesced, "batch 1 to wait on read-ahead's fills");
      origin.release(); // its fills are still waiting for the slow origin: 120 ms more
      await second;
      expect(await rf.metric("rackfeed_slow_batches_total", { cause: "origin_slow" })).toBe(1);
    }, origin);
  });

  it("count per-dataset block sources, bytes and consumers", async () => {
    await withServer([], async (rf) => {
      await batch(rf, 0);
      // Read-ahead started the fills of steps 1 and 2 before batch 0 was answered: wait until
      // they have landed (on a loaded machine a fixed pause could end before the slow origin's reads).
      await waitFor(() => rf.server.cache.stats().inFlight === 0, "read-ahead's fills to land");
      await batch(rf, 1);
      const origin = await rf.metric("rackfeed_dataset_blocks_total", { dataset: "d", source: "origin" });
      const memory = await rf.metric("rackfeed_dataset_blocks_total", { dataset: "d", source: "memory" });
      expect(origin).toBeGreaterThan(0);
      expect(memory).toBeGreaterThan(0);
      expect(await rf.metric("rackfeed_dataset_hit_ratio", { dataset: "d" })).toBeCloseTo(memory / (memory + origin), 5);
      expect(await rf.metric("rackfeed_dataset_served_bytes_total", { dataset: "d" })).toBe(2 * 4 * 257 * 2);
      expect(await rf.metric("rackfeed_dataset_batches_total", { dataset: "d" })).toBe(2);
      expect(await rf.metric("rackfeed_dataset_consumers", { dataset: "d" })).toBe(1);
    });
  });
});
