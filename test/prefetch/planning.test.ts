import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
import type { ObjectInfo } from "../../src/origin/origin.ts";
import { makeWorkspace, patternBytes, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { putSyntheticDataset } from "../helpers/token-data.ts";

const ADMIN = "admin-token-for-tests";
const auth = { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" };
let ws: Workspace;
const servers: RunningServer[] = [];

beforeEach(async () => {
  ws = await makeWorkspace();
});
afterEach(async () => {
  for (const s of servers.splice(0)) await s.close();
  await ws.remove();
});

/** An fs origin whose stats take `delayMs` each (a far object store), counting them and reads. */
class SlowStatOrigin extends FsOrigin {
  stats = 0;
  reads = 0;
  constructor(root: string, readonly delayMs: number) {
    super({ name: "data", root });
  }
  override async stat(key: string): Promise<ObjectInfo> {
    this.stats++;
    await new Promise((r) => setTimeout(r, this.delayMs));
    return await super.stat(key);
  }
  override async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    this.reads++;
    return await super.read(key, info, offset, dest);
  }
}

describe("prefetch planning", () => {
  it("answers a job whose plan takes long at once, as queued, and can cancel it before it reads anything", async () => {
    for (let i = 0; i < 120; i++) await ws.put(`many/o${i}.bin`, patternBytes(1000, i));
    const origin = new SlowStatOrigin(ws.origin, 150);
    const rf = await startServer(ws, ["--admin-token", ADMIN, "--origin-concurrency", "2", "--metadata-ttl", "0"], { makeOrigin: () => origin });
    servers.push(rf);
    // 120 stats of 150 ms, 2 at a time: ~9 s of planning, far beyond the 2 s the POST waits.
    const t0 = performance.now();
    const res = await fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify({ objects: ["data/many/"] }) });
    expect(res.status).toBe(202);
    expect(performance.now() - t0).toBeLessThan(8000);
    const job = await res.json();
    expect(job.state).toBe("queued");
    expect(job.blocksTotal).toBe(0); // not planned yet
    const cancelled = await (await fetch(`${rf.url}/prefetch/${job.id}`, { method: "DELETE", headers: auth })).json();
    expect(cancelled.state).toBe("cancelled");
    // Stats already queued at the origin finish (at most 32); no new one starts, nothing is read.
    let seen = -1;
    await waitFor(async () => {
      const now = origin.stats;
      const stable = now === seen;
      seen = now;
      if (!stable) await new Promise((r) => setTimeout(r, 400));
      return stable;
    }, "stats to stop", 15_000);
    expect(origin.stats).toBeLessThan(120);
    expect(origin.reads).toBe(0);
    expect((await (await fetch(`${rf.url}/prefetch/${job.id}`, { headers: auth })).json()).state).toBe("cancelled");
  });

  it("keeps a job cancelled while its short plan runs cancelled: the POST answers it so, nothing is read", async () => {
    await ws.put("one/o.bin", patternBytes(5000, 1));
    const origin = new SlowStatOrigin(ws.origin, 800);
    const rf = await startServer(ws, ["--admin-token", ADMIN, "--metadata-ttl", "0"], { makeOrigin: () => origin });
    servers.push(rf);
    const post = fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify({ objects: ["data/one/"] }) });
    let jobs: { id: string }[] = [];
    await waitFor(async () => {
      jobs = (await (await fetch(`${rf.url}/v1/status`)).json()).prefetch;
      return jobs.length === 1;
    }, "the job to be listed while it plans");
    const del = await (await fetch(`${rf.url}/prefetch/${jobs[0].id}`, { method: "DELETE", headers: auth })).json();
    expect(del.state).toBe("cancelled");
    const res = await post;
    expect(res.status).toBe(202);
    expect((await res.json()).state).toBe("cancelled");
    await new Promise((r) => setTimeout(r, 300));
    expect((await (await fetch(`${rf.url}/prefetch/${jobs[0].id}`, { headers: auth })).json()).state).toBe("cancelled");
    expect(origin.reads).toBe(0);
  });

  it("runs a job planned in the background to the end, with its totals filled in", async () => {
    for (let i = 0; i < 40; i++) await ws.put(`some/o${i}.bin`, patternBytes(3000, i));
    const origin = new SlowStatOrigin(ws.origin, 120);
    const rf = await startServer(ws, ["--admin-token", ADMIN, "--origin-concurrency", "2", "--block-bytes", "4KiB", "--metadata-ttl", "0"], { makeOrigin: () => origin });
    servers.push(rf);
    const job = await (await fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify({ objects: ["data/some/"] }) })).json();
    expect(job.state).toBe("queued"); // 40 × 120 ms / 2 = 2.4 s of planning
    let last: Record<string, unknown> = {};
    await waitFor(async () => {
      last = await (await fetch(`${rf.url}/prefetch/${job.id}`, { headers: auth })).json();
      return last.state === "done" || last.state === "failed";
    }, "the job to end", 20_000);
    expect(last).toMatchObject({ state: "done", objectsDone: 40, objectsTotal: 40, blocksTotal: 40, blocksDone: 40, bytesTotal: 120_000 });
  });

  it("answers 503 with Retry-After while 256 jobs are unfinished, and takes jobs again once they end", async () => {
    await ws.put("one/o.bin", patternBytes(5000, 1));
    // Every stat waits for the gate: each job stays planning (unfinished) until cancelled.
    let open = () => {};
    const gate = new Promise<void>((r) => (open = r));
    class GatedOrigin extends SlowStatOrigin {
      override async stat(key: string): Promise<ObjectInfo> {
        await gate;
        return await super.stat(key);
      }
    }
    const origin = new GatedOrigin(ws.origin, 0);
    const rf = await startServer(ws, ["--admin-token", ADMIN, "--metadata-ttl", "0"], { makeOrigin: () => origin });
    servers.push(rf);
    const post = () => fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify({ objects: ["data/one/"] }) });
    const queued = await Promise.all(Array.from({ length: 256 }, async () => {
      const res = await post();
      expect(res.status).toBe(202);
      return (await res.json()).id as string;
    }));
    const full = await post();
    expect(full.status).toBe(503);
    expect(full.headers.get("retry-after")).toBe("1");
    expect((await full.json()).message).toMatch(/Too many prefetch jobs running \(256\)/);
    for (const id of queued) expect((await fetch(`${rf.url}/prefetch/${id}`, { method: "DELETE", headers: auth })).status).toBe(200);
    open();
    const again = await post();
    expect(again.status).toBe(202);
    const { id } = await again.json();
    await waitFor(async () => (await (await fetch(`${rf.url}/prefetch/${id}`, { headers: auth })).json()).state === "done", "the new job to end", 10_000);
  });

  it("refuses steps beyond the dataset with 400 naming its steps, and prefetches up to its end", async () => {
    await putSyntheticDataset(ws, "tok", 200, 50, 400, 2);
    const rf = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "4KiB"]);
    servers.push(rf);
    const reg = { sources: [{ prefix: "data/tok" }], seq_length: 64, seed: 1, split: "100,0,0", split_index: 0, num_samples: 800 };
    expect((await fetch(`${rf.url}/v1/datasets/d`, { method: "PUT", headers: auth, body: JSON.stringify(reg) })).status).toBe(201);
    const beyond = await fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify({ dataset: "d", steps: [100, 200], micro_batch: 8 }) });
    expect(beyond.status).toBe(400);
    expect((await beyond.json()).message).toMatch(/dataset "d" has steps 0-99 with world 1 and micro_batch 8/);
    const tail = await fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify({ dataset: "d", steps: [90, 1e12], micro_batch: 8 }) });
    expect(tail.status).toBe(202);
    const cut = await tail.json();
    expect(cut.blocksTotal).toBeGreaterThan(0);
    expect(cut.what).toBe("dataset d steps 90-99 (rank 0, world 1, micro_batch 8); asked for steps 90-999999999999, the dataset's last is 99");
  });

  it("says the dataset has no full step when world × micro_batch exceeds its samples, and bounds world and micro_batch as the batches route does", async () => {
    await putSyntheticDataset(ws, "tok", 200, 50, 400, 2);
    const rf = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "4KiB"]);
    servers.push(rf);
    const reg = { sources: [{ prefix: "data/tok" }], seq_length: 64, seed: 1, split: "100,0,0", split_index: 0, num_samples: 800 };
    expect((await fetch(`${rf.url}/v1/datasets/d`, { method: "PUT", headers: auth, body: JSON.stringify(reg) })).status).toBe(201);
    const post = (body: unknown) => fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify(body) });
    for (const body of [{ micro_batch: 1000 }, { world: 1000, micro_batch: 1 }, { world: 1 << 20, micro_batch: 1 << 20 }]) {
      const res = await post({ dataset: "d", steps: [0, 2], ...body });
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect((await res.json()).message, JSON.stringify(body)).toMatch(/dataset "d" has no full step with world \d+ and micro_batch \d+ \(\d+ samples\)/);
    }
    for (const [body, msg] of [
      [{ micro_batch: 1e9 }, /"micro_batch": expected an integer from 1 to 1048576, received 1000000000/],
      [{ micro_batch: 1, world: 1e9 }, /"world": expected an integer from 1 to 1048576, received 1000000000/],
      [{ micro_batch: 2 ** 20 + 1 }, /"micro_batch": expected an integer from 1 to 1048576/],
      [{ micro_batch: 1, world: 4, rank: 4 }, /"rank": 4 is not below "world" 4/],
    ] as const) {
      const res = await post({ dataset: "d", steps: [0, 2], ...body });
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect((await res.json()).message, JSON.stringify(body)).toMatch(msg);
    }
    expect((await post({ dataset: "d", steps: [0, 2], world: 4, rank: 3, micro_batch: 8 })).status).toBe(202);
  });

  it("refuses a body with both \"objects\" and \"dataset\" with 400 saying to give one, instead of warming the objects", async () => {
    await ws.put("p/a.bin", patternBytes(1000, 1));
    const rf = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "4KiB"]);
    servers.push(rf);
    const res = await fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify({ objects: ["data/p/"], dataset: "d", steps: [0, 1], micro_batch: 1 }) });
    expect(res.status).toBe(400);
    expect((await res.json()).message).toMatch(/both "objects" and "dataset"; give one of them/);
    expect((await (await fetch(`${rf.url}/prefetch`, { headers: auth })).json()).jobs).toEqual([]);
  });
});
