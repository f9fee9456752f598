/**
 * @module The cost of planning a token batch (micro_batch 8 × 4097 uint16 tokens, 64 KiB): the
 * server's `planSamples` (pieces → block segments, the blocks touched), beside its floor, the
 * Megatron index lookups alone (`planSample` of each of the 8 samples), in the same run.
 *
 * Run (after one run of warm-batches.ts, which writes the dataset):
 *   node --import tsx bench/datasets/plan-cost.ts        (BENCH_REPS=25 repetitions, best kept)
 */

import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { planSamples } from "../../src/batch/block-plans.ts";
import type { RegisteredDataset } from "../../src/batch/dataset-catalog.ts";
import { buildTokenDataset, parseDatasetConfig, parseIndex, PIECE_STRIDE } from "../../src/dataset/mod.ts";

const IDX = fileURLToPath(new URL("../.out/datasets/data/u16.idx", import.meta.url));
const STEPS = 14_000;
const REPS = Number(process.env.BENCH_REPS ?? 25);
const BLOCK_BYTES = 4 * 2 ** 20;

let idx: Uint8Array;
try {
  idx = new Uint8Array(readFileSync(IDX));
} catch {
  console.error(`No ${IDX}: run 'node --import tsx bench/datasets/warm-batches.ts' once first (it writes the dataset)`);
  process.exit(2);
}
const config = parseDatasetConfig({ sources: [{ prefix: "bench/u16" }], seq_length: 4096, seed: 1234, split: "100,0,0", split_index: 0, num_samples: STEPS * 8 });
const ds = buildTokenDataset(config, [parseIndex(idx, { path: IDX })]);
// planSamples reads only the dataset and its name.
const reg = { name: "u16", dataset: ds } as unknown as RegisteredDataset;
const pieces = new Float64Array(PIECE_STRIDE * ds.maxPiecesPerSample);

let lookups = Infinity;
let plans = Infinity;
let pieceCount = 0;
let segmentCount = 0;
for (let rep = 0; rep < REPS; rep++) {
  let t = performance.now();
  pieceCount = 0;
  for (let s = 0; s < STEPS; s++) for (let i = 0; i < 8; i++) pieceCount += ds.planSample(s * 8 + i, pieces, 0);
  // The first reps compile; the best of the rest is the figure.
  if (rep > 1) lookups = Math.min(lookups, ((performance.now() - t) * 1000) / STEPS);
  t = performance.now();
  segmentCount = 0;
  // keep = false: every plan is made afresh, as for a trainer's epoch.
  for (let s = 0; s < STEPS; s++) segmentCount += planSamples(reg, s * 8, 8, BLOCK_BYTES, "once").segmentCount;
  if (rep > 1) plans = Math.min(plans, ((performance.now() - t) * 1000) / STEPS);
}
console.log(`plan of a 64 KiB token batch (8 samples, ${(pieceCount / STEPS).toFixed(1)} pieces, ${(segmentCount / STEPS).toFixed(1)} segments), best of ${REPS - 2} reps of ${STEPS} steps:`);
console.log(`  Megatron index lookups alone (the floor): ${lookups.toFixed(2)} µs per batch`);
console.log(`  planSamples (pieces to block segments):  ${plans.toFixed(2)} µs per batch (${(plans / lookups).toFixed(1)}× the floor)`);
