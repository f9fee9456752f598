import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { ROOT } from "../helpers/spawn.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

/** Debian's python3 with python3-msgpack (.ci/run installs it); a missing one fails, never skips. */
const PYTHON = process.env.RACKFEED_PYTHON ?? "/usr/bin/python3";
const CONSUMER = join(ROOT, "test/shm/python/shm_consumer.py");
const TOKEN = "read-token-for-python-tests";
const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 64, seed: 9, split: "100,0,0", split_index: 0, num_samples: 5000 };
let ws: Workspace;
let rf: RunningServer;
let socketPath: string;
let shmDir: string;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 3000, 20, 300);
  shmDir = join(ws.dir, "shm");
  rf = await startServer(ws, [...(await datasetFlags(ws, "d", REG)), "--block-bytes", "4KiB", "--memory-bytes", "1MiB", "--shm-dir", shmDir, "--read-token", TOKEN]);
  socketPath = (await (await fetch(`${rf.url}/v1/shm`, { headers: { authorization: `Bearer ${TOKEN}` } })).json()).socket;
});
afterAll(async () => {
  await rf?.close();
  await ws?.remove();
});

interface PyBatch {
  step: number;
  slot: number;
  generation: number;
  length: number;
  first_sample: number;
  cache: number;
  sha256: string;
}

async function runConsumer(args: string[]): Promise<{ batches: PyBatch[]; end: { end: number; waits: number; timed: number; stopped: boolean } }> {
  const { stdout } = await promisify(execFile)(PYTHON, [CONSUMER, socketPath, ...args], { timeout: 60_000, maxBuffer: 64 * 2 ** 20 });
  const lines = stdout.trim().split("\n").map((l) => JSON.parse(l));
  return { batches: lines.slice(0, -1), end: lines[lines.length - 1] };
}

async function httpBatchHash(step: number, rank: number, world: number, mb: number): Promise<string> {
  const res = await fetch(`${rf.url}/v1/datasets/d/batches/${step}?rank=${rank}&world=${world}&micro_batch=${mb}`, { headers: { authorization: `Bearer ${TOKEN}` } });
  expect(res.status).toBe(200);
  return createHash("sha256").update(new Uint8Array(await res.arrayBuffer())).digest("hex");
}

describe("a Python client written from the README's protocol section", () => {
  it.each([
    ["told of every batch (notify all)", "all", [] as string[]],
    ["polling slot headers (notify wait)", "wait", [] as string[]],
    ["polling, reading slowly (the server waits for its releases)", "wait", ["--hold-ms", "2"]],
  ])("reads batches byte-identical to HTTP, in order, with no gap: %s", async (_, notify, extra) => {
    const [rank, world, mb, start, end] = [1, 2, 3, 5, extra.length ? 45 : 205];
    const { batches, end: last } = await runConsumer(["d", String(rank), String(world), String(mb), String(start), String(end), notify, TOKEN, ...extra]);
    expect(batches.map((b) => b.step)).toEqual(Array.from({ length: end - start }, (_, i) => start + i));
    expect(last.end).toBe(end);
    if (notify === "all") expect(last.waits).toBe(0);
    for (const b of batches) {
      expect(b.generation).toBe(b.step - start + 1);
      expect(b.first_sample).toBe((b.step * world + rank) * mb);
      expect([0, 1, 2]).toContain(b.cache);
      expect(b.sha256, `step ${b.step}`).toBe(await httpBatchHash(b.step, rank, world, mb));
    }
    // The connection is gone, and so is its ring.
    await expect.poll(() => readdirSync(shmDir).filter((n) => n.endsWith(".ring")).length, { timeout: 15_000 }).toBe(0);
  }, 90_000);

  it("leaves early with stop (a trainer's break) and its ring is kept for the next consumer, whose batches are its own", async () => {
    const spares = () => new Map(readdirSync(shmDir).filter((n) => n.endsWith(".spare")).map((n) => [statSync(join(shmDir, n)).ino, n]));
    const before = spares(); // those of the tests before, of smaller slots
    // Micro-batch 40: 5 200-byte batches, in 8 KiB slots that no ring before had. Their blocks
    // warmed first, and read slowly: the server has published the slots after the fifth by then.
    for (let step = 0; step < 30; step++) await httpBatchHash(step, 0, 1, 40);
    const first = await runConsumer(["d", "0", "1", "40", "0", "100", "wait", TOKEN, "--stop-after", "5", "--hold-ms", "20"]);
    expect(first.batches.map((b) => b.step)).toEqual([0, 1, 2, 3, 4]);
    expect(first.end.stopped).toBe(true);
    const ours = () => [...spares().keys()].filter((ino) => !before.has(ino));
    await expect.poll(() => ours().length, { timeout: 15_000 }).toBe(1);
    const inode = ours()[0];
    const next = await runConsumer(["d", "0", "1", "40", "40", "60", "all", TOKEN]);
    expect(next.batches.map((b) => b.step)).toEqual(Array.from({ length: 20 }, (_, i) => 40 + i));
    for (const b of next.batches) expect(b.sha256, `step ${b.step}`).toBe(await httpBatchHash(b.step, 0, 1, 40));
    // The next consumer read from that ring (no other one was made), which is kept again.
    await expect.poll(() => ours(), { timeout: 15_000 }).toEqual([inode]);
  }, 90_000);

  it("sends its steps' t_wait in timings messages (float64 bins packed by Python), which the server counts", async () => {
    const before = await rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" });
    const [start, end] = [0, 150];
    const { batches, end: last } = await runConsumer(["d", "0", "1", "2", String(start), String(end), "wait", TOKEN, "--timings"]);
    expect(batches).toHaveLength(end - start);
    expect(last.timed).toBe(end - start);
    // The last report leaves with the client's close: on a loaded box (CI runs test files side by
    // side on two cores) the server may take more than expect.poll's default second to read it.
    await expect.poll(() => rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" }), { timeout: 15_000 }).toBe(before + end - start);
    expect(await rf.metric("rackfeed_t_compute_seconds_count", { dataset: "d" })).toBe(0);
  }, 90_000);
});
