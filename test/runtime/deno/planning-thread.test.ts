// Deno.test suite: the planning thread as a web Worker: plans made there, a replaced dataset
// version forgotten (and collected there) without the thread failing. Run by `npm test` with
// --v8-flags=--expose-gc.

import assert from "node:assert/strict";
import { computePlan, datasetVersionId } from "../../../src/batch/block-plans.ts";
import type { RegisteredDataset } from "../../../src/batch/dataset-catalog.ts";
import { buildFromIndexFiles, encodeIndex, parseDatasetConfig, type TokenDataset } from "../../../src/dataset/mod.ts";
import { PlanningThread } from "../../../src/runtime/planning-thread.ts";

function dataset(seed: number): TokenDataset {
  const lengths = Array.from({ length: 800 }, (_, i) => 30 + ((i * 7919 + seed) % 300));
  const config = parseDatasetConfig({ sources: [{ prefix: "d/a" }], seq_length: 64, seed, split: "100,0,0", split_index: 0, num_samples: 5000 });
  const tokens = lengths.reduce((a, b) => a + b, 0);
  return buildFromIndexFiles({ config, idx: [encodeIndex({ dtypeCode: 8, lengths })], paths: ["d/a.idx"], binSizes: [tokens * 2] });
}

/** Asks for a run's plan and waits for the thread to make it. */
async function planAhead(t: PlanningThread, reg: RegisteredDataset, first: number): Promise<ReturnType<PlanningThread["take"]>> {
  t.request(reg, first, 8, 4096);
  t.flush();
  for (let i = 0; i < 200; i++) {
    const plan = t.take(datasetVersionId(reg), first, 8, 4096);
    if (plan) return plan;
    await new Promise((r) => setTimeout(r, 5));
  }
  return undefined;
}

Deno.test("the planning thread (a web Worker) makes the event loop's plans, and goes on after forgetting a replaced dataset", async () => {
  const failures: string[] = [];
  const t = new PlanningThread("deno", (m) => failures.push(m));
  try {
    await t.ready;
    const gc = (globalThis as unknown as { gc: () => void }).gc;
    await (async () => {
      const old = { name: "d", dataset: dataset(1) } as unknown as RegisteredDataset;
      const plan = await planAhead(t, old, 80);
      assert.ok(plan, "no plan made ahead");
      const own = computePlan(old.dataset, "d", 80, 8, 4096);
      assert.deepEqual([...plan.segments], [...own.segments]);
      assert.deepEqual([...plan.blocks], [...own.blocks]);
    })();
    // The old version is garbage now: the thread is told to forget it, and collects.
    for (let i = 0; i < 100 && t.forgotten === 0; i++) {
      gc();
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(t.forgotten, 1);
    const next = { name: "d", dataset: dataset(2) } as unknown as RegisteredDataset;
    const plan = await planAhead(t, next, 160);
    assert.ok(plan, "no plan made ahead after a forget: the thread failed");
    assert.deepEqual([...plan.segments], [...computePlan(next.dataset, "d", 160, 8, 4096).segments]);
    assert.deepEqual(failures, []);
  } finally {
    await t.close();
  }
});
