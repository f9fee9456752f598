import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { buildFromIndexFiles, type IndexBuildInput } from "../../src/dataset/mod.ts";
import { workerIndexBuilder } from "../../src/runtime/index-builder.ts";
import { expectSameBytes, makeWorkspace, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { putSyntheticDataset } from "../helpers/token-data.ts";

const ADMIN = "admin-token-for-tests";
let ws: Workspace;
const servers: RunningServer[] = [];

beforeEach(async () => {
  ws = await makeWorkspace();
});
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
  await ws.remove();
});

async function register(rf: RunningServer, name: string, body: unknown): Promise<void> {
  const res = await fetch(`${rf.url}/v1/datasets/${name}`, {
    method: "PUT",
    headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN}` },
    body: JSON.stringify(body),
  });
  expect(res.status, await res.clone().text()).toBe(201);
}

async function builds(rf: RunningServer): Promise<Record<string, number>> {
  const text = await (await fetch(`${rf.url}/metrics`)).text();
  return Object.fromEntries([...text.matchAll(/^rackfeed_dataset_builds_total\{thread="(\w+)"\} (\d+)/gm)].map((m) => [m[1], Number(m[2])]));
}

describe("dataset builds", () => {
  it("builds a large dataset on a worker thread and serves the bytes of one built on the event loop", async () => {
    await putSyntheticDataset(ws, "big", 20_000, 20, 400, 3); // ~80 KiB of .idx
    await putSyntheticDataset(ws, "small", 50, 20, 400, 4);
    const large = { sources: [{ prefix: "data/big" }], seq_length: 128, seed: 11, split: "99,1,0", split_index: 0, num_samples: 100_000 };
    const small = { sources: [{ prefix: "data/small" }], seq_length: 128, seed: 11, split: "100,0,0", split_index: 0, num_samples: 50 };
    const worker = await startServer(ws, ["--admin-token", ADMIN], { buildOffThread: workerIndexBuilder("node") });
    const inline = await startServer(ws, ["--admin-token", ADMIN]);
    servers.push(worker, inline);
    await register(worker, "large", large);
    await register(worker, "small", small);
    await register(inline, "large", large);
    expect(await builds(worker)).toEqual({ event_loop: 1, worker: 1 }); // the small one stays on the event loop
    expect(await builds(inline)).toEqual({ event_loop: 1, worker: 0 });
    const describe = async (rf: RunningServer) => {
      const d = await (await fetch(`${rf.url}/v1/datasets/large`)).json();
      delete d.buildSeconds;
      return d;
    };
    expect(await describe(worker)).toEqual(await describe(inline));
    for (const step of [0, 1, 777, 3124]) {
      const path = `/v1/datasets/large/batches/${step}?rank=1&world=4&micro_batch=8`;
      const [a, b] = await Promise.all([worker, inline].map(async (rf) => {
        const res = await fetch(rf.url + path);
        expect(res.status).toBe(200);
        return new Uint8Array(await res.arrayBuffer());
      }));
      expectSameBytes(a, b);
    }
  });

  it("counts the epochs of a small corpus read with long windows as work: its document index is built on a worker too", async () => {
    await putSyntheticDataset(ws, "small", 50, 20, 400, 4); // ~10 k tokens
    const rf = await startServer(ws, ["--admin-token", ADMIN], { buildOffThread: workerIndexBuilder("node") });
    servers.push(rf);
    // 500 samples of 100 000 tokens: ~5 000 epochs of 50 documents, though its .idx and samples are a few KiB.
    await register(rf, "long", { sources: [{ prefix: "data/small" }], seq_length: 100_000, seed: 2, split: "100,0,0", split_index: 0, num_samples: 500 });
    await register(rf, "short", { sources: [{ prefix: "data/small" }], seq_length: 128, seed: 2, split: "100,0,0", split_index: 0, num_samples: 50 });
    expect(await builds(rf)).toEqual({ event_loop: 1, worker: 1 });
  });

  it("answers 409 to an overtaken registration being built on a worker (its worker is ended), and serves the later one", async () => {
    await putSyntheticDataset(ws, "huge", 200_000, 20, 400, 5); // a build of seconds on this box
    await putSyntheticDataset(ws, "small", 50, 20, 400, 4);
    const rf = await startServer(ws, ["--admin-token", ADMIN], { buildOffThread: workerIndexBuilder("node") });
    servers.push(rf);
    const put = (prefix: string, numSamples: number) =>
      fetch(`${rf.url}/v1/datasets/d`, {
        method: "PUT",
        headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN}` },
        body: JSON.stringify({ sources: [{ prefix }], seq_length: 128, seed: 1, split: "100,0,0", split_index: 0, num_samples: numSamples }),
      });
    const first = put("data/huge", 4_000_000);
    await waitFor(async () => (await builds(rf)).worker === 1, "the large build to start");
    const second = await put("data/small", 50);
    expect(second.status).toBe(201);
    const overtaken = await first;
    expect(overtaken.status).toBe(409);
    expect((await (await fetch(`${rf.url}/v1/datasets/d`)).json()).numSamples).toBe(50);
  });

  it("answers 400 naming the file for a malformed .idx built on the worker, and keeps serving", async () => {
    await putSyntheticDataset(ws, "big", 20_000, 20, 400, 3);
    const idx = await import("node:fs/promises").then((fs) => fs.readFile(`${ws.origin}/big.idx`));
    idx[20] = 0xff; // a count past the end of the file
    await ws.put("big.idx", idx);
    const rf = await startServer(ws, ["--admin-token", ADMIN], { buildOffThread: workerIndexBuilder("node") });
    servers.push(rf);
    const res = await fetch(`${rf.url}/v1/datasets/large`, {
      method: "PUT",
      headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN}` },
      body: JSON.stringify({ sources: [{ prefix: "data/big" }], seq_length: 128, seed: 1, split: "100,0,0", split_index: 0, num_samples: 100_000 }),
    });
    expect(res.status).toBe(400);
    expect((await res.json()).message).toMatch(/Cannot read index "data\/big\.idx"/);
    expect(await builds(rf)).toEqual({ event_loop: 0, worker: 1 });
    expect((await fetch(`${rf.url}/healthz`)).status).toBe(200);
  });

  it("applies registrations of one name in the order they arrived, and answers 409 to one overtaken", async () => {
    await putSyntheticDataset(ws, "big", 20_000, 20, 400, 3);
    // The large build waits on a gate, so the later registration deterministically ends first.
    let entered!: () => void;
    const buildStarted = new Promise<void>((r) => (entered = r));
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let firstSignal: AbortSignal | undefined;
    const gated = async (input: IndexBuildInput, signal?: AbortSignal) => {
      firstSignal ??= signal;
      entered();
      await gate;
      return buildFromIndexFiles(input);
    };
    const rf = await startServer(ws, ["--admin-token", ADMIN], { buildOffThread: gated });
    servers.push(rf);
    const body = (numSamples: number) => ({ sources: [{ prefix: "data/big" }], seq_length: 128, seed: 1, split: "100,0,0", split_index: 0, num_samples: numSamples });
    const put = (numSamples: number) =>
      fetch(`${rf.url}/v1/datasets/d`, {
        method: "PUT",
        headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN}` },
        body: JSON.stringify(body(numSamples)),
      });
    const first = put(100_000); // large: built off the event loop, behind the gate
    await buildStarted;
    const second = await put(1000); // small: built at once
    expect(second.status, await second.clone().text()).toBe(201);
    expect(firstSignal?.aborted).toBe(true); // the overtaken build was told to stop
    release();
    const overtaken = await first;
    expect(overtaken.status).toBe(409);
    expect((await overtaken.json()).message).toMatch(/Registration of dataset "d" was superseded by a later one/);
    expect((await (await fetch(`${rf.url}/v1/datasets/d`)).json()).numSamples).toBe(1000);
    // A registration sent after both replaces it as usual.
    expect((await put(2000)).status).toBe(200);
    expect((await (await fetch(`${rf.url}/v1/datasets/d`)).json()).numSamples).toBe(2000);
  });

  it("answers 201 to the registration that created a name and 200 to the one that replaced it, when both started before either landed", async () => {
    await putSyntheticDataset(ws, "big", 20_000, 20, 400, 3);
    // Each build waits on a gate of its own (a build that had ended when the next registration
    // arrived, and was in its last checks), so the test decides which lands first.
    const gates: { entered: Promise<void>; enter: () => void; open: Promise<void>; release: () => void }[] = [];
    const gate = () => {
      const g = {} as (typeof gates)[number];
      g.entered = new Promise<void>((r) => (g.enter = r));
      g.open = new Promise<void>((r) => (g.release = r));
      gates.push(g);
    };
    let calls = 0;
    const gated = async (input: IndexBuildInput) => {
      const g = gates[calls++];
      g.enter();
      await g.open;
      return buildFromIndexFiles(input);
    };
    const rf = await startServer(ws, ["--admin-token", ADMIN], { buildOffThread: gated });
    servers.push(rf);
    const put = (name: string, seed: number) =>
      fetch(`${rf.url}/v1/datasets/${name}`, {
        method: "PUT",
        headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN}` },
        // Large enough to be built off the event loop, through the gated builder.
        body: JSON.stringify({ sources: [{ prefix: "data/big" }], seq_length: 128, seed, split: "100,0,0", split_index: 0, num_samples: 100_000 }),
      });
    for (let round = 0; round < 4; round++) {
      const name = `new${round}`;
      gate();
      gate();
      const first = put(name, 1);
      await gates[gates.length - 2].entered;
      const second = put(name, 2);
      await gates[gates.length - 1].entered;
      // Both saw the name free when they started. Even rounds: the first lands first, and the
      // second replaces it. Odd rounds: the second lands first, and the first is overtaken (409).
      const [early, late] = round % 2 === 0 ? [0, 1] : [1, 0];
      const responses = [first, second];
      gates[gates.length - 2 + early].release();
      const earlyRes = await responses[early];
      gates[gates.length - 2 + late].release();
      const lateRes = await responses[late];
      expect(earlyRes.status, `round ${round}: ${await earlyRes.clone().text()}`).toBe(201);
      expect(lateRes.status, `round ${round}: ${await lateRes.clone().text()}`).toBe(round % 2 === 0 ? 200 : 409);
      expect((await fetch(`${rf.url}/v1/datasets/${name}`)).status).toBe(200);
    }
  });

  it("answers exactly one 201 to concurrent registrations of a new name, whatever their interleaving", async () => {
    await putSyntheticDataset(ws, "small", 50, 20, 400, 4);
    const rf = await startServer(ws, ["--admin-token", ADMIN]);
    servers.push(rf);
    const put = (name: string, seed: number) =>
      fetch(`${rf.url}/v1/datasets/${name}`, {
        method: "PUT",
        headers: { "content-type": "application/json", authorization: `Bearer ${ADMIN}` },
        body: JSON.stringify({ sources: [{ prefix: "data/small" }], seq_length: 128, seed, split: "100,0,0", split_index: 0, num_samples: 50 }),
      }).then((r) => r.status);
    for (let round = 0; round < 8; round++) {
      const statuses = (await Promise.all([put(`c${round}`, 1), put(`c${round}`, 2)])).sort();
      // The later one replaces the earlier (200), or overtakes it while it is built (409).
      expect([[200, 201], [201, 409]], `round ${round}: ${statuses}`).toContainEqual(statuses);
    }
  });
});
