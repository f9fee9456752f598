import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient, RackfeedError } from "../../src/client/mod.ts";
import { localTransport } from "../../src/client/node.ts";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

// 400 samples: with world 1 and micro-batch 4, steps 0-99.
const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 64, seed: 9, split: "100,0,0", split_index: 0, num_samples: 400 };
let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 3000, 20, 300);
  rf = await startServer(ws, [...(await datasetFlags(ws, "d", REG)), "--shm-dir", join(ws.dir, "shm")]);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

describe("shared-memory path of the SDK", () => {
  it("raises 416 RANGE_NOT_SATISFIABLE for an endStep beyond the dataset, after its last batch, as over HTTP", async () => {
    for (const shm of [true, false]) {
      const c = new RackfeedClient({ url: rf.url, local: localTransport(), shm });
      const seen: number[] = [];
      const transports = new Set<string>();
      const err = await (async () => {
        for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 4, startStep: 95, endStep: 110 })) {
          seen.push(b.step);
          transports.add(b.transport);
        }
      })().then(() => undefined, (e) => e);
      const path = shm ? "shm" : "http";
      expect([...transports], path).toEqual([path]);
      expect(seen, path).toEqual([95, 96, 97, 98, 99]);
      expect(err, path).toBeInstanceOf(RackfeedError);
      expect(err.status, path).toBe(416);
      expect(err.message, path).toMatch(/Step 100 is beyond dataset "d"/);
    }
  });
});
