/**
 * @module Building a dataset from its `.idx` files' bytes in one call, so the work can run on
 * another thread: its input and its result (`TokenDatasetParts`) are plain data and typed arrays.
 */

import type { DatasetConfig } from "./config.ts";
import { parseIndex } from "./indexed-dataset.ts";
import { buildTokenDataset, type TokenDataset } from "./token-dataset.ts";

/** Everything a dataset build reads: the registration and each source's `.idx` bytes, name and `.bin` size. */
export interface IndexBuildInput {
  readonly config: DatasetConfig;
  /** Each source's whole `.idx`, in configuration order. */
  readonly idx: readonly Uint8Array[];
  /** Each `.idx`'s name, quoted in error messages. */
  readonly paths: readonly string[];
  /** Each source's `.bin` size: every sequence must lie inside it. */
  readonly binSizes: readonly number[];
}

/**
 * Parses every `.idx` and builds the dataset (see `parseIndex`, `buildTokenDataset`).
 *
 * @param input the registration and the files' bytes
 * @returns the dataset
 * @throws {DatasetFormatError} for a malformed `.idx` or one its `.bin` cannot hold
 * @throws {DatasetConfigError} for a configuration megatron-core would refuse
 */
export function buildFromIndexFiles(input: IndexBuildInput): TokenDataset {
  const indexes = input.idx.map((bytes, k) => parseIndex(bytes, { path: input.paths[k], binSize: input.binSizes[k] }));
  return buildTokenDataset(input.config, indexes, { binSizes: input.binSizes });
}

/**
 * The distinct `ArrayBuffer`s under `value` (typed arrays in nested objects and arrays): the
 * transfer list that moves them to another thread instead of copying them.
 *
 * @param value plain data
 * @returns each buffer once (listing one twice fails the transfer)
 */
export function transferablesOf(value: unknown): ArrayBuffer[] {
  const found = new Set<ArrayBuffer>();
  const seen = new Set<object>();
  const walk = (v: unknown): void => {
    if (typeof v !== "object" || v === null || seen.has(v)) return;
    seen.add(v);
    if (ArrayBuffer.isView(v)) {
      if (v.buffer instanceof ArrayBuffer) found.add(v.buffer);
      return;
    }
    for (const x of Array.isArray(v) ? v : Object.values(v)) walk(x);
  };
  walk(value);
  return [...found];
}
