/** @module Synthetic Megatron datasets for tests and benchmarks: an `.idx` and a `.bin` of pseudo-random uint16 tokens. */

import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { encodeIndex } from "../../src/dataset/mod.ts";
import { patternBytes, type Workspace } from "./rackfeed.ts";

/**
 * A dataset of `documents` documents with lengths from `minTokens` to `maxTokens` (deterministic).
 *
 * @returns the `.idx` and `.bin` bytes
 */
export function syntheticDataset(documents: number, minTokens: number, maxTokens: number, seed = 1): { idx: Uint8Array; bin: Uint8Array } {
  const lengths: number[] = [];
  let x = seed >>> 0 || 1;
  let total = 0;
  for (let i = 0; i < documents; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    const len = minTokens + (x % (maxTokens - minTokens + 1));
    lengths.push(len);
    total += len;
  }
  return { idx: encodeIndex({ dtypeCode: 8, lengths }), bin: patternBytes(total * 2, seed) };
}

/** Writes `syntheticDataset(...)`'s files as `<prefix>.idx` and `<prefix>.bin` under the workspace's origin root. */
export async function putSyntheticDataset(ws: Workspace, prefix: string, documents: number, minTokens: number, maxTokens: number, seed = 1): Promise<void> {
  const { idx, bin } = syntheticDataset(documents, minTokens, maxTokens, seed);
  await ws.put(`${prefix}.idx`, idx);
  await ws.put(`${prefix}.bin`, bin);
}

/** Writes a registration body to `<workspace>/<name>.json`; returns the serve flags that register it at start-up. */
export async function datasetFlags(ws: Workspace, name: string, registration: unknown): Promise<string[]> {
  const path = join(ws.dir, `${name}.json`);
  await writeFile(path, JSON.stringify(registration));
  return ["--dataset", `${name}=${path}`];
}
