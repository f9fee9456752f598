// bench/prefetch: a trainer's batch latency while a large /prefetch warm job runs, with prefetch
// reads at background priority (the default) and at normal priority, beside the same trainer
// alone (the baseline), all in one run against the same slow origin.
//
// Run: node --import tsx bench/prefetch/trainer-during-warm.ts
// Knobs: BENCH_JOBS=4 BENCH_STEPS=100 BENCH_ORIGIN_MS=10 (added latency per origin read) BENCH_WARM_OBJECTS=768

import { FsOrigin } from "../../src/origin/fs-origin.ts";
import type { ObjectInfo } from "../../src/origin/origin.ts";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../../test/helpers/rackfeed.ts";
import { syntheticDataset } from "../../test/helpers/token-data.ts";

const STEPS = Number(process.env.BENCH_STEPS ?? 100);
const ORIGIN_MS = Number(process.env.BENCH_ORIGIN_MS ?? 10);
const WARM_OBJECTS = Number(process.env.BENCH_WARM_OBJECTS ?? 768);
const JOBS = Number(process.env.BENCH_JOBS ?? 4);
const STEP_MS = 20;
const ADMIN = "bench-admin-token";

/** A filesystem origin with a fixed added latency per read: a stand-in for a remote store. */
class DelayedOrigin extends FsOrigin {
  constructor(root: string) {
    super({ name: "data", root });
  }
  override async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    await new Promise((r) => setTimeout(r, ORIGIN_MS));
    return await super.read(key, info, offset, dest);
  }
}

async function scenario(ws: Workspace, name: string, warm: "none" | "background" | "normal"): Promise<number[]> {
  const rf: RunningServer = await startServer(ws, [
    "--admin-token", ADMIN,
    "--block-bytes", "64KiB",
    "--origin-concurrency", "8",
    "--memory-bytes", "512MiB",
    "--disk-bytes", "1GiB",
    "--read-ahead-seconds", "0", // every batch goes to the origin: the contention is what we measure
    "--prefetch-priority", warm === "normal" ? "normal" : "background",
    "--cache-dir", `${ws.dir}/cache-${name}`,
  ], { makeOrigin: () => new DelayedOrigin(ws.origin) });
  const auth = { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" };
  try {
    await fetch(`${rf.url}/v1/datasets/tok`, {
      method: "PUT",
      headers: auth,
      body: JSON.stringify({ sources: [{ prefix: "data/tok/d" }], seq_length: 4096, seed: 1, split: "100,0,0", split_index: 0, num_samples: 4000 }),
    }).then((r) => r.arrayBuffer());
    const jobIds: string[] = [];
    if (warm !== "none") {
      // Several jobs (parts of the warm set), as when an operator warms several datasets: together
      // they have more workers than the origin has slots, so reads queue.
      for (let j = 0; j < JOBS; j++) {
        const half = `data/warm/p${j}-`;
        const job = await (await fetch(`${rf.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify({ objects: [half], tier: "disk" }) })).json();
        jobIds.push(job.id);
      }
      await new Promise((r) => setTimeout(r, 200)); // let the jobs fill the origin's slots
    }
    const latencies: number[] = [];
    for (let step = 0; step < STEPS; step++) {
      const t0 = performance.now();
      const res = await fetch(`${rf.url}/v1/datasets/tok/batches/${step}?rank=0&world=1&micro_batch=8`);
      await res.arrayBuffer();
      latencies.push(performance.now() - t0);
      await new Promise((r) => setTimeout(r, STEP_MS));
    }
    for (const jobId of jobIds) {
      const p = await (await fetch(`${rf.url}/prefetch/${jobId}`, { headers: auth })).json();
      if (p.state === "done") console.error(`  note: a warm job (${name}) finished before the trainer did; raise BENCH_WARM_OBJECTS`);
      await fetch(`${rf.url}/prefetch/${jobId}`, { method: "DELETE", headers: auth });
    }
    return latencies;
  } finally {
    await rf.close();
  }
}

const q = (xs: number[], p: number) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(p * s.length))];
};

const ws = await makeWorkspace();
try {
  const { idx, bin } = syntheticDataset(20000, 500, 4000, 7); // ~45 M tokens, ~90 MB: batches rarely share blocks
  await ws.put("tok/d.idx", idx);
  await ws.put("tok/d.bin", bin);
  const mib = new Uint8Array(2 ** 20);
  for (let i = 0; i < WARM_OBJECTS; i++) await ws.put(`warm/p${i % JOBS}-${String(i).padStart(4, "0")}.bin`, mib);
  console.log(`trainer: ${STEPS} steps of micro_batch 8 × seq 4096 (uint16), ${STEP_MS} ms compute per step, read-ahead off;`);
  console.log(`origin: +${ORIGIN_MS} ms per read, 8 reads in flight; ${JOBS} warm jobs: ${WARM_OBJECTS} MiB in 64 KiB blocks`);
  await scenario(ws, "jit-warm-up", "none"); // unmeasured: JIT and page cache
  const rows: [string, number[]][] = [];
  for (const [name, warm] of [["alone (baseline)", "none"], ["during warm, background priority", "background"], ["during warm, normal priority", "normal"]] as const) {
    rows.push([name, await scenario(ws, warm === "none" ? "alone" : warm, warm)]);
  }
  const base = q(rows[0][1], 0.5);
  console.log("\n| trainer batch latency | p50 ms | p99 ms | max ms | p50 vs alone |\n|---|---|---|---|---|");
  for (const [name, l] of rows) {
    console.log(`| ${name} | ${q(l, 0.5).toFixed(1)} | ${q(l, 0.99).toFixed(1)} | ${Math.max(...l).toFixed(1)} | ${(q(l, 0.5) / base).toFixed(2)}× |`);
  }
} finally {
  await ws.remove();
}
