/** @module Shared pieces of the dataset benchmarks: synthetic Megatron files, the registration, percentiles. */

import { existsSync, mkdirSync, statSync, writeFileSync } from "node:fs";
import { Agent, request } from "node:http";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { encodeIndex } from "../../src/dataset/mod.ts";

/** Repository root. */
export const ROOT = fileURLToPath(new URL("../../", import.meta.url));
/** Scratch folder for data, plans and logs (git-ignored). */
export const OUT = join(ROOT, "bench/.out/datasets");

/** One synthetic dataset of the warm-batch benchmark. */
export interface BenchDataset {
  readonly name: string;
  readonly dtypeCode: number;
  readonly itemSize: number;
  readonly numpyDtype: string;
}

export const DATASETS: readonly BenchDataset[] = [
  { name: "u16", dtypeCode: 8, itemSize: 2, numpyDtype: "<u2" },
  { name: "i32", dtypeCode: 4, itemSize: 4, numpyDtype: "<i4" },
];

/** Tokens per synthetic file (uint16: 128 MiB, int32: 256 MiB). */
export const TOKENS = 64 * 1024 * 1024;
export const SEQ_LENGTH = 4096;
export const MICRO_BATCH = 8;

/** Sequence lengths: deterministic LCG, 100 … 4000 tokens, summing to exactly `total`. */
export function documentLengths(total: number, seed: number): Int32Array {
  const out: number[] = [];
  let x = seed >>> 0 || 1;
  let sum = 0;
  while (sum < total) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    const len = Math.min(100 + (x % 3901), total - sum);
    out.push(len);
    sum += len;
  }
  return Int32Array.from(out);
}

/** Fills `bytes` with xorshift32 words (fast; token values are irrelevant to the benchmark). */
export function fillRandom(bytes: Uint8Array, seed: number): void {
  const words = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength >>> 2);
  let x = (seed * 2654435761) >>> 0 || 1;
  for (let i = 0; i < words.length; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    words[i] = x;
  }
}

/** Writes `{dir}/{name}.idx` and `.bin` unless they exist with the expected size; returns the prefix path. */
export function ensureDataset(dir: string, ds: BenchDataset, tokens = TOKENS, seed = 7): string {
  mkdirSync(dir, { recursive: true });
  const prefix = join(dir, ds.name);
  const binBytes = tokens * ds.itemSize;
  if (existsSync(`${prefix}.bin`) && statSync(`${prefix}.bin`).size === binBytes && existsSync(`${prefix}.idx`)) return prefix;
  const lengths = documentLengths(tokens, seed);
  writeFileSync(`${prefix}.idx`, encodeIndex({ dtypeCode: ds.dtypeCode, lengths }));
  const bin = new Uint8Array(binBytes);
  fillRandom(bin, seed + ds.dtypeCode);
  writeFileSync(`${prefix}.bin`, bin);
  return prefix;
}

/** The registration body used by every benchmark (`steps` steps of micro_batch samples, world 1). */
export function registration(originName: string, name: string, numSamples: number, seqLength = SEQ_LENGTH): Record<string, unknown> {
  return {
    sources: [{ prefix: `${originName}/${name}` }],
    seq_length: seqLength,
    seed: 1234,
    split: "100,0,0",
    split_index: 0,
    num_samples: numSamples,
  };
}

/** Nearest-rank percentile of an ascending-sorted array. */
export function pct(sorted: ArrayLike<number>, p: number): number {
  if (sorted.length === 0) return NaN;
  const k = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[k];
}

export function sortedCopy(xs: readonly number[]): Float64Array {
  return Float64Array.from(xs).sort();
}

export function fmt(x: number, digits = 2): string {
  return Number.isFinite(x) ? x.toFixed(digits) : Number.isNaN(x) ? "–" : String(x);
}

/** Prints a markdown table. */
export function table(head: readonly string[], rows: readonly (readonly string[])[]): string {
  const lines = [`| ${head.join(" | ")} |`, `|${head.map(() => "---").join("|")}|`];
  for (const r of rows) lines.push(`| ${r.join(" | ")} |`);
  return lines.join("\n");
}

/** One GET over a keep-alive node:http agent: the whole body, the x-rackfeed-cache header, the status. */
export function httpGet(agent: Agent, url: URL | string): Promise<{ body: Buffer; cache: string; status: number }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { agent, method: "GET" }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ body: Buffer.concat(chunks), cache: String(res.headers["x-rackfeed-cache"]), status: res.statusCode ?? 0 }));
      res.on("error", reject);
    });
    req.setTimeout(30_000, () => req.destroy(new Error(`timeout: ${url}`)));
    req.on("error", reject);
    req.end();
  });
}
