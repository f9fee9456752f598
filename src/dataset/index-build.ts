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
  /** Built on another thread: return the arrays in `SharedArrayBuffer`s (see `shareArrays`), not moved. */
  readonly shareArrays?: boolean;
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

/** Every typed array (or DataView) under `value`, in nested objects and arrays, each once. */
function viewsIn(value: unknown): ArrayBufferView[] {
  const views: ArrayBufferView[] = [];
  const seen = new Set<object>();
  const walk = (v: unknown): void => {
    if (typeof v !== "object" || v === null || seen.has(v)) return;
    seen.add(v);
    if (ArrayBuffer.isView(v)) views.push(v);
    else for (const x of Array.isArray(v) ? v : Object.values(v)) walk(x);
  };
  walk(value);
  return views;
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
  for (const v of viewsIn(value)) if (v.buffer instanceof ArrayBuffer) found.add(v.buffer);
  return [...found];
}

/**
 * A copy of `value` whose typed arrays live in `SharedArrayBuffer`s (plain objects and arrays
 * copied, other values kept): a dataset's parts in this form are shared with a planning thread
 * when posted to it, where ordinary arrays would be copied.
 *
 * @param value plain data
 * @returns the copy
 */
export function shareArrays<T>(value: T): T {
  const walk = (v: unknown): unknown => {
    if (typeof v !== "object" || v === null) return v;
    if (ArrayBuffer.isView(v)) {
      if (v.buffer instanceof SharedArrayBuffer || v instanceof DataView) return v;
      const a = v as unknown as Uint8Array;
      const Ctor = a.constructor as new (b: SharedArrayBuffer) => Uint8Array;
      const copy = new Ctor(new SharedArrayBuffer(a.byteLength));
      copy.set(a);
      return copy;
    }
    if (Array.isArray(v)) return v.map(walk);
    return Object.fromEntries(Object.entries(v).map(([k, x]) => [k, walk(x)]));
  };
  return walk(value) as T;
}

/**
 * Bytes of the typed arrays under `value` that are not in a `SharedArrayBuffer` (0: posting it
 * to another thread copies no array).
 *
 * @param value plain data
 * @returns the bytes
 */
export function unsharedBytes(value: unknown): number {
  let bytes = 0;
  for (const v of viewsIn(value)) if (!(v.buffer instanceof SharedArrayBuffer)) bytes += v.byteLength;
  return bytes;
}
