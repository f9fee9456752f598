import { rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
import type { ObjectInfo } from "../../src/origin/origin.ts";
import type { ServerEnv } from "../../src/server.ts";
import { makeWorkspace, patternBytes, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { putSyntheticDataset } from "../helpers/token-data.ts";

const ADMIN = "admin-token-for-tests";
const KiB = 1024;
let ws: Workspace;
const servers: RunningServer[] = [];

beforeEach(async () => {
  ws = await makeWorkspace();
});
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
  await ws.remove();
});

/** An fs origin that takes `delayMs` per read and counts reads. */
class SlowOrigin extends FsOrigin {
  reads = 0;
  constructor(root: string, readonly delayMs: number) {
    super({ name: "data", root });
  }
  override async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    this.reads++;
    await new Promise((r) => setTimeout(r, this.delayMs));
    return await super.read(key, info, offset, dest);
  }
}

async function start(args: string[] = [], origin?: SlowOrigin, env: Partial<ServerEnv> = {}): Promise<RunningServer> {
  const s = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "16KiB", ...args], { ...(origin ? { makeOrigin: () => origin } : {}), ...env });
  servers.push(s);
  return s;
}

const auth = { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" };

async function submit(rf: RunningServer, body: unknown): Promise<Response> {
  return await fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify(body) });
}

async function waitDone(rf: RunningServer, id: string): Promise<Record<string, unknown>> {
  for (let i = 0; i < 500; i++) {
    const p = await (await fetch(`${rf.url}/prefetch/${id}`, { headers: auth })).json();
    if (["done", "failed", "cancelled"].includes(p.state)) return p;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error(`prefetch ${id} did not finish`);
}

describe("POST /prefetch by object prefix", () => {
  it("fills exactly the blocks of the listed objects into the disk tier, with progress that adds up", async () => {
    const sizes = { "p/a.bin": 10 * KiB, "p/b.bin": 64 * KiB + 1, "p/sub/c.bin": 40 * KiB, "q/other.bin": 50 * KiB };
    for (const [k, n] of Object.entries(sizes)) await ws.put(k, patternBytes(n, n));
    const rf = await start();
    const res = await submit(rf, { objects: ["data/p/"], tier: "disk" });
    expect(res.status).toBe(202);
    const job = await res.json();
    expect(res.headers.get("location")).toBe(`/prefetch/${job.id}`);
    const done = await waitDone(rf, job.id);
    const blocks = 1 + 5 + 3; // ceil(size / 16 KiB) of a, b, c; q/ is not under the prefix
    expect(done).toMatchObject({
      state: "done",
      objectsDone: 3,
      objectsTotal: 3,
      blocksDone: blocks,
      blocksTotal: blocks,
      blocksCached: 0,
      bytesDone: 10 * KiB + 64 * KiB + 1 + 40 * KiB,
      bytesTotal: 10 * KiB + 64 * KiB + 1 + 40 * KiB,
      etaSeconds: 0,
      error: null,
    });
    expect(await rf.metric("rackfeed_cache_blocks", { tier: "disk" })).toBe(blocks);
    expect(await rf.metric("rackfeed_origin_bytes_total", { origin: "data" })).toBe(114 * KiB + 1);

    // A second run finds everything cached and reads nothing.
    const again = await waitDone(rf, (await (await submit(rf, { objects: ["data/p/"] })).json()).id);
    expect(again).toMatchObject({ state: "done", blocksCached: blocks });
    expect(await rf.metric("rackfeed_origin_bytes_total", { origin: "data" })).toBe(114 * KiB + 1);
  });

  it("counts empty objects as done (they have no block to fetch)", async () => {
    await ws.put("e/empty.bin", new Uint8Array(0));
    await ws.put("e/full.bin", patternBytes(20 * KiB, 4));
    const rf = await start();
    const done = await waitDone(rf, (await (await submit(rf, { objects: ["data/e/"] })).json()).id);
    expect(done).toMatchObject({ state: "done", objectsDone: 2, objectsTotal: 2, blocksDone: 2, blocksTotal: 2 });
  });

  it("refuses up front a prefetch larger than the tier, naming both sizes", async () => {
    await ws.put("big/x.bin", new Uint8Array(3 * 1024 * KiB));
    const rf = await start(["--memory-bytes", "2MiB"]);
    const res = await submit(rf, { objects: ["data/big/"], tier: "memory" });
    expect(res.status).toBe(400);
    expect((await res.json()).message).toMatch(/needs 3145728 bytes, more than the memory tier holds \(2097152 bytes\); it would evict its own blocks\. Prefetch less, or into the disk tier \("tier": "disk"\)$/);
  });

  it("fails a --tier disk job, naming the block, when the NVMe tier cannot store blocks", async () => {
    for (let i = 0; i < 3; i++) await ws.put(`w/${i}.bin`, patternBytes(32 * KiB, i + 7));
    const rf = await start();
    // Every block write now fails, as on a full or read-only disk: its temporary directory is a file.
    await rm(join(ws.cache, "tmp"), { recursive: true, force: true });
    await writeFile(join(ws.cache, "tmp"), "not a directory");
    const res = await submit(rf, { objects: ["data/w/"], tier: "disk" });
    expect(res.status).toBe(202);
    const done = await waitDone(rf, (await res.json()).id);
    expect(done.state).toBe("failed");
    expect(done.error).toMatch(/^Cannot store block \d+ of "w\/\d\.bin" in the NVMe tier/);
    expect(await rf.metric("rackfeed_cache_blocks", { tier: "disk" })).toBe(0);
    expect(await rf.metric("rackfeed_disk_writes_total", { result: "error" })).toBeGreaterThan(0);
  });

  it("refuses bad requests with 400 naming the field, and unknown jobs with 404", async () => {
    const rf = await start();
    for (const [body, msg] of [
      [{}, /"objects" or "dataset"/],
      [{ objects: [] }, /objects/],
      [{ objects: ["nowhere/x"] }, /unknown origin "nowhere"/],
      [{ objects: ["data/none/"] }, /found no objects/],
      [{ objects: ["data/"], tier: "gpu" }, /tier/],
      [{ dataset: "d", steps: [5, 2], micro_batch: 1 }, /steps/],
    ] as const) {
      const res = await submit(rf, body);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect((await res.json()).message).toMatch(msg);
    }
    expect((await fetch(`${rf.url}/prefetch/nope`, { headers: auth })).status).toBe(404);
  });

  it("needs the admin token", async () => {
    const rf = await start();
    expect((await fetch(`${rf.url}/prefetch`, { method: "POST", body: "{}" })).status).toBe(401);
    expect((await fetch(`${rf.url}/prefetch`)).status).toBe(401);
    const open = await startServer(ws, ["--cache-dir", `${ws.dir}/cache-open`]); // one cache directory per server
    servers.push(open);
    expect((await fetch(`${open.url}/prefetch`, { method: "POST", headers: auth, body: "{}" })).status).toBe(403);
  });
});

describe("prefetch jobs", () => {
  it("stop reading from the origin when cancelled", async () => {
    await ws.put("slow/x.bin", new Uint8Array(64 * 16 * KiB)); // 64 blocks
    const origin = new SlowOrigin(ws.origin, 30);
    const rf = await start(["--origin-concurrency", "4"], origin);
    const job = await (await submit(rf, { objects: ["data/slow/"] })).json();
    await new Promise((r) => setTimeout(r, 100));
    const cancelled = await (await fetch(`${rf.url}/prefetch/${job.id}`, { method: "DELETE", headers: auth })).json();
    expect(cancelled.state).toBe("cancelled");
    await new Promise((r) => setTimeout(r, 100)); // reads in flight finish
    const after = origin.reads;
    await new Promise((r) => setTimeout(r, 300));
    expect(origin.reads).toBe(after);
    expect(after).toBeLessThan(64);
    expect((await (await fetch(`${rf.url}/prefetch/${job.id}`, { headers: auth })).json()).state).toBe("cancelled");
  });

  it("stop reading from the origin when cancelled, their queued reads of a block's parts included", async () => {
    await ws.put("slow/x.bin", new Uint8Array(32 * 64 * KiB)); // 32 blocks of 16 parts
    const origin = new SlowOrigin(ws.origin, 30);
    const rf = await start(["--block-bytes", "64KiB", "--origin-concurrency", "8", "--part-bytes", "4KiB", "--part-sizing", "fixed"], origin);
    const job = await (await submit(rf, { objects: ["data/slow/"] })).json();
    await new Promise((r) => setTimeout(r, 100));
    // 4 blocks at a time (half the slots), 6 slots for background reads: ~58 parts wait, ~300 ms of reads.
    expect(await rf.metric("rackfeed_origin_queued_requests", { origin: "data" })).toBeGreaterThan(30);
    await fetch(`${rf.url}/prefetch/${job.id}`, { method: "DELETE", headers: auth });
    await new Promise((r) => setTimeout(r, 100)); // reads in flight finish
    const after = origin.reads;
    await new Promise((r) => setTimeout(r, 300)); // the queued parts would take 300 ms and more
    expect(origin.reads).toBe(after);
    expect(await rf.metric("rackfeed_origin_queued_requests", { origin: "data" })).toBe(0);
    expect(await rf.metric("rackfeed_cache_fill_errors_total")).toBe(0); // given up, not failed
  });

  it("warns of no listener leak when many blocks of a job wait at once (16 workers on one cancel signal)", async () => {
    await ws.put("many/x.bin", new Uint8Array(64 * 16 * KiB));
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on("warning", onWarning);
    try {
      const rf = await start(["--origin-concurrency", "32"], new SlowOrigin(ws.origin, 5));
      const job = await (await submit(rf, { objects: ["data/many/"] })).json();
      expect((await waitDone(rf, job.id)).state).toBe("done");
      await new Promise((r) => setTimeout(r, 50)); // warnings are emitted on the next tick
    } finally {
      process.off("warning", onWarning);
    }
    expect(warnings.filter((w) => /MaxListeners/.test(w))).toEqual([]);
  });

  it("streams progress as Server-Sent Events that parse, end with the final state, and never go backwards", async () => {
    await ws.put("sse/x.bin", new Uint8Array(20 * 16 * KiB));
    const rf = await start([], new SlowOrigin(ws.origin, 5));
    const job = await (await submit(rf, { objects: ["data/sse/"] })).json();
    const res = await fetch(`${rf.url}/prefetch/${job.id}/events`, { headers: auth });
    expect(res.headers.get("content-type")).toMatch(/text\/event-stream/);
    const text = await res.text();
    const events = text.split("\n\n").filter((e) => e.trim()).map((e) => {
      expect(e).toMatch(/^event: progress\ndata: /);
      return JSON.parse(e.split("\n").find((l) => l.startsWith("data: "))!.slice(6));
    });
    expect(events.length).toBeGreaterThan(1);
    expect(events.at(-1)).toMatchObject({ state: "done", bytesDone: 20 * 16 * KiB, bytesTotal: 20 * 16 * KiB });
    for (let i = 1; i < events.length; i++) expect(events[i].bytesDone).toBeGreaterThanOrEqual(events[i - 1].bytesDone);
  });

  it("sends a comment line while a job has no progress to tell, so that idle timeouts keep the stream; clients skip it", async () => {
    await ws.put("quiet/x.bin", new Uint8Array(2 * 16 * KiB));
    // Each block read takes 400 ms: the stream has nothing to say for longer than its keep-alive time.
    const rf = await start([], new SlowOrigin(ws.origin, 400), { sseKeepAliveMs: 50 });
    const job = await (await submit(rf, { objects: ["data/quiet/"] })).json();
    const text = await (await fetch(`${rf.url}/prefetch/${job.id}/events`, { headers: auth })).text();
    const blocks = text.split("\n\n").filter((e) => e.trim());
    expect(blocks.filter((e) => e === ": keep-alive").length).toBeGreaterThanOrEqual(3);
    const events = blocks.filter((e) => e !== ": keep-alive").map((e) => JSON.parse(e.split("\n").find((l) => l.startsWith("data: "))!.slice(6)));
    expect(events.at(-1)).toMatchObject({ state: "done", bytesDone: 2 * 16 * KiB });
  });

  it("gives way to trainers at a full origin queue and still finishes: no trainer read is refused, no job fails", async () => {
    for (let i = 0; i < 4; i++) await ws.put(`warm/o${i}.bin`, patternBytes(8 * 16 * KiB, i));
    await ws.put("fg/t.bin", patternBytes(8 * 16 * KiB, 9));
    // 16 KiB blocks read in 4 KiB parts, 2 reads at a time, 8 waiting at most: each job alone queues 32 reads.
    const rf = await start(["--origin-concurrency", "2", "--origin-queue", "8", "--part-bytes", "4KiB", "--memory-bytes", "8MiB"], new SlowOrigin(ws.origin, 15));
    const jobs = await Promise.all([0, 1, 2, 3].map(async (i) => (await (await submit(rf, { objects: [`data/warm/o${i}.bin`], tier: "memory" })).json()).id as string));
    const statuses: number[] = [];
    for (let round = 0; round < 4; round++) {
      // Two trainer reads of a block each: 8 parts, what the queue holds when background work gives way.
      const got = await Promise.all([0, 1].map(async (j) => {
        const b = (round * 2 + j) * 16 * KiB;
        const res = await fetch(`${rf.url}/v1/objects/data/fg/t.bin`, { headers: { range: `bytes=${b}-${b + 16 * KiB - 1}` } });
        await res.arrayBuffer();
        return res.status;
      }));
      statuses.push(...got);
    }
    expect(statuses).toEqual(Array(8).fill(206));
    for (const id of jobs) expect(await waitDone(rf, id)).toMatchObject({ state: "done", blocksDone: 8 });
  }, 60_000);

  it("marks the blocks it finds already cached as used, so its own fills evict other blocks, not them", async () => {
    await ws.put("p/a.bin", patternBytes(512 * KiB, 1));
    await ws.put("p/other.bin", patternBytes(768 * KiB, 2));
    const rf = await start(["--block-bytes", "64KiB", "--memory-bytes", "1MiB", "--read-ahead-seconds", "0", "--memory-eviction", "lru"]);
    const read = async (key: string, start: number, end: number) => {
      const res = await fetch(`${rf.url}/v1/objects/data/${key}`, { headers: { range: `bytes=${start}-${end - 1}` } });
      expect(res.status).toBe(206);
      await res.arrayBuffer();
    };
    await read("p/a.bin", 0, 256 * KiB); // a's first 4 blocks: the oldest in the tier
    await read("p/other.bin", 0, 768 * KiB); // 12 more: the tier (16 blocks) is full
    const job = await (await submit(rf, { objects: ["data/p/a.bin"], tier: "memory" })).json();
    const done = await waitDone(rf, job.id);
    expect(done).toMatchObject({ state: "done", blocksDone: 8, blocksCached: 4 });
    const hits = () => rf.metric("rackfeed_cache_hits_total", { tier: "memory" });
    const before = await hits();
    await read("p/a.bin", 0, 512 * KiB); // every block of the job: in memory (not on disk, nor at the origin)
    expect(await hits()).toBe(before + 8);
  });

  it("plans a step range of millions of samples in slices: the event loop is never held for long", async () => {
    await putSyntheticDataset(ws, "tok/d", 2000, 100, 1500);
    const rf = await start(["--read-ahead-seconds", "0", "--memory-bytes", "64MiB"]);
    const reg = await fetch(`${rf.url}/v1/datasets/big`, {
      method: "PUT",
      headers: auth,
      body: JSON.stringify({ sources: [{ prefix: "data/tok/d" }], seq_length: 64, seed: 3, split: "100,0,0", split_index: 0, num_samples: 3_000_000 }),
    });
    expect(reg.status).toBe(201);
    // The server runs in this process: a timer here fires late by as long as planning holds the loop.
    let last = performance.now();
    let worst = 0;
    const tick = setInterval(() => {
      const now = performance.now();
      worst = Math.max(worst, now - last);
      last = now;
    }, 2);
    try {
      // 257 steps of 11 000 samples: 2.8 M samples to plan (a check every 256 steps held the loop for a second and more).
      const job = await (await submit(rf, { dataset: "big", steps: [0, 257], rank: 0, world: 1, micro_batch: 11_000, tier: "memory" })).json();
      expect((await waitDone(rf, job.id)).state).toBe("done");
    } finally {
      clearInterval(tick);
    }
    expect(worst).toBeLessThan(400);
  }, 60_000);

  it("by dataset steps fills exactly the blocks those batches need", async () => {
    await putSyntheticDataset(ws, "tok/d", 2000, 100, 1500);
    const rf = await start(["--read-ahead-seconds", "0", "--memory-bytes", "64MiB"]);
    const reg = await fetch(`${rf.url}/v1/datasets/d`, {
      method: "PUT",
      headers: auth,
      body: JSON.stringify({ sources: [{ prefix: "data/tok/d" }], seq_length: 256, seed: 3, split: "100,0,0", split_index: 0, num_samples: 2000 }),
    });
    expect(reg.status).toBe(201);
    const readsBefore = await rf.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" });
    const job = await (await submit(rf, { dataset: "d", steps: [3, 8], rank: 1, world: 2, micro_batch: 4, tier: "memory" })).json();
    const done = await waitDone(rf, job.id);
    expect(done.state).toBe("done");
    const reads = (await rf.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" })) - readsBefore;
    expect(reads).toBe(done.blocksTotal); // one read per block (part = block here)
    for (let step = 3; step < 8; step++) {
      const res = await fetch(`${rf.url}/v1/datasets/d/batches/${step}?rank=1&world=2&micro_batch=4`);
      await res.arrayBuffer();
      expect(res.headers.get("x-rackfeed-cache"), `step ${step}`).toBe("hit");
    }
    const other = await fetch(`${rf.url}/v1/datasets/d/batches/9?rank=1&world=2&micro_batch=4`);
    await other.arrayBuffer();
    expect(other.headers.get("x-rackfeed-cache")).toBe("miss"); // not part of the job
    expect(await rf.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" })).toBeGreaterThan(readsBefore + reads);
  });
});
