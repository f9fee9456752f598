/** @module Synthetic Megatron datasets for tests and benchmarks: an `.idx` and a `.bin` of pseudo-random uint16 tokens. */

import { encodeIndex } from "../../src/dataset/mod.ts";
import { patternBytes } from "./rackfeed.ts";

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
