import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { assembleSamples, takeResident } from "../../src/batch/assemble-batch.ts";
import { blockSource, keptPlans, planSamples } from "../../src/batch/block-plans.ts";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { encodeIndex, readSample } from "../../src/dataset/mod.ts";
import { patternBytes } from "../helpers/rackfeed.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

const ADMIN = "admin-token-for-tests";
const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 96, seed: 4, split: "100,0,0", split_index: 0, num_samples: 3000 };
let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 1000, 20, 400);
  // An int32 source to blend with the uint16 one: the blend is served as int32.
  const lengths = Array.from({ length: 500 }, (_, i) => 20 + ((i * 7919) % 381));
  await ws.put("tok/w.idx", encodeIndex({ dtypeCode: 4, lengths }));
  await ws.put("tok/w.bin", patternBytes(lengths.reduce((a, b) => a + b, 0) * 4, 9));
  rf = await startServer(ws, [...(await datasetFlags(ws, "d", REG)), "--block-bytes", "8KiB", "--admin-token", ADMIN]);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

describe("batch planning", () => {
  it("plans a run of samples once and shares the plan (read-ahead and the batch), per dataset version", async () => {
    const reg = await rf.server.datasets.get("d");
    const plan = planSamples(reg, 40, 16, 8192);
    expect(planSamples(reg, 40, 16, 8192)).toBe(plan); // the same run: the kept plan
    expect(planSamples(reg, 40, 17, 8192)).not.toBe(plan); // another run: its own plan
    expect(planSamples(reg, 40, 17, 8192).segmentCount).toBeGreaterThanOrEqual(plan.segmentCount);
    expect(planSamples(reg, 40, 16, 4096)).not.toBe(plan); // other block size, other blocks
    expect(planSamples(reg, 40, 16, 8192, "once")).toBe(plan); // a one-off use still finds a kept plan
    expect(planSamples(reg, 80, 16, 8192, "once")).not.toBe(planSamples(reg, 80, 16, 8192, "once")); // and keeps none
    // Short runs too.
    expect(planSamples(reg, 40, 4, 8192)).toBe(planSamples(reg, 40, 4, 8192));
    // Read-ahead's plan serves the batch, and the batch's serves read-ahead: the second user takes
    // it out of the table (a plan kept on would outlive the young generation for nothing), and
    // other readers of the same step (tensor-parallel ranks) still find it for a moment.
    const ahead = planSamples(reg, 120, 8, 8192, "read-ahead");
    const held = keptPlans().plans;
    expect(planSamples(reg, 120, 8, 8192, "read-ahead")).toBe(ahead); // read-ahead again: still kept
    expect(keptPlans().plans).toBe(held);
    expect(planSamples(reg, 120, 8, 8192, "batch")).toBe(ahead); // its batch: taken out
    expect(keptPlans().plans).toBe(held - 1);
    expect(planSamples(reg, 120, 8, 8192, "batch")).toBe(ahead); // another reader of the step
    expect(planSamples(reg, 120, 8, 8192, "once")).toBe(ahead);
    expect(keptPlans().plans).toBe(held - 1); // and kept again by neither
    const first = planSamples(reg, 160, 8, 8192, "batch");
    expect(keptPlans().plans).toBe(held);
    expect(planSamples(reg, 160, 8, 8192, "once")).toBe(first); // a one-off use takes nothing out
    expect(keptPlans().plans).toBe(held);
    expect(planSamples(reg, 160, 8, 8192, "read-ahead")).toBe(first);
    expect(keptPlans().plans).toBe(held - 1);

    // The kept plan assembles the same bytes as the HTTP route.
    const viaPlan = await assembleSamples(rf.server.cache, reg, 40, 16, 2 ** 30);
    const viaHttp = new Uint8Array(await (await fetch(`${rf.url}/v1/datasets/d/samples?start=40&count=16`)).arrayBuffer());
    expect(Buffer.from(viaPlan.body).equals(Buffer.from(viaHttp))).toBe(true);
    // A new version of the dataset (registered again, another seed) plans afresh.
    const res = await fetch(`${rf.url}/v1/datasets/d`, {
      method: "PUT",
      headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
      body: JSON.stringify({ ...REG, seed: 5 }),
    });
    expect(res.ok, String(res.status)).toBe(true);
    const rebuilt = await rf.server.datasets.get("d");
    expect(rebuilt).not.toBe(reg);
    expect(planSamples(rebuilt, 40, 16, 8192)).not.toBe(plan);
  });

  it("keeps read-ahead's plan for the batch when the batch's blocks turn out not to be in memory", async () => {
    const reg = await rf.server.datasets.get("d");
    const cache = rf.server.cache;
    // Samples 2400… have not been read yet: takeResident gives up, and assembleSamples then reads the batch.
    const ahead = planSamples(reg, 2400, 8, cache.blockBytes, "read-ahead");
    const held = keptPlans().plans;
    expect(takeResident(cache, reg, 2400, 8, 2 ** 30)).toBeUndefined();
    expect(keptPlans().plans).toBe(held); // still kept
    await assembleSamples(cache, reg, 2400, 8, 2 ** 30); // the batch's use: reads its blocks, takes the plan out
    expect(keptPlans().plans).toBe(held - 1);
    // Samples 2401–2407 are resident now: a takeResident that succeeds is the batch's use, and
    // takes read-ahead's plan out.
    const again = planSamples(reg, 2401, 7, cache.blockBytes, "read-ahead");
    expect(keptPlans().plans).toBe(held);
    expect(takeResident(cache, reg, 2401, 7, 2 ** 30)?.plan).toBe(again);
    expect(keptPlans().plans).toBe(held - 1);
    expect(planSamples(reg, 2400, 8, cache.blockBytes, "once")).toBe(ahead); // both still found a moment later
  });

  it("refuses to plan from inside a plan (the scratch arrays are shared)", async () => {
    const reg = await rf.server.datasets.get("d");
    const ds = reg.dataset as { planSample: (i: number, out: Float64Array, at?: number) => number };
    const own = Object.getOwnPropertyDescriptor(ds, "planSample");
    const inner = ds.planSample.bind(ds);
    ds.planSample = (i, out, at) => {
      planSamples(reg, 0, 2, 8192, "once"); // re-entered
      return inner(i, out, at);
    };
    try {
      expect(() => planSamples(reg, 2800, 4, 8192, "once")).toThrow(/re-entered/);
    } finally {
      if (own) Object.defineProperty(ds, "planSample", own);
      else delete (ds as Record<string, unknown>).planSample;
    }
    expect(planSamples(reg, 2800, 4, 8192, "once").segmentCount).toBeGreaterThan(0); // planning works again
  });

  it("widens a blend of uint16 and int32 sources to int32, token for token, across block boundaries", async () => {
    const res = await fetch(`${rf.url}/v1/datasets/mixed`, {
      method: "PUT",
      headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
      body: JSON.stringify({ ...REG, sources: [{ weight: 1, prefix: "data/tok/d" }, { weight: 1, prefix: "data/tok/w" }] }),
    });
    expect(res.status, await res.clone().text()).toBe(201);
    const reg = await rf.server.datasets.get("mixed");
    expect(reg.dataset.dtype).toBe("int32");
    const bins = await Promise.all(["d", "w"].map(async (n) => new Uint8Array(await (await fetch(`${rf.url}/v1/objects/data/tok/${n}.bin`)).arrayBuffer())));
    const w = reg.dataset.windowLength;
    const first = 100;
    const count = 64;
    const plan = planSamples(reg, first, count, rf.server.cache.blockBytes);
    // Pieces crossing 8 KiB blocks (a segment ending at a block's end, the next starting at 0 of
    // the next block), from both sources: the cases the copy loop must get right.
    const bb = rf.server.cache.blockBytes;
    const ends = Array.from({ length: plan.segmentCount }, (_, i) => plan.segments[4 * i + 3]);
    expect(ends.filter((e) => e === bb).length).toBeGreaterThan(0);
    expect(new Set(plan.blocks.map(blockSource)).size).toBe(2);
    const batch = await assembleSamples(rf.server.cache, reg, first, count, 2 ** 30);
    const got = new Int32Array(batch.body.buffer, batch.body.byteOffset, count * w);
    const want = new Int32Array(w);
    for (let i = 0; i < count; i++) {
      readSample(reg.dataset, bins, first + i, want);
      expect(got.subarray(i * w, (i + 1) * w)).toEqual(want);
    }
  });

  it("fails a batch rather than send bytes it did not copy when a block is shorter than planned", async () => {
    // Cannot happen through the real cache (fills are sized from the object's length, disk reads
    // are length-checked): a stand-in cache hands out blocks 64 bytes short.
    const reg = await rf.server.datasets.get("d");
    const bb = rf.server.cache.blockBytes;
    const bin = new Uint8Array(await (await fetch(`${rf.url}/v1/objects/data/tok/d.bin`)).arrayBuffer());
    const short = {
      blockBytes: bb,
      filling: () => false,
      keyOf: (_gw: unknown, _key: string, _info: unknown, index: number) => String(index),
      countMemoryHits: () => {},
      memoryBlockOfKey: (k: string) => bin.slice(Number(k) * bb, (Number(k) + 1) * bb - 64),
    } as unknown as Parameters<typeof assembleSamples>[0];
    await expect(assembleSamples(short, reg, 0, 400, 2 ** 30)).rejects.toThrow(/shorter than its plan/);
    // The same stand-in with whole blocks assembles what the server serves.
    const whole = { ...short, memoryBlockOfKey: (k: string) => bin.slice(Number(k) * bb, (Number(k) + 1) * bb) } as typeof short;
    const viaHttp = new Uint8Array(await (await fetch(`${rf.url}/v1/datasets/d/samples?start=0&count=16`)).arrayBuffer());
    expect(Buffer.from((await assembleSamples(whole, reg, 0, 16, 2 ** 30)).body).equals(Buffer.from(viaHttp))).toBe(true);
  });

  it("names each block of a plan once, from a few blocks to more than its scan of recent ones covers, and every segment within its block", async () => {
    const reg = await rf.server.datasets.get("d");
    const bin = new Uint8Array(await (await fetch(`${rf.url}/v1/objects/data/tok/d.bin`)).arrayBuffer());
    const bb = 1024;
    for (const [first, count] of [[10, 2], [0, 40], [500, 2000]] as const) {
      const plan = planSamples(reg, first, count, bb, "once");
      expect(new Set(plan.blocks).size, `${count} samples`).toBe(plan.blocks.length);
      if (count === 2000) expect(plan.blocks.length).toBeGreaterThan(100); // past the scan: the map
      // Each segment's bytes, read at its block's offset in the .bin, are the samples' tokens.
      const out = new Uint8Array(count * reg.dataset.windowLength * 2);
      let at = 0;
      for (let i = 0; i < plan.segmentCount; i++) {
        const block = plan.blocks[plan.segments[4 * i + 1]] % 2 ** 32;
        const start = plan.segments[4 * i + 2];
        const end = plan.segments[4 * i + 3];
        expect(end).toBeLessThanOrEqual(bb);
        out.set(bin.subarray(block * bb + start, block * bb + end), at);
        at += end - start;
      }
      const want = new Uint16Array(reg.dataset.windowLength);
      const got = new Uint16Array(out.buffer);
      for (let i = 0; i < count; i += 37) {
        readSample(reg.dataset, [bin], first + i, want);
        expect(got.subarray(i * want.length, (i + 1) * want.length)).toEqual(want);
      }
    }
  });

  it("refuses a run past the last sample, and keeps no plan for it", async () => {
    const reg = await rf.server.datasets.get("d");
    const n = reg.dataset.numSamples;
    expect(() => planSamples(reg, n - 2, 4, 8192)).toThrow(/do not exist/);
    expect(() => planSamples(reg, n - 2, 4, 8192)).toThrow(/do not exist/);
  });
});
