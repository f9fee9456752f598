/**
 * @module Benchmark 4 of issue 4: memory-tier hit rate of Belady vs LRU eviction
 * (--memory-eviction belady|lru) over two epochs, with a memory tier smaller than the dataset.
 *
 * Run from the repo root:   node --import tsx bench/datasets/eviction.ts
 * Knobs (environment): BENCH_MEMORY="32MiB,64MiB" (memory budgets to try), BENCH_BLOCK=64KiB,
 *   BENCH_STEP_MS=2 (trainer compute per step), BENCH_REPS=1, BENCH_EXTRA_FLAGS="" (more serve
 *   flags, e.g. "--read-ahead-max-steps 8").
 *
 * Dataset: the uint16 file of the warm benchmark (128 MiB, 16 383 samples of 4097 tokens per
 * epoch), num_samples = 2 epochs, micro_batch 8, rank 0 of world 1: 4095 steps. Server: Node
 * (src/main.node.ts) in a child process, fs origin without added delay, --block-bytes
 * BENCH_BLOCK, NVMe tier large enough for everything (so a memory miss is a disk-tier or origin
 * fill), read-ahead on (its schedule is what Belady evicts by). Each (budget, policy) gets a fresh
 * server and cache directory; policies are interleaved per budget.
 * Figures: demand block lookups = Σ over batches of the distinct blocks a batch touches (computed
 * here from the same plan, buildTokenDataset on the same .idx); "memory hits" =
 * rackfeed_cache_hits_total{tier="memory"} (demand lookups found in memory; read-ahead lookups are
 * not counted there); "fills" = blocks brought into memory from below (disk-tier hits + origin
 * reads, read-ahead included) = the cost of every eviction that was later regretted; "hit batches"
 * = batches answered with x-rackfeed-cache: hit. Per epoch and in total.
 */

import { readFileSync, rmSync, statSync } from "node:fs";
import { Agent } from "node:http";
import { join } from "node:path";
import { planSamples } from "../../src/batch/block-plans.ts";
import type { RegisteredDataset } from "../../src/batch/dataset-catalog.ts";
import { parseSize } from "../../src/config/size.ts";
import { buildTokenDataset, parseDatasetConfig, parseIndex } from "../../src/dataset/mod.ts";
import { readMetric } from "../../test/helpers/rackfeed.ts";
import { NODE, NODE_TS, startChild } from "../../test/helpers/spawn.ts";
import { DATASETS, ensureDataset, fmt, httpGet, MICRO_BATCH, OUT, registration, ROOT, table } from "./common.ts";

const MEMORY = (process.env.BENCH_MEMORY ?? "32MiB,64MiB").split(",");
const BLOCK = process.env.BENCH_BLOCK ?? "64KiB";
const STEP_MS = Number(process.env.BENCH_STEP_MS ?? 2);
const REPS = Number(process.env.BENCH_REPS ?? 1);
const EXTRA = (process.env.BENCH_EXTRA_FLAGS ?? "").split(" ").filter((f) => f !== "");
const ADMIN = "bench-admin";
const DATA = join(OUT, "data");
const DS = DATASETS.find((d) => d.name === "u16")!;
const DEADLINE = Date.now() + 15 * 60_000;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

interface EpochFigures {
  lookups: number;
  memoryHits: number;
  fills: number;
  hitBatches: number;
  batches: number;
}

function scrape(text: string): { mem: number; disk: number; miss: number } {
  return {
    mem: readMetric(text, "rackfeed_cache_hits_total", { tier: "memory" }),
    disk: readMetric(text, "rackfeed_cache_hits_total", { tier: "disk" }),
    miss: readMetric(text, "rackfeed_cache_misses_total"),
  };
}

async function run(memory: string, policy: "belady" | "lru", numSamples: number, lookupsPerStep: Int32Array, epochEndStep: number): Promise<EpochFigures[]> {
  const cache = join(OUT, `evict-cache-${policy}`);
  rmSync(cache, { recursive: true, force: true });
  const rf = await startChild(NODE, [
    ...NODE_TS,
    join(ROOT, "src/main.node.ts"),
    "serve",
    "--listen",
    "127.0.0.1:0",
    "--origin",
    `data=${DATA}`,
    "--cache-dir",
    cache,
    "--admin-token",
    ADMIN,
    "--memory-bytes",
    memory,
    "--disk-bytes",
    "1GiB",
    "--block-bytes",
    BLOCK,
    "--part-bytes",
    BLOCK,
    "--memory-eviction",
    policy,
    ...EXTRA,
  ]);
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  try {
    const res = await fetch(`${rf.url}/v1/datasets/${DS.name}`, {
      method: "PUT",
      headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
      body: JSON.stringify(registration("data", DS.name, numSamples)),
    });
    if (res.status !== 201) throw new Error(`register: HTTP ${res.status} ${await res.text()}`);
    const steps = lookupsPerStep.length;
    const out: EpochFigures[] = [];
    let before = scrape(await (await fetch(`${rf.url}/metrics`)).text());
    let fig: EpochFigures = { lookups: 0, memoryHits: 0, fills: 0, hitBatches: 0, batches: 0 };
    for (let step = 0; step < steps; step++) {
      if (Date.now() > DEADLINE) throw new Error("deadline");
      const r = await httpGet(agent, `${rf.url}/v1/datasets/${DS.name}/batches/${step}?rank=0&world=1&micro_batch=${MICRO_BATCH}`);
      if (r.status !== 200) throw new Error(`step ${step}: HTTP ${r.status}`);
      fig.batches++;
      fig.lookups += lookupsPerStep[step];
      if (r.cache === "hit") fig.hitBatches++;
      if (step === epochEndStep || step === steps - 1) {
        const now = scrape(await (await fetch(`${rf.url}/metrics`)).text());
        fig.memoryHits = now.mem - before.mem;
        fig.fills = now.disk - before.disk + now.miss - before.miss;
        out.push(fig);
        before = now;
        fig = { lookups: 0, memoryHits: 0, fills: 0, hitBatches: 0, batches: 0 };
      }
      await sleep(STEP_MS);
    }
    return out;
  } finally {
    agent.destroy();
    await rf.stop();
    rmSync(cache, { recursive: true, force: true });
  }
}

async function main(): Promise<void> {
  const prefix = ensureDataset(DATA, DS);
  const index = parseIndex(readFileSync(`${prefix}.idx`), { path: `${prefix}.idx`, binSize: statSync(`${prefix}.bin`).size });
  // Samples of one epoch: what a GPTDataset asked for 1 sample builds (1 epoch, no separate final epoch).
  const perEpoch = buildTokenDataset(parseDatasetConfig(registration("data", DS.name, 1)), [index]).length;
  const numSamples = 2 * perEpoch;
  const dataset = buildTokenDataset(parseDatasetConfig(registration("data", DS.name, numSamples)), [index]);
  const reg = { name: DS.name, dataset, files: [], config: dataset.config, buildSeconds: 0 } as unknown as RegisteredDataset;
  const steps = Math.floor(numSamples / MICRO_BATCH);
  const blockBytes = parseSize(BLOCK, "BENCH_BLOCK");
  const lookupsPerStep = new Int32Array(steps);
  for (let s = 0; s < steps; s++) lookupsPerStep[s] = planSamples(reg, s * MICRO_BATCH, MICRO_BATCH, blockBytes).blocks.length;
  const epochEndStep = Math.floor(perEpoch / MICRO_BATCH) - 1; // the step holding the last sample of epoch 1 closes "epoch 1"
  const binMiB = statSync(`${prefix}.bin`).size / 2 ** 20;

  const rows: string[][] = [];
  for (let rep = 0; rep < REPS; rep++) {
    for (const memory of MEMORY) {
      for (const policy of ["belady", "lru"] as const) {
        const figs = await run(memory, policy, numSamples, lookupsPerStep, epochEndStep);
        const total = figs.reduce((a, f) => ({
          lookups: a.lookups + f.lookups,
          memoryHits: a.memoryHits + f.memoryHits,
          fills: a.fills + f.fills,
          hitBatches: a.hitBatches + f.hitBatches,
          batches: a.batches + f.batches,
        }));
        const cell = (f: EpochFigures) => `${fmt((100 * f.memoryHits) / f.lookups, 1)} %`;
        rows.push([
          memory,
          policy,
          cell(figs[0]),
          cell(figs[1]),
          cell(total),
          String(total.fills),
          `${fmt((100 * total.hitBatches) / total.batches, 1)} %`,
        ]);
        process.stderr.write(`${memory} ${policy} done\n`);
      }
    }
  }
  console.log(
    `eviction: uint16 .bin ${fmt(binMiB, 0)} MiB, 2 epochs = ${numSamples} samples = ${steps} steps of micro_batch ${MICRO_BATCH}, ` +
      `--block-bytes ${BLOCK}, trainer step ${STEP_MS} ms, read-ahead on (${EXTRA.join(" ") || "default 2 s / 64 steps"}), Node server; ` +
      `demand block lookups ${lookupsPerStep.reduce((a, b) => a + b, 0)}`,
  );
  console.log(table(["memory tier", "eviction", "memory hit rate epoch 1", "epoch 2", "both epochs", "fills into memory", "hit batches"], rows));
}

await main();
process.exit(0);
