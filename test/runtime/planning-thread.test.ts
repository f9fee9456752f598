import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient } from "../../src/client/mod.ts";
import { localTransport } from "../../src/client/node.ts";
import { workerIndexBuilder } from "../../src/runtime/index-builder.ts";
import { PlanningThread } from "../../src/runtime/planning-thread.ts";
import { makeWorkspace, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

// Small: built on the event loop, its arrays copied into shared memory for the thread. Large
// (16 bytes of work per sample over 1 MiB): built on the index-build worker, its arrays in shared
// memory already. The blend: two sources, each with its own indexes.
const SMALL = { sources: [{ prefix: "data/tok/a" }], seq_length: 64, seed: 3, split: "100,0,0", split_index: 0, num_samples: 4000 };
const LARGE = { ...SMALL, seed: 5, num_samples: 100_000 };
const BLEND = { ...SMALL, sources: [{ prefix: "data/tok/a", weight: 0.7 }, { prefix: "data/tok/b", weight: 0.3 }], seed: 11 };
const STEPS = 300;
const GEOMETRY = "rank=1&world=2&micro_batch=4";

let ws: Workspace;
let flags: string[];

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/a", 3000, 20, 300, 1);
  await putSyntheticDataset(ws, "tok/b", 2000, 10, 500, 2);
  flags = [
    ...(await datasetFlags(ws, "small", SMALL)),
    ...(await datasetFlags(ws, "large", LARGE)),
    ...(await datasetFlags(ws, "blend", BLEND)),
    "--block-bytes",
    "16KiB",
  ];
});
afterAll(async () => {
  await ws.remove();
});

async function httpBatches(rf: RunningServer, dataset: string): Promise<Uint8Array[]> {
  const out: Uint8Array[] = [];
  for (let s = 0; s < STEPS; s++) {
    const res = await fetch(`${rf.url}/v1/datasets/${dataset}/batches/${s}?${GEOMETRY}`);
    expect(res.status).toBe(200);
    out.push(new Uint8Array(await res.arrayBuffer()));
  }
  return out;
}

describe("the planning thread", () => {
  it.each([["small"], ["large"], ["blend"]])("serves the %s dataset's batches byte for byte as the event loop plans them, over HTTP and shm, with its plans used", async (dataset) => {
    const env = { buildOffThread: workerIndexBuilder("node") };
    const plain = await startServer(ws, [...flags, "--planning-thread", "off"], { ...env, startPlanningThread: () => new PlanningThread("node") });
    const shmDir = join(ws.dir, `shm-${dataset}`);
    let thread: PlanningThread | undefined;
    const planned = await startServer(ws, [...flags, "--planning-thread", "on", "--shm-dir", shmDir], {
      ...env,
      startPlanningThread: () => (thread = new PlanningThread("node")),
    });
    try {
      await thread!.ready; // until then every step is planned on the event loop
      // Where the index arrays are: the large dataset's came from the index-build worker shared.
      const shared = (await planned.server.datasets.get(dataset)).dataset.sources[0].gpt.shuffleIndex.buffer instanceof SharedArrayBuffer;
      expect(shared).toBe(dataset === "large");
      const want = await httpBatches(plain, dataset);
      expect(await plain.metric("rackfeed_plans_made_ahead_total")).toBe(0);
      expect(await httpBatches(planned, dataset)).toEqual(want);
      const overHttp = await planned.metric("rackfeed_plans_made_ahead_total");
      // The first steps are planned before the thread has their requests; most after are its.
      expect(overHttp).toBeGreaterThan(STEPS / 2);
      // A second consumer (another rank's view, over shm): its steps are new plans, the thread's too.
      const c = new RackfeedClient({ url: planned.url, local: localTransport() });
      let s = 0;
      for await (const b of c.batches(dataset, { rank: 1, world: 2, microBatch: 4, endStep: STEPS })) {
        expect(b.transport).toBe("shm");
        expect(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength)).toEqual(want[s++]);
      }
      expect(s).toBe(STEPS);
      await c.close();
      await waitFor(async () => (await planned.metric("rackfeed_plans_made_ahead_total")) > overHttp, "plans made ahead for the shm consumer");
    } finally {
      await plain.close();
      await planned.close();
    }
  });

  it("starts under auto only where the process may run on 4 CPUs or more, and never when off", async () => {
    for (const [mode, cpus, started] of [["auto", 2, 0], ["auto", 4, 1], ["off", 16, 0], ["on", 1, 1]] as const) {
      let starts = 0;
      const rf = await startServer(ws, [...flags, "--planning-thread", mode], {
        cpus,
        startPlanningThread: () => {
          starts++;
          return new PlanningThread("node");
        },
      });
      await rf.close();
      expect({ mode, cpus, starts }).toEqual({ mode, cpus, starts: started });
    }
  });

  it("leaves planning to the event loop once its thread is gone, the batches unchanged", async () => {
    const plain = await startServer(ws, [...flags, "--planning-thread", "off"]);
    let thread: PlanningThread | undefined;
    const planned = await startServer(ws, [...flags, "--planning-thread", "on"], {
      startPlanningThread: () => (thread = new PlanningThread("node")),
    });
    try {
      await thread!.close();
      expect(await httpBatches(planned, "small")).toEqual(await httpBatches(plain, "small"));
      expect(await planned.metric("rackfeed_plans_made_ahead_total")).toBe(0);
    } finally {
      await plain.close();
      await planned.close();
    }
  });
});
