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

const report = (steps: readonly unknown[], consumer: Record<string, unknown> = {}) =>
  fetch(`${rf.url}/v1/telemetry`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ dataset: "d", rank: 0, world: 1, micro_batch: 1, ...consumer, steps }),
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

  it("refuses a report whose rank, world or micro_batch is missing, of the wrong type or out of range with a 400 naming the field, and records nothing of it", async () => {
    const before = await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" });
    for (const [consumer, field] of [
      [{ rank: "0" }, "rank"],
      [{ rank: -1 }, "rank"],
      [{ rank: 2, world: 2 }, "rank"],
      [{ rank: 0.5 }, "rank"],
      [{ rank: undefined }, "rank"],
      [{ world: "1" }, "world"],
      [{ world: 0 }, "world"],
      [{ world: 2 ** 20 + 1 }, "world"],
      [{ world: null }, "world"],
      [{ micro_batch: "1" }, "micro_batch"],
      [{ micro_batch: 0 }, "micro_batch"],
      [{ micro_batch: 1e9 }, "micro_batch"],
      [{ micro_batch: true }, "micro_batch"],
    ] as const) {
      const res = await report([{ step: 0, t_wait: 0.1 }], consumer);
      expect(res.status, JSON.stringify(consumer)).toBe(400);
      expect((await res.json()).message, JSON.stringify(consumer)).toMatch(new RegExp(`^Invalid telemetry "${field}": expected an integer from \\d+ to \\d+, received `));
    }
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" })).toBe(before);
    expect((await report([{ step: 0, t_wait: 0.1 }], { rank: 3, world: 4, micro_batch: 2 ** 20 })).status).toBe(204);
  });

  it("records a report sent again under its id once, and refuses an id that is no id", async () => {
    const before = await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" });
    const steps = [{ step: 0, t_wait: 0.1 }, { step: 1, t_wait: 0.2 }];
    for (let i = 0; i < 3; i++) expect((await report(steps, { report: "0123abcd-report" })).status).toBe(204);
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" })).toBe(before + 2);
    expect((await report(steps, { report: "another" })).status).toBe(204); // another id: counted
    expect((await report(steps)).status).toBe(204); // no id (another client): counted every time
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" })).toBe(before + 6);
    for (const id of ["with space", "", "x".repeat(65), 42]) {
      const res = await report(steps, { report: id });
      expect(res.status, JSON.stringify(id)).toBe(400);
      expect((await res.json()).message).toMatch(/^Invalid telemetry "report": expected an id of 1 to 64 letters, digits/);
    }
  });

  it("forgets a report's id after a minute: the same id then counts again (a bounded memory, not a growing one)", async () => {
    let clock = 0;
    const timed = await startServer(ws, [...(await datasetFlags(ws, "d", REG)), "--cache-dir", `${ws.dir}/c-ids`], { now: () => clock });
    try {
      const post = () => fetch(`${timed.url}/v1/telemetry`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ dataset: "d", rank: 0, world: 1, micro_batch: 1, report: "aged", steps: [{ step: 0, t_wait: 0.1 }] }),
      });
      const waits = () => timed.metric("rackfeed_t_wait_seconds_count", { dataset: "d" });
      expect((await post()).status).toBe(204);
      clock += 59_000;
      expect((await post()).status).toBe(204); // within the minute: a retry, not counted
      expect(await waits()).toBe(1);
      clock += 2_000;
      expect((await post()).status).toBe(204); // past it: a report of its own
      expect(await waits()).toBe(2);
    } finally {
      await timed.close();
    }
  });

  it("refuses a step that is negative, not an integer or missing with a 400 naming the entry, and records nothing of the report", async () => {
    const before = await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" });
    for (const step of [-1, 1.5, "3", null, undefined]) {
      const res = await report([{ step: 0, t_wait: 0.1 }, { step, t_wait: 0.1 }]);
      expect(res.status, String(step)).toBe(400);
      expect((await res.json()).message, String(step)).toMatch(/^Invalid telemetry "steps\[1\]\.step": expected an integer from 0 to 9007199254740991, received /);
    }
    expect(await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" })).toBe(before);
  });
});
