/** @module Megatron's train/valid/test split: parsing a split string, its book-ends and each split's sequence range. */

import { DatasetConfigError } from "./errors.ts";
import { normalize, roundHalfEven } from "./numpy-math.ts";

/** Which split a dataset serves: 0 train, 1 valid, 2 test. */
export type SplitIndex = 0 | 1 | 2;

/** Names of the splits, by index. */
export const SPLIT_NAMES: readonly string[] = Object.freeze(["train", "valid", "test"]);

/** A half-open range `[begin, end)` of sequence numbers. */
export interface SequenceRange {
  /** First sequence of the split. */
  readonly begin: number;
  /** One past the last sequence of the split. */
  readonly end: number;
}

/**
 * Parses and normalises a split string like Megatron's `parse_and_normalize_split`: every
 * maximal run of digits and dots is a number (any other character separates), at most three,
 * padded with zeros, then divided by their numpy sum.
 *
 * @param split the split string, e.g. `"969,30,1"`
 * @returns the three normalised fractions
 * @throws {DatasetConfigError} (field `split`) on more than three numbers, a run that is not a
 *   number (`"1.2.3"`), or numbers that are all zero or not finite
 * @example
 * ```ts
 * parseSplit("969,30,1"); // [0.969, 0.03, 0.001]
 * parseSplit("99,1"); // [0.99, 0.01, 0]
 * ```
 */
export function parseSplit(split: string): [number, number, number] {
  if (typeof split !== "string") {
    throw new DatasetConfigError("split", `expected a string such as "969,30,1", received ${JSON.stringify(split)}`);
  }
  const runs = split.match(/[.0-9]+/g) ?? [];
  if (runs.length > 3) {
    throw new DatasetConfigError("split", `expected at most three numbers, received ${runs.length} in "${split}"`);
  }
  const values = [0, 0, 0];
  runs.forEach((run, i) => {
    // Number() and Python's float() agree on runs of digits and dots: both reject "1.2.3" and ".".
    const v = Number(run);
    if (!Number.isFinite(v)) {
      throw new DatasetConfigError("split", `"${run}" in "${split}" is not a finite number`);
    }
    values[i] = v;
  });
  if (values[0] + values[1] + values[2] === 0) {
    throw new DatasetConfigError("split", `expected at least one non-zero number, received "${split}"`);
  }
  const w = normalize(values);
  if (!w.every(Number.isFinite)) {
    throw new DatasetConfigError("split", `numbers in "${split}" are too large to normalise`);
  }
  return [w[0], w[1], w[2]];
}

/**
 * The four book-ends `e0 … e3` of a split: `e0 = 0`, `e(k+1) = e(k) + w(k)` in double
 * additions, left to right. Split `k` covers the fraction `[e(k), e(k+1))`.
 *
 * @param split the split string
 * @returns the book-ends
 * @throws {DatasetConfigError} as {@link parseSplit}
 */
export function splitBookends(split: string): [number, number, number, number] {
  const [w0, w1, w2] = parseSplit(split);
  const e1 = 0 + w0;
  const e2 = e1 + w1;
  const e3 = e2 + w2;
  return [0, e1, e2, e3];
}

/**
 * Whether megatron-core builds a dataset for split `splitIndex` at all: only when its end
 * book-end is strictly greater than its start.
 *
 * @param split the split string
 * @param splitIndex 0 train, 1 valid, 2 test
 * @returns true when the split exists
 * @throws {DatasetConfigError} as {@link parseSplit}
 */
export function splitExists(split: string, splitIndex: SplitIndex): boolean {
  const e = splitBookends(split);
  return e[splitIndex + 1] > e[splitIndex];
}

/**
 * The sequence range of split `splitIndex` in a file of `sequenceCount` sequences:
 * `[round(e(k) × S), round(e(k+1) × S))` with Python's half-to-even `round`.
 *
 * @param split the split string
 * @param splitIndex 0 train, 1 valid, 2 test
 * @param sequenceCount `S`, the number of sequences in the `.idx`
 * @returns the range, or `null` when megatron-core builds no dataset for that split; an
 *   existing split can still be empty (`begin == end`)
 * @throws {DatasetConfigError} as {@link parseSplit}
 * @example
 * ```ts
 * splitRange("969,30,1", 0, 100); // { begin: 0, end: 97 }
 * splitRange("1,1", 2, 5); // null
 * ```
 */
export function splitRange(split: string, splitIndex: SplitIndex, sequenceCount: number): SequenceRange | null {
  const e = splitBookends(split);
  const lo = e[splitIndex];
  const hi = e[splitIndex + 1];
  if (!(hi > lo)) return null;
  return { begin: roundHalfEven(lo * sequenceCount), end: roundHalfEven(hi * sequenceCount) };
}
