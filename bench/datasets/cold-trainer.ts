/**
 * @module Benchmark 2 of issue 4: a simulated trainer with a fixed step time reading batches from a
 * cold origin with ~20 ms added latency per origin request; t_wait per step with read-ahead on
 * (default --read-ahead-seconds 2s) and off (--read-ahead-seconds 0, the baseline), same run.
 *
 * Run from the repo root:   node --import tsx bench/datasets/cold-trainer.ts
 * Knobs (environment): BENCH_STEPS=300, BENCH_STEP_MS=20 (trainer compute per step),
 *   BENCH_ORIGIN_MS=20 (added per origin read and stat), BENCH_BLOCK=256KiB (--block-bytes and
 *   --part-bytes), BENCH_REPS=2 (interleaved repetitions), BENCH_MODES=on,off,on-ttl (on: default
 *   read-ahead; off: --read-ahead-seconds 0; on-ttl: read-ahead with --metadata-ttl 1h, a
 *   diagnostic that takes the per-batch metadata revalidation off the batch path).
 *
 * The server is bench/datasets/delayed-server.ts in a child process (test/helpers/rackfeed.ts
 * startServer, Node listener on 127.0.0.1:0) with a makeOrigin wrapper: an FsOrigin over
 * bench/.out/datasets/data that sleeps BENCH_ORIGIN_MS before every read and stat (a stand-in for
 * an NFS/S3 round trip). Every run gets a fresh server and cache directory: both tiers start cold.
 * The dataset is a synthetic int32 file of 1 GiB (bench/.out/datasets/data/i32cold), micro_batch
 * 8 × seq_length 4096, rank 0 of world 1; with 256 KiB blocks a step touches ~9 of the file's 4096
 * blocks, mostly never fetched before: what a trainer on a large corpus sees.
 * t_wait = request sent → last body byte over one keep-alive node:http connection (what the
 * trainer would block on); the trainer then "computes" for BENCH_STEP_MS (setTimeout) and asks for
 * the next step. Figures are over steps 10 … end (the first 10 are warm-up); "steps > 1 ms" counts
 * stalls; "non-hit" = x-rackfeed-cache was not "hit" (some block missing or still filling).
 * "warm replay": the same steps asked again at the same pace after the run, all blocks in memory
 * and no fills running: the floor of t_wait on this machine and client.
 */

import { Agent } from "node:http";
import { join } from "node:path";
import { readMetric } from "../../test/helpers/rackfeed.ts";
import { NODE, NODE_TS, startChild } from "../../test/helpers/spawn.ts";
import { type BenchDataset, ensureDataset, fmt, httpGet, MICRO_BATCH, OUT, pct, registration, ROOT, sortedCopy, table } from "./common.ts";

/** int32, 1 GiB: large next to what 300 steps read, so that most blocks a step needs were never fetched. */
const COLD: BenchDataset = { name: "i32cold", dtypeCode: 4, itemSize: 4, numpyDtype: "<i4" };
const COLD_TOKENS = 256 * 1024 * 1024;

const STEPS = Number(process.env.BENCH_STEPS ?? 300);
const STEP_MS = Number(process.env.BENCH_STEP_MS ?? 20);
const ORIGIN_MS = Number(process.env.BENCH_ORIGIN_MS ?? 20);
const BLOCK = process.env.BENCH_BLOCK ?? "256KiB";
const REPS = Number(process.env.BENCH_REPS ?? 2);
const WARMUP = 10;
const ADMIN = "bench-admin";
const DATA = join(OUT, "data");
const DEADLINE = Date.now() + 10 * 60_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface Run {
  wait: Float64Array; // ms, sorted, steps WARMUP…
  replay: Float64Array; // ms, sorted: the same steps again once warm
  stalls: number;
  misses: number;
  reads: number;
  stats: number;
  seconds: number;
  worst: string; // the slowest steps, "step:ms"
}

type Mode = "on" | "off" | "on-ttl";
const MODE_FLAGS: Record<Mode, string[]> = {
  on: [],
  off: ["--read-ahead-seconds", "0"],
  // Diagnostic: the same as "on" but origin metadata trusted for an hour, so that no stat of the
  // .bin/.idx (catalog.get revalidates them on every batch once the 1 s TTL runs out) sits on a
  // batch's path behind the read-ahead's queued origin reads.
  "on-ttl": ["--metadata-ttl", "1h"],
};
const MODE_NAMES: Record<Mode, string> = {
  on: "on (2 s, default)",
  off: "off (baseline)",
  "on-ttl": "on, --metadata-ttl 1h (diagnostic)",
};
const MODES = (process.env.BENCH_MODES ?? "on,off,on-ttl").split(",") as Mode[];

async function trainerRun(mode: Mode): Promise<Run> {
  const rf = await startChild(NODE, [
    ...NODE_TS,
    join(ROOT, "bench/datasets/delayed-server.ts"),
    DATA,
    "--admin-token",
    ADMIN,
    "--block-bytes",
    BLOCK,
    "--part-bytes",
    BLOCK,
    "--memory-bytes",
    "2GiB",
    ...MODE_FLAGS[mode],
  ]);
  try {
    const agent = new Agent({ keepAlive: true, maxSockets: 1 });
    const res = await fetch(`${rf.url}/v1/datasets/${COLD.name}`, {
      method: "PUT",
      headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
      body: JSON.stringify(registration("data", COLD.name, 8 * 4096)),
    });
    if (res.status !== 201) throw new Error(`register: HTTP ${res.status} ${await res.text()}`);
    const m0 = await (await fetch(`${rf.url}/metrics`)).text();
    const waits: number[] = [];
    const bySteps: [number, number][] = [];
    let misses = 0;
    const t0 = performance.now();
    for (let step = 0; step < STEPS && Date.now() < DEADLINE; step++) {
      const a = performance.now();
      const r = await httpGet(agent, `${rf.url}/v1/datasets/${COLD.name}/batches/${step}?rank=0&world=1&micro_batch=${MICRO_BATCH}`);
      const w = performance.now() - a;
      if (r.status !== 200 || r.body.length !== MICRO_BATCH * 4097 * 4) throw new Error(`step ${step}: HTTP ${r.status}`);
      if (step >= WARMUP) {
        waits.push(w);
        bySteps.push([step, w]);
        if (r.cache !== "hit") misses++;
      }
      await sleep(STEP_MS);
    }
    const seconds = (performance.now() - t0) / 1000;
    // Reference in the same server: the same steps again, every block now in memory, same pacing.
    const replay: number[] = [];
    for (let step = WARMUP; step < STEPS && Date.now() < DEADLINE; step++) {
      const a = performance.now();
      const r = await httpGet(agent, `${rf.url}/v1/datasets/${COLD.name}/batches/${step}?rank=0&world=1&micro_batch=${MICRO_BATCH}`);
      replay.push(performance.now() - a);
      if (r.status !== 200) throw new Error(`replay step ${step}: HTTP ${r.status}`);
      await sleep(STEP_MS);
    }
    agent.destroy();
    const m1 = await (await fetch(`${rf.url}/metrics`)).text();
    const d = (op: string) => readMetric(m1, "rackfeed_origin_requests_total", { origin: "data", op }) - readMetric(m0, "rackfeed_origin_requests_total", { origin: "data", op });
    const worst = bySteps.sort((x, y) => y[1] - x[1]).slice(0, 3).map(([s, w]) => `${s}:${w.toFixed(0)}`).join(" ");
    return { replay: sortedCopy(replay), wait: sortedCopy(waits), stalls: waits.filter((w) => w > 1).length, misses, reads: d("read"), stats: d("stat"), seconds, worst };
  } finally {
    await rf.stop();
  }
}

async function main(): Promise<void> {
  ensureDataset(DATA, COLD, COLD_TOKENS);
  const runs: Record<Mode, Run[]> = { on: [], off: [], "on-ttl": [] };
  for (let rep = 0; rep < REPS && Date.now() < DEADLINE; rep++) {
    for (const mode of MODES) {
      runs[mode].push(await trainerRun(mode));
      process.stderr.write(`rep ${rep} read-ahead ${mode} done\n`);
    }
  }
  const rows: string[][] = [];
  for (const mode of MODES) {
    runs[mode].forEach((r, rep) => {
      rows.push([
        MODE_NAMES[mode],
        String(rep + 1),
        fmt(pct(r.wait, 50), 3),
        fmt(pct(r.wait, 99), 3),
        fmt(r.wait[r.wait.length - 1], 3),
        `${r.stalls}/${r.wait.length}`,
        `${r.misses}/${r.wait.length}`,
        `${r.reads} / ${r.stats}`,
        r.worst,
        `${fmt(pct(r.replay, 50), 3)} / ${fmt(pct(r.replay, 99), 3)}`,
        fmt(r.seconds, 2),
      ]);
    });
  }
  console.log(
    `cold trainer: int32 (1 GiB .bin), micro_batch ${MICRO_BATCH} × seq 4096, ${STEPS} steps of ${STEP_MS} ms compute, origin +${ORIGIN_MS} ms per read/stat, ` +
      `--block-bytes ${BLOCK} --part-bytes ${BLOCK}, server on Node (child process); t_wait over steps ${WARMUP}…${STEPS - 1}`,
  );
  console.log(table(["read-ahead", "rep", "t_wait p50 ms", "p99 ms", "max ms", "steps > 1 ms", "non-hit steps", "origin reads / stats", "slowest steps (step:ms)", "warm replay p50 / p99 ms", "run s"], rows));
}

await main();
process.exit(0);
