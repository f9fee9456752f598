import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { assembleSamples, planSamples } from "../../src/batch/assemble-batch.ts";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { syntheticDataset } from "../helpers/token-data.ts";

const ADMIN = "admin-token-for-tests";
const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 96, seed: 4, split: "100,0,0", split_index: 0, num_samples: 3000 };
let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  const { idx, bin } = syntheticDataset(1000, 20, 400);
  await ws.put("tok/d.idx", idx);
  await ws.put("tok/d.bin", bin);
  await writeFile(join(ws.dir, "d.json"), JSON.stringify(REG));
  rf = await startServer(ws, ["--dataset", `d=${join(ws.dir, "d.json")}`, "--block-bytes", "8KiB", "--admin-token", ADMIN]);
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
    expect(planSamples(reg, 40, 17, 8192).pieceCount).toBeGreaterThanOrEqual(plan.pieceCount);
    expect(planSamples(reg, 40, 16, 4096)).not.toBe(plan); // other block size, other blocks
    expect(planSamples(reg, 40, 16, 8192, false)).toBe(plan); // a one-off use still finds a kept plan
    expect(planSamples(reg, 80, 16, 8192, false)).not.toBe(planSamples(reg, 80, 16, 8192, false)); // and keeps none
    // Short runs are cheaper to plan again than to keep.
    expect(planSamples(reg, 40, 4, 8192)).not.toBe(planSamples(reg, 40, 4, 8192));
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

  it("refuses a run past the last sample, and keeps no plan for it", async () => {
    const reg = await rf.server.datasets.get("d");
    const n = reg.dataset.numSamples;
    expect(() => planSamples(reg, n - 2, 4, 8192)).toThrow(/do not exist/);
    expect(() => planSamples(reg, n - 2, 4, 8192)).toThrow(/do not exist/);
  });
});
