/** @module Validation of a token-dataset registration (`PUT /v1/datasets/{name}` body) into a frozen `DatasetConfig`. */

import { DatasetConfigError } from "./errors.ts";
import { parseSplit, type SplitIndex, splitBookends, SPLIT_NAMES } from "./split.ts";

/** Megatron's default `mid_level_dataset_surplus` (the 0.5 % margin of blended sources). */
export const DEFAULT_MID_LEVEL_DATASET_SURPLUS = 0.005;

/** Largest `mid_level_dataset_surplus` accepted: 1 builds twice the samples each blended source needs. */
export const MAX_MID_LEVEL_DATASET_SURPLUS = 1;

/** Megatron's blend stores the source of each sample in an int16: at most this many sources. */
export const MAX_SOURCES = 32766;

/** One source of a dataset: an indexed-dataset prefix (`.idx`/`.bin` without extension) and its blend weight. */
export interface DatasetSourceConfig {
  /** `{origin}/path/prefix`; the files are `prefix.idx` and `prefix.bin`. */
  readonly prefix: string;
  /** Raw blend weight (> 0, need not sum to 1); absent for a plain single-source dataset. */
  readonly weight?: number;
}

/** A validated dataset configuration, in the registration's field names. */
export interface DatasetConfig {
  /** The sources; one without a weight is a plain `GPTDataset`, weighted ones form a blend. */
  readonly sources: readonly DatasetSourceConfig[];
  /** Tokens per sample without the extra one (>= 2). */
  readonly seq_length: number;
  /** numpy `RandomState` seed, `0 … 2^32-1`. */
  readonly seed: number;
  /** Split string such as `"969,30,1"`. */
  readonly split: string;
  /** 0 train, 1 valid, 2 test. */
  readonly split_index: SplitIndex;
  /** Samples the trainer asks of this split (>= 1). */
  readonly num_samples: number;
  /** Extra samples built per blended source, a fraction in 0 … 1; @default 0.005 */
  readonly mid_level_dataset_surplus: number;
  /** Windows of `seq_length + 1` tokens (true) or `seq_length` (false); @default true */
  readonly add_extra_token_to_sequence: boolean;
  /** Only true is served: keep-partial validation windows need a pad id no wire dtype can carry; @default true */
  readonly drop_last_partial_validation_sequence: boolean;
}

const FIELDS = new Set([
  "sources",
  "seq_length",
  "seed",
  "split",
  "split_index",
  "num_samples",
  "mid_level_dataset_surplus",
  "add_extra_token_to_sequence",
  "drop_last_partial_validation_sequence",
]);

function describe(v: unknown): string {
  if (typeof v === "string") return JSON.stringify(v);
  if (typeof v === "number" || typeof v === "boolean" || v === null || v === undefined) return String(v);
  return Array.isArray(v) ? "an array" : `a ${typeof v}`;
}

function integerField(raw: Record<string, unknown>, field: string, min: number, max: number): number {
  const v = raw[field];
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw new DatasetConfigError(field, `expected an integer in ${min} … ${max}, received ${describe(v)}`);
  }
  return v;
}

function booleanField(raw: Record<string, unknown>, field: string, fallback: boolean): boolean {
  const v = raw[field];
  if (v === undefined) return fallback;
  if (typeof v !== "boolean") throw new DatasetConfigError(field, `expected true or false, received ${describe(v)}`);
  return v;
}

/**
 * Validates a dataset registration. Unknown fields are refused so that a typo such as
 * `seq_len` cannot silently fall back to a default and change every window. Checks that
 * need the `.idx` files (empty split ranges, epochs, oversampling) happen when the
 * dataset is built.
 *
 * @param input the parsed JSON body
 * @returns a frozen config with defaults filled in
 * @throws {DatasetConfigError} naming the first field that is missing or wrong
 * @example
 * ```ts
 * const config = parseDatasetConfig({
 *   sources: [{ prefix: "s3data/corpus/text_document" }],
 *   seq_length: 4096, seed: 1234, split: "969,30,1", split_index: 0, num_samples: 1000000,
 * });
 * config.mid_level_dataset_surplus; // 0.005
 * ```
 */
export function parseDatasetConfig(input: unknown): DatasetConfig {
  if (typeof input !== "object" || input === null || Array.isArray(input)) {
    throw new DatasetConfigError("(body)", `expected a JSON object, received ${describe(input)}`);
  }
  const raw = input as Record<string, unknown>;
  for (const key of Object.keys(raw)) {
    if (!FIELDS.has(key)) {
      throw new DatasetConfigError(key, `unknown field; expected one of ${[...FIELDS].join(", ")}`);
    }
  }

  const rawSources = raw.sources;
  if (!Array.isArray(rawSources) || rawSources.length === 0) {
    throw new DatasetConfigError("sources", `expected a non-empty array of { prefix, weight? }, received ${describe(rawSources)}`);
  }
  if (rawSources.length > MAX_SOURCES) {
    throw new DatasetConfigError("sources", `expected at most ${MAX_SOURCES} sources, received ${rawSources.length}`);
  }
  const sources: DatasetSourceConfig[] = [];
  let weighted = 0;
  rawSources.forEach((s: unknown, k) => {
    if (typeof s !== "object" || s === null || Array.isArray(s)) {
      throw new DatasetConfigError(`sources[${k}]`, `expected an object { prefix, weight? }, received ${describe(s)}`);
    }
    const src = s as Record<string, unknown>;
    for (const key of Object.keys(src)) {
      if (key !== "prefix" && key !== "weight") {
        throw new DatasetConfigError(`sources[${k}].${key}`, `unknown field; expected prefix or weight`);
      }
    }
    if (typeof src.prefix !== "string" || src.prefix.length === 0) {
      throw new DatasetConfigError(`sources[${k}].prefix`, `expected a non-empty string, received ${describe(src.prefix)}`);
    }
    if (src.weight === undefined) {
      sources.push(Object.freeze({ prefix: src.prefix }));
      return;
    }
    // Megatron asserts every weight > 0; a zero weight would also leave that source's sample count at 0.
    if (typeof src.weight !== "number" || !Number.isFinite(src.weight) || src.weight <= 0) {
      throw new DatasetConfigError(`sources[${k}].weight`, `expected a finite number > 0, received ${describe(src.weight)}`);
    }
    weighted++;
    sources.push(Object.freeze({ prefix: src.prefix, weight: src.weight }));
  });
  if (weighted !== 0 && weighted !== sources.length) {
    const k = sources.findIndex((s) => s.weight === undefined);
    throw new DatasetConfigError(`sources[${k}].weight`, `missing; when one source has a weight, every source needs one`);
  }
  if (weighted === 0 && sources.length > 1) {
    throw new DatasetConfigError("sources", `${sources.length} sources without weights; a blend needs a weight on every source`);
  }
  if (weighted > 0) {
    // Normalised by their sum: a sum that overflows (weights near 1e308) makes every share 0 and
    // the blend empty, and a share that underflows to 0 drops its source.
    const sum = sources.reduce((a, s) => a + s.weight!, 0);
    const k = sources.findIndex((s) => !(s.weight! / sum > 0));
    if (!Number.isFinite(sum) || k >= 0) {
      throw new DatasetConfigError(
        `sources[${Math.max(0, k)}].weight`,
        `weights must have a finite sum and each a share above 0 of it; received ${sources.map((s) => s.weight).join(", ")}`,
      );
    }
  }

  // Megatron's C++ helpers assert seq_length > 1; offsets within a window must fit an int32.
  const seq_length = integerField(raw, "seq_length", 2, 2 ** 31 - 2);
  const seed = integerField(raw, "seed", 0, 0xffffffff);
  const split_index = integerField(raw, "split_index", 0, 2) as SplitIndex;
  const num_samples = integerField(raw, "num_samples", 1, Number.MAX_SAFE_INTEGER);

  if (typeof raw.split !== "string") {
    throw new DatasetConfigError("split", `expected a string such as "969,30,1", received ${describe(raw.split)}`);
  }
  const split = raw.split;
  parseSplit(split);
  const e = splitBookends(split);
  if (!(e[split_index + 1] > e[split_index])) {
    throw new DatasetConfigError(
      "split_index",
      `split ${split_index} (${SPLIT_NAMES[split_index]}) has weight 0 in "${split}", so megatron-core builds no dataset for it`,
    );
  }

  let surplus = DEFAULT_MID_LEVEL_DATASET_SURPLUS;
  if (raw.mid_level_dataset_surplus !== undefined) {
    const v = raw.mid_level_dataset_surplus;
    // A fraction of extra samples (Megatron's default 0.005 is 0.5 %); up to 1 doubles each
    // source. Beyond that it is a mistake, and near 1e308 `1 + surplus` times a sample count
    // overflows to Infinity, which surfaced as a num_samples error the client never caused.
    if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v > MAX_MID_LEVEL_DATASET_SURPLUS) {
      throw new DatasetConfigError(
        "mid_level_dataset_surplus",
        `expected a fraction in 0 … ${MAX_MID_LEVEL_DATASET_SURPLUS} (extra samples per blended source; default ${DEFAULT_MID_LEVEL_DATASET_SURPLUS}), received ${describe(v)}`,
      );
    }
    surplus = v;
  }
  if (weighted > 0) {
    // Each blended source builds ceil(ceil(N × w_k) × (1 + surplus)) <= ceil(N × (1 + surplus))
    // samples (w_k <= 1): that must stay a safe integer for the index builders.
    const buffer = Math.ceil(num_samples * (1 + surplus));
    if (!Number.isSafeInteger(buffer)) {
      throw new DatasetConfigError(
        raw.mid_level_dataset_surplus === undefined ? "num_samples" : "mid_level_dataset_surplus",
        `num_samples ${num_samples} × (1 + mid_level_dataset_surplus ${surplus}) = ${buffer} samples per blended source, expected at most ${Number.MAX_SAFE_INTEGER}`,
      );
    }
  }
  const add_extra_token_to_sequence = booleanField(raw, "add_extra_token_to_sequence", true);
  const drop_last_partial_validation_sequence = booleanField(raw, "drop_last_partial_validation_sequence", true);
  if (!drop_last_partial_validation_sequence && split_index === 1) {
    throw new DatasetConfigError(
      "drop_last_partial_validation_sequence",
      `expected true; the padded last validation window needs pad id -1, which the uint16 wire format cannot carry`,
    );
  }

  return Object.freeze({
    sources: Object.freeze(sources),
    seq_length,
    seed,
    split,
    split_index,
    num_samples,
    mid_level_dataset_surplus: surplus,
    add_extra_token_to_sequence,
    drop_last_partial_validation_sequence,
  });
}
