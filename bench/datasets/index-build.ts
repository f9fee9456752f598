/**
 * @module Benchmark 3 of issue 4: index build time and memory for a synthetic Megatron index of
 * ~10 billion tokens (5 M documents, 1000 … 3000 tokens each, uint16), beside the raw size of the
 * arrays (the baseline: what the .idx holds, and what megatron-core's own numpy index arrays —
 * document_index int32, sample_index int32 [N+1, 2], shuffle_index uint32 — take).
 *
 * Run from the repo root (gc exposed so that the memory deltas are of live data only):
 *   node --expose-gc --import tsx bench/datasets/index-build.ts
 *   node_modules/.bin/deno run -A --v8-flags=--expose-gc bench/datasets/index-build.ts
 * Knobs: BENCH_DOCS=5000000, BENCH_EPOCHS=1 (num_samples = epochs × one epoch's samples).
 *
 * Phases, each timed with performance.now() and followed by gc() + process.memoryUsage():
 * encodeIndex (writing the .idx in memory; not part of serving), parseIndex (what registration
 * does with the downloaded .idx), buildTokenDataset (document, sample and shuffle indexes of
 * megatron-core's GPTDataset, seq_length 4096, seed 1234, split 100,0,0).
 */

import process from "node:process";
import { buildTokenDataset, encodeIndex, parseDatasetConfig, parseIndex } from "../../src/dataset/mod.ts";
import { fmt, table } from "./common.ts";

const DOCS = Number(process.env.BENCH_DOCS ?? 5_000_000);
const EPOCHS = Number(process.env.BENCH_EPOCHS ?? 1);
const SEQ = 4096;
const gc = (globalThis as { gc?: () => void }).gc ?? (() => {});
const MiB = 2 ** 20;
const runtime = "Deno" in globalThis ? `Deno ${(globalThis as unknown as { Deno: { version: { deno: string } } }).Deno.version.deno}` : `Node ${process.version}`;

function mem(): { rss: number; heap: number; ab: number } {
  gc();
  gc();
  const m = process.memoryUsage();
  return { rss: m.rss, heap: m.heapUsed, ab: m.arrayBuffers };
}

const rows: string[][] = [];
let last = mem();
const start = last;
function phase<T>(name: string, fn: () => T): T {
  const t0 = performance.now();
  const out = fn();
  const ms = performance.now() - t0;
  const now = mem();
  rows.push([
    name,
    fmt(ms / 1000, 2),
    fmt((now.rss - last.rss) / MiB, 0),
    fmt((now.heap - last.heap) / MiB, 1),
    fmt((now.ab - last.ab) / MiB, 0),
    fmt(now.rss / MiB, 0),
  ]);
  last = now;
  return out;
}

const lengths = phase("generate lengths (Int32Array)", () => {
  const l = new Int32Array(DOCS);
  let x = 12345;
  for (let i = 0; i < DOCS; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    l[i] = 1000 + (x % 2001);
  }
  return l;
});
let tokens = 0;
for (let i = 0; i < DOCS; i++) tokens += lengths[i];
const idx = phase("encodeIndex → .idx bytes", () => encodeIndex({ dtypeCode: 8, lengths }));
const index = phase("parseIndex", () => parseIndex(idx, { path: "bench/synthetic.idx" }));
const perEpoch = Math.floor((tokens - 1) / SEQ);
const numSamples = perEpoch * EPOCHS;
const config = parseDatasetConfig({ sources: [{ prefix: "bench/synthetic" }], seq_length: SEQ, seed: 1234, split: "100,0,0", split_index: 0, num_samples: numSamples });
const ds = phase("buildTokenDataset (GPTDataset indexes)", () => buildTokenDataset(config, [index]));

const g = ds.sources[0].gpt;
const held = [index.lengths, index.pointers, index.documentBoundaries, g.documentIndex, g.samplePositions, g.sampleOffsets, g.shuffleIndex]
  .reduce((a, t) => a + t.byteLength, 0);
const megatronIdx = 4 * DOCS + 8 * DOCS + 8 * (DOCS + 1); // sizes int32, pointers int64, document_indices int64 (numpy views of the mmap)
const megatronIdxBuilt = 4 * g.documentIndex.length + 4 * 2 * (g.length + 1) + 4 * g.shuffleIndex.length;

console.log(
  `index build on ${runtime}: ${DOCS} documents, ${(tokens / 1e9).toFixed(3)} G tokens, seq_length ${SEQ}, ` +
    `num_samples ${numSamples} (${EPOCHS} epoch(s); dataset length ${g.length}, epochs built ${g.epochs}); .idx ${fmt(idx.byteLength / MiB, 0)} MiB`,
);
console.log(table(["phase", "seconds", "Δ RSS MiB", "Δ heapUsed MiB", "Δ arrayBuffers MiB", "RSS after MiB"], rows));
console.log(
  table(["memory", "MiB"], [
    ["baseline: raw .idx arrays (sizes int32 + pointers int64 + doc_idx int64)", fmt(megatronIdx / MiB, 0)],
    ["baseline: megatron-core index arrays (document_index i32 + sample_index i32×2 + shuffle_index u32)", fmt(megatronIdxBuilt / MiB, 0)],
    ["baseline total", fmt((megatronIdx + megatronIdxBuilt) / MiB, 0)],
    ["rackfeed typed arrays held (index + GPT indexes)", fmt(held / MiB, 0)],
    ["rackfeed Δ RSS parseIndex + build (from start, .idx bytes and lengths excluded)", fmt((last.rss - start.rss - idx.byteLength - lengths.byteLength) / MiB, 0)],
  ]),
);
process.exit(0);
