import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 128, seed: 5, split: "100,0,0", split_index: 0, num_samples: 200 };
let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 300, 50, 600);
  rf = await startServer(ws, await datasetFlags(ws, "d", REG));
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

const report = (steps: readonly unknown[]) =>
  fetch(`${rf.url}/v1/telemetry`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ dataset: "d", rank: 0, world: 1, micro_batch: 1, steps }),
  });

describe("POST /v1/telemetry", () => {
  it("refuses a report whose steps are not objects with a 400 naming the entry, and records nothing of it", async () => {
    const before = await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" });
    for (const [steps, i] of [[[{ step: 0, t_wait: 0.1 }, null, 5], 1], [[5], 0], [["x"], 0], [[[1]], 0]] as const) {
      const res = await report(steps);
      expect(res.status, JSON.stringify(steps)).toBe(400);
      expect((await res.json()).message).toMatch(new RegExp(`Invalid telemetry "steps\\[${i}\\]": expected an object`));
    }
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" })).toBe(before);
    expect((await report([{ step: 0, t_wait: 0.1 }])).status).toBe(204);
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" })).toBe(before + 1);
  });
});
