import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { syntheticDataset } from "../helpers/token-data.ts";

const ADMIN = "admin-token-for-tests";
let ws: Workspace;

beforeAll(async () => {
  ws = await makeWorkspace();
  const { idx, bin } = syntheticDataset(3000, 100, 1500); // ~2.4 M tokens, ~4.7 MB
  await ws.put("tok/big.idx", idx);
  await ws.put("tok/big.bin", bin);
});
afterAll(async () => {
  await ws.remove();
});

async function withServer(args: string[], fn: (rf: RunningServer) => Promise<void>): Promise<void> {
  const rf = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "4KiB", "--memory-bytes", "16MiB", ...args]);
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

/** A trainer that takes `steps` steps of `stepMs` compute each; returns the x-rackfeed-cache of each batch. */
async function trainer(rf: RunningServer, steps: number, stepMs: number): Promise<string[]> {
  const seen: string[] = [];
  for (let step = 0; step < steps; step++) {
    const res = await fetch(`${rf.url}/v1/datasets/big/batches/${step}?rank=1&world=2&micro_batch=8`);
    expect(res.status).toBe(200);
    await res.arrayBuffer();
    seen.push(res.headers.get("x-rackfeed-cache")!);
    await new Promise((r) => setTimeout(r, stepMs));
  }
  return seen;
}

describe("schedule-aware read-ahead", () => {
  it("makes a steady consumer see only memory hits after warm-up", async () => {
    await withServer([], async (rf) => {
      const seen = await trainer(rf, 30, 15);
      expect(seen.slice(3)).toEqual(Array(27).fill("hit"));
      expect(await rf.metric("rackfeed_readahead_blocks_total")).toBeGreaterThan(0);
      const labels = { dataset: "big", rank: "1", world: "2", micro_batch: "8" };
      expect(await rf.metric("rackfeed_readahead_steps", labels)).toBeGreaterThan(5);
      expect(await rf.metric("rackfeed_readahead_seconds", labels)).toBeGreaterThan(0);
      expect(await rf.metric("rackfeed_consumer_step_seconds", labels)).toBeGreaterThan(0.01);
      expect(await rf.metric("rackfeed_batch_seconds_count", { cache: "hit" })).toBeGreaterThanOrEqual(27);
    });
  });

  it("without read-ahead the same consumer misses on most steps (the contrast)", async () => {
    await withServer(["--read-ahead-seconds", "0"], async (rf) => {
      const seen = await trainer(rf, 30, 15);
      expect(seen.filter((s) => s === "miss").length).toBeGreaterThan(20);
      expect(await rf.metric("rackfeed_readahead_blocks_total")).toBe(0);
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
      expect(next.headers.get("x-rackfeed-cache")).toBe("hit");
    });
  });
});
