/** @module A registered token dataset: config + parsed `.idx` files → Megatron's `GPTDataset` or `BlendedDataset`, planned sample by sample. */

import { blendSizes, type BlendSizes, buildBlendingIndices, checkNoOversampling } from "./blend.ts";
import type { DatasetConfig } from "./config.ts";
import { DatasetConfigError } from "./errors.ts";
import { buildGptIndices, type GptIndices } from "./gpt-indices.ts";
import { checkBinSize, type IndexedDatasetIndex, type TokenDtype } from "./indexed-dataset.ts";
import { normalize } from "./numpy-math.ts";
import { planGptWindow, readGptIndexes } from "./sample-plan.ts";
import { type SequenceRange, splitRange } from "./split.ts";

/** The most samples whose index entries `readIndexes` reads at once. */
const MAX_INDEX_READS = 1024;
/** The items whose indexes `readIndexes` reads, and which of a blend's samples it has read: reused, no allocation per batch. */
const itemScratch = new Uint32Array(MAX_INDEX_READS);
const readScratch = new Uint8Array(MAX_INDEX_READS);

/** One source of a built dataset: its file, split range and `GPTDataset` indexes. */
export interface TokenDatasetSource {
  /** The configured prefix. */
  readonly prefix: string;
  /** The parsed `.idx`. */
  readonly index: IndexedDatasetIndex;
  /** The split's sequence range in this file. */
  readonly range: SequenceRange;
  /** Samples requested of this source's `GPTDataset` (`N`, or `buffer_k` in a blend). */
  readonly numSamplesRequested: number;
  /** The source's indexes. */
  readonly gpt: GptIndices;
}

/** The blend part of a weighted dataset. */
export interface TokenDatasetBlend extends BlendSizes {
  /** Weights normalised a second time: what the greedy index was built with. */
  readonly weightsUsed: Float64Array;
  /** Source of each blended sample. */
  readonly datasetIndex: Uint16Array;
  /** Sample of that source's dataset. */
  readonly datasetSampleIndex: Uint32Array;
  /** How many blended samples each source serves. */
  readonly counts: Float64Array;
}

/** What a dataset is, for `GET /v1/datasets/{name}` and for comparing with Megatron's own numbers. */
export interface TokenDatasetDescription {
  /** `single` (one `GPTDataset`) or `blend` (a `BlendedDataset`, also for one weighted source). */
  readonly kind: "single" | "blend";
  /** Served token dtype. */
  readonly dtype: TokenDtype;
  /** Samples served (`num_samples`). */
  readonly numSamples: number;
  /** Megatron's dataset length (>= `numSamples`). */
  readonly length: number;
  /** Tokens per window. */
  readonly windowLength: number;
  /** Body shape of `numSamples` samples. */
  readonly shape: readonly [number, number];
  /** Documents in all source files. */
  readonly documents: number;
  /** Sequences in all source files. */
  readonly sequences: number;
  /** Tokens in all source files. */
  readonly tokens: number;
  /** Per source. */
  readonly sources: readonly {
    readonly prefix: string;
    readonly dtype: TokenDtype;
    readonly sequencesInFile: number;
    readonly documentsInFile: number;
    readonly splitRange: readonly [number, number];
    readonly numSamplesRequested: number;
    readonly tokensPerEpoch: number;
    readonly epochs: number;
    readonly separateFinalEpoch: boolean;
    readonly samplesBeforeFinalEpoch?: number;
    readonly samplesPerEpoch?: number;
    readonly length: number;
  }[];
  /** Blend only. */
  readonly blend?: {
    readonly weights: readonly number[];
    readonly weightsUsed: readonly number[];
    readonly targets: readonly number[];
    readonly buffers: readonly number[];
    readonly size: number;
    readonly counts: readonly number[];
  };
}

/**
 * A dataset ready to serve: every index built, and sample `i` planned as byte ranges of the
 * sources' `.bin` files (`PIECE_STRIDE` numbers per piece, see `sample-plan.ts`).
 */
export interface TokenDataset {
  /** The validated configuration. */
  readonly config: DatasetConfig;
  /** `single` or `blend`. */
  readonly kind: "single" | "blend";
  /** The sources, in configuration order. */
  readonly sources: readonly TokenDatasetSource[];
  /** Blend indexes, for weighted configurations. */
  readonly blend: TokenDatasetBlend | undefined;
  /** Served dtype: the sources' dtype, or `int32` when they differ. */
  readonly dtype: TokenDtype;
  /** Samples served: `num_samples`. */
  readonly numSamples: number;
  /** Megatron's full dataset length; `planSample` accepts `0 … length-1`. */
  readonly length: number;
  /** Tokens per window: `seq_length + 1` (or `seq_length` without the extra token). */
  readonly windowLength: number;
  /** Upper bound on the pieces of one sample: size `out` as `PIECE_STRIDE × maxPiecesPerSample`. */
  readonly maxPiecesPerSample: number;
  /**
   * Writes the pieces of sample `i` into `out` from index `at`.
   *
   * @param i the sample, `0 … length-1`
   * @param out receives `(source, byteOffset, tokenCount)` triples
   * @param at first index of `out` to write (default 0)
   * @returns the number of pieces; their token counts add up to `windowLength`
   * @throws {RangeError} when `i` is out of range or `out` is too short
   */
  planSample(i: number, out: Float64Array, at?: number): number;
  /**
   * Reads the index entries that planning samples `[first, first + count)` will read (of the first
   * 1024 of them), level by level across the samples, so that their cache misses overlap (see
   * `readGptIndexes`); the planning that follows then finds them in cache. Changes nothing.
   *
   * @returns a number that depends on the entries read
   */
  readIndexes(first: number, count: number): number;
  /**
   * The source that serves sample `i` (0 for a single source).
   *
   * @param i the sample, `0 … length-1`
   * @returns the source number
   */
  sourceOf(i: number): number;
  /**
   * A JSON-ready description.
   *
   * @returns the dataset's numbers
   */
  describe(): TokenDatasetDescription;
}

/** Options of {@link buildTokenDataset}. */
export interface BuildTokenDatasetOptions {
  /** Sizes of the sources' `.bin` files; when given, every sequence must lie inside its `.bin`. */
  readonly binSizes?: readonly number[];
}

const INT32_SAFE: ReadonlySet<TokenDtype> = new Set<TokenDtype>(["uint8", "int8", "int16", "uint16", "int32"]);

/**
 * The dtype a set of sources is served as: their common dtype, or `int32` when they differ
 * (every 8- and 16-bit dtype and int32 widen to int32 without loss).
 *
 * @param dtypes the sources' dtypes
 * @returns the served dtype
 * @throws {DatasetConfigError} (field `sources`) when dtypes differ and one does not fit int32
 * @example
 * ```ts
 * servedDtype(["uint16", "int32"]); // "int32"
 * ```
 */
export function servedDtype(dtypes: readonly TokenDtype[]): TokenDtype {
  if (dtypes.every((d) => d === dtypes[0])) return dtypes[0];
  const bad = dtypes.find((d) => !INT32_SAFE.has(d));
  if (bad !== undefined) {
    throw new DatasetConfigError("sources", `mixed token dtypes (${[...new Set(dtypes)].join(", ")}) are served as int32, which cannot hold ${bad}`);
  }
  return "int32";
}

/**
 * Builds a dataset from a validated config and the parsed `.idx` of each source, exactly as
 * megatron-core's `BlendedMegatronDatasetBuilder` would: one source without a weight is a
 * `GPTDataset` asked for `num_samples`; weighted sources (even one) form a `BlendedDataset`
 * whose source `k` is a `GPTDataset` asked for `ceil(ceil(N × w_k) × (1 + surplus))`.
 *
 * @param config the validated configuration
 * @param indexes the parsed `.idx` of each source, in configuration order
 * @param options optional `.bin` sizes to check the indexes against
 * @returns the dataset
 * @throws {DatasetConfigError} on configurations megatron-core would refuse, hang or abort on
 *   (empty split range, oversampled blend source, …)
 * @throws {DatasetFormatError} when a `.bin` size does not cover its index
 * @example
 * ```ts
 * const ds = buildTokenDataset(parseDatasetConfig(body), [parseIndex(idxBytes, { path })]);
 * const pieces = new Float64Array(PIECE_STRIDE * ds.maxPiecesPerSample);
 * const n = ds.planSample(0, pieces);
 * ```
 */
export function buildTokenDataset(
  config: DatasetConfig,
  indexes: readonly IndexedDatasetIndex[],
  options: BuildTokenDatasetOptions = {},
): TokenDataset {
  if (indexes.length !== config.sources.length) {
    throw new RangeError(`Cannot build dataset: ${config.sources.length} sources but ${indexes.length} indexes`);
  }
  if (options.binSizes !== undefined) {
    if (options.binSizes.length !== indexes.length) {
      throw new RangeError(`Cannot build dataset: ${indexes.length} indexes but ${options.binSizes.length} .bin sizes`);
    }
    indexes.forEach((ix, k) => checkBinSize(ix, options.binSizes![k]));
  }
  const dtype = servedDtype(indexes.map((ix) => ix.dtype));
  const weighted = config.sources[0].weight !== undefined;
  const N = config.num_samples;

  let blend: TokenDatasetBlend | undefined;
  let requested: number[];
  if (weighted) {
    const sizes = blendSizes(config.sources.map((s) => s.weight!), N, config.mid_level_dataset_surplus);
    // megatron-core's blending indexes are 32-bit: a larger blend is a registration error, not a crash.
    if (sizes.size > 0xffffffff) {
      throw new DatasetConfigError("num_samples", `a weighted blend of ${sizes.size} samples exceeds 2^32-1 (megatron-core's blending indexes are 32-bit); received num_samples ${N}`);
    }
    requested = Array.from(sizes.buffers);
    // megatron-core normalises once for the sizes and again inside BlendedDataset.
    const weightsUsed = normalize(sizes.weights);
    const bi = buildBlendingIndices(weightsUsed, sizes.size);
    blend = { ...sizes, weightsUsed, ...bi };
  } else {
    requested = [N];
  }

  const x = config.add_extra_token_to_sequence;
  const keepPartial = config.split_index === 1 && !config.drop_last_partial_validation_sequence;
  const sources: TokenDatasetSource[] = indexes.map((index, k) => {
    const prefix = config.sources[k].prefix;
    const range = splitRange(config.split, config.split_index, index.sequenceCount);
    if (range === null) {
      throw new DatasetConfigError("split_index", `split ${config.split_index} has weight 0 in "${config.split}"`);
    }
    const gpt = buildGptIndices({
      lengths: index.lengths,
      begin: range.begin,
      end: range.end,
      seqLength: config.seq_length,
      seed: config.seed,
      numSamples: requested[k],
      addExtraToken: x,
      keepPartial,
      field: `sources[${k}]`,
      label: prefix,
    });
    return Object.freeze({ prefix, index, range, numSamplesRequested: requested[k], gpt });
  });

  if (blend !== undefined) {
    checkNoOversampling(blend.counts, sources.map((s) => s.gpt.length), sources.map((s) => s.prefix));
  }
  return new BuiltTokenDataset(config, sources, blend, dtype);
}

/**
 * What a built dataset is made of: plain data and typed arrays, so it can cross to another
 * thread (structured clone, its arrays transferred) and be made a dataset again there.
 */
export interface TokenDatasetParts {
  readonly config: DatasetConfig;
  readonly sources: readonly TokenDatasetSource[];
  readonly blend: TokenDatasetBlend | undefined;
  readonly dtype: TokenDtype;
}

/**
 * The parts of a dataset built by `buildTokenDataset` (no copy: the same arrays).
 *
 * @param ds the dataset
 * @returns its parts
 */
export function tokenDatasetParts(ds: TokenDataset): TokenDatasetParts {
  return { config: ds.config, sources: ds.sources, blend: ds.blend, dtype: ds.dtype };
}

/**
 * The dataset that `parts` were taken from (see `tokenDatasetParts`), for parts built on another
 * thread. No check is repeated: the parts come from `buildTokenDataset`.
 *
 * @param parts the parts
 * @returns the dataset
 */
export function tokenDatasetFromParts(parts: TokenDatasetParts): TokenDataset {
  return new BuiltTokenDataset(parts.config, parts.sources.map((s) => Object.freeze({ ...s })), parts.blend, parts.dtype);
}

class BuiltTokenDataset implements TokenDataset {
  readonly config: DatasetConfig;
  readonly kind: "single" | "blend";
  readonly sources: readonly TokenDatasetSource[];
  readonly blend: TokenDatasetBlend | undefined;
  readonly dtype: TokenDtype;
  readonly numSamples: number;
  readonly length: number;
  readonly windowLength: number;
  readonly maxPiecesPerSample: number;

  constructor(config: DatasetConfig, sources: TokenDatasetSource[], blend: TokenDatasetBlend | undefined, dtype: TokenDtype) {
    this.config = config;
    this.kind = blend === undefined ? "single" : "blend";
    this.sources = Object.freeze(sources);
    this.blend = blend;
    this.dtype = dtype;
    this.numSamples = config.num_samples;
    this.length = blend === undefined ? sources[0].gpt.length : blend.size;
    this.windowLength = config.seq_length + (config.add_extra_token_to_sequence ? 1 : 0);
    // Every piece holds at least one token.
    this.maxPiecesPerSample = this.windowLength;
  }

  planSample(i: number, out: Float64Array, at = 0): number {
    const blend = this.blend;
    if (blend === undefined) {
      const s = this.sources[0];
      return planGptWindow(s.gpt, s.index, i, 0, out, at);
    }
    if (!(i >= 0 && i < this.length) || !Number.isInteger(i)) {
      throw new RangeError(`Cannot plan sample ${i}: expected an integer in 0 … ${this.length - 1}`);
    }
    const k = blend.datasetIndex[i];
    const s = this.sources[k];
    return planGptWindow(s.gpt, s.index, blend.datasetSampleIndex[i], k, out, at);
  }

  readIndexes(first: number, count: number): number {
    const from = Math.max(0, first);
    // The first MAX_INDEX_READS only: a batch of many samples is bound by its copy, and the
    // scratch arrays stay small.
    const n = Math.min(first + count, this.length, from + MAX_INDEX_READS) - from;
    if (n <= 0) return 0;
    const items = itemScratch;
    const blend = this.blend;
    if (blend === undefined) {
      for (let k = 0; k < n; k++) items[k] = from + k;
      return readGptIndexes(this.sources[0].gpt, this.sources[0].index, items, n);
    }
    // A blend's samples come from a few of its sources: read each of those sources' items
    // together, a pass per source present (not per source of the blend, which may have hundreds).
    const read = readScratch;
    read.fill(0, 0, n);
    let acc = 0;
    for (let k0 = 0; k0 < n; k0++) {
      if (read[k0]) continue;
      const src = blend.datasetIndex[from + k0];
      let m = 0;
      for (let k = k0; k < n; k++) {
        if (read[k] || blend.datasetIndex[from + k] !== src) continue;
        read[k] = 1;
        items[m++] = blend.datasetSampleIndex[from + k];
      }
      acc += readGptIndexes(this.sources[src].gpt, this.sources[src].index, items, m);
    }
    return acc;
  }

  sourceOf(i: number): number {
    if (!(i >= 0 && i < this.length) || !Number.isInteger(i)) {
      throw new RangeError(`Cannot locate sample ${i}: expected an integer in 0 … ${this.length - 1}`);
    }
    return this.blend === undefined ? 0 : this.blend.datasetIndex[i];
  }

  describe(): TokenDatasetDescription {
    let documents = 0;
    let sequences = 0;
    let tokens = 0;
    for (const s of this.sources) {
      documents += s.index.documentCount;
      sequences += s.index.sequenceCount;
      tokens += s.index.totalTokens;
    }
    const b = this.blend;
    return {
      kind: this.kind,
      dtype: this.dtype,
      numSamples: this.numSamples,
      length: this.length,
      windowLength: this.windowLength,
      shape: [this.numSamples, this.windowLength],
      documents,
      sequences,
      tokens,
      sources: this.sources.map((s) => ({
        prefix: s.prefix,
        dtype: s.index.dtype,
        sequencesInFile: s.index.sequenceCount,
        documentsInFile: s.index.documentCount,
        splitRange: [s.range.begin, s.range.end] as const,
        numSamplesRequested: s.numSamplesRequested,
        tokensPerEpoch: s.gpt.tokensPerEpoch,
        epochs: s.gpt.epochs,
        separateFinalEpoch: s.gpt.separateFinalEpoch,
        ...(s.gpt.samplesBeforeFinalEpoch === undefined ? {} : { samplesBeforeFinalEpoch: s.gpt.samplesBeforeFinalEpoch }),
        ...(s.gpt.samplesPerEpoch === undefined ? {} : { samplesPerEpoch: s.gpt.samplesPerEpoch }),
        length: s.gpt.length,
      })),
      ...(b === undefined ? {} : {
        blend: {
          weights: Array.from(b.weights),
          weightsUsed: Array.from(b.weightsUsed),
          targets: Array.from(b.targets),
          buffers: Array.from(b.buffers),
          size: b.size,
          counts: Array.from(b.counts),
        },
      }),
    };
  }
}
