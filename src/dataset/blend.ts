/** @module megatron-core `BlendedDataset`: per-source sample budgets and the greedy dataset / dataset-sample indexes. */

import { DatasetConfigError } from "./errors.ts";
import { normalize } from "./numpy-math.ts";

/** How many samples each blended source builds, and how long the blend is. */
export interface BlendSizes {
  /** Weights normalised once (what the sizes are computed from). */
  readonly weights: Float64Array;
  /** `ceil(N × w_k)`: samples the blend takes from source k, at most. */
  readonly targets: Float64Array;
  /** `ceil(target_k × (1 + surplus))`: samples requested of source k's `GPTDataset`. */
  readonly buffers: Float64Array;
  /** `Σ target_k`, the blend's length (can exceed `N` slightly). */
  readonly size: number;
}

/** The blend's two indexes: blended sample `s` is sample `datasetSampleIndex[s]` of source `datasetIndex[s]`. */
export interface BlendingIndices {
  /** Source of each blended sample. */
  readonly datasetIndex: Uint16Array;
  /** Sample of that source's dataset. */
  readonly datasetSampleIndex: Uint32Array;
  /** How many times each source was chosen. */
  readonly counts: Float64Array;
}

/**
 * Per-source sizes of a weighted blend (megatron-core >= core_v0.11): weights normalised with
 * numpy's sum, `target = ceil(N × w)`, `buffer = ceil(target × (1 + surplus))`, all in
 * double arithmetic.
 *
 * @param rawWeights the configured weights (> 0)
 * @param numSamples `N`, the split's requested size
 * @param surplus `mid_level_dataset_surplus`
 * @returns the sizes
 * @example
 * ```ts
 * blendSizes([0.3, 0.7], 2000, 0.005); // targets [600, 1400], buffers [603, 1407], size 2000
 * ```
 */
export function blendSizes(rawWeights: ArrayLike<number>, numSamples: number, surplus: number): BlendSizes {
  const weights = normalize(rawWeights);
  const k = weights.length;
  const targets = new Float64Array(k);
  const buffers = new Float64Array(k);
  const factor = 1 + surplus;
  let size = 0;
  for (let i = 0; i < k; i++) {
    targets[i] = Math.ceil(numSamples * weights[i]);
    buffers[i] = Math.ceil(targets[i] * factor);
    size += targets[i];
  }
  return { weights, targets, buffers, size };
}

/**
 * megatron-core's `build_blending_indices`: for each blended sample, the source whose realised
 * share lags its weight most (`v_k × max(s, 1) − count_k`, double arithmetic, lowest index on a
 * tie). `weights` are used as given; megatron-core passes them normalised a second time.
 * O(size × sources).
 *
 * @param weights per-source weights (already normalised as megatron-core does)
 * @param size number of blended samples
 * @returns the two indexes and per-source counts
 * @throws {RangeError} with more than 65535 sources or a size above 2^32-1
 * @example
 * ```ts
 * buildBlendingIndices([0.3, 0.7], 5).datasetIndex; // [1, 0, 1, 1, 0]
 * ```
 */
export function buildBlendingIndices(weights: ArrayLike<number>, size: number): BlendingIndices {
  const k = weights.length;
  checkShape(k, size);
  const w = Float64Array.from(weights);
  const counts = new Float64Array(k);
  const datasetIndex = new Uint16Array(size);
  const datasetSampleIndex = new Uint32Array(size);
  for (let s = 0; s < size; s++) {
    const t = Math.max(s, 1);
    let best = 0;
    let bestErr = w[0] * t - counts[0];
    for (let i = 1; i < k; i++) {
      const err = w[i] * t - counts[i];
      if (err > bestErr) {
        bestErr = err;
        best = i;
      }
    }
    datasetIndex[s] = best;
    datasetSampleIndex[s] = counts[best];
    counts[best] += 1;
  }
  return { datasetIndex, datasetSampleIndex, counts };
}

/**
 * megatron-core's `build_exhaustive_blending_indices`, used by unweighted blends without a
 * size: weights `len_k / Σ len`, and sources drop out once chosen `len_k` times, until every
 * source is used up.
 *
 * @param lengths each source's dataset length (> 0)
 * @returns the indexes, `Σ len_k` entries
 * @throws {RangeError} when a length is not a positive integer
 * @example
 * ```ts
 * buildExhaustiveBlendingIndices([1, 2]).datasetIndex; // [1, 0, 1]
 * ```
 */
export function buildExhaustiveBlendingIndices(lengths: ArrayLike<number>): BlendingIndices {
  const k = lengths.length;
  let total = 0;
  for (let i = 0; i < k; i++) {
    if (!Number.isSafeInteger(lengths[i]) || lengths[i] <= 0) {
      throw new RangeError(`Cannot blend exhaustively: source ${i} has length ${lengths[i]}; expected a positive integer`);
    }
    total += lengths[i];
  }
  checkShape(k, total);
  const w = new Float64Array(k);
  for (let i = 0; i < k; i++) w[i] = lengths[i] / total;
  const counts = new Float64Array(k);
  const spent = new Uint8Array(k);
  const datasetIndex = new Uint16Array(total);
  const datasetSampleIndex = new Uint32Array(total);
  for (let s = 0; s < total; s++) {
    const t = Math.max(s, 1);
    let best = -1;
    let bestErr = -Number.MAX_VALUE;
    for (let i = 0; i < k; i++) {
      if (spent[i]) continue;
      const err = w[i] * t - counts[i];
      if (err > bestErr) {
        bestErr = err;
        best = i;
      }
    }
    datasetIndex[s] = best;
    datasetSampleIndex[s] = counts[best];
    counts[best] += 1;
    if (counts[best] === lengths[best]) spent[best] = 1;
  }
  return { datasetIndex, datasetSampleIndex, counts };
}

function checkShape(sources: number, size: number): void {
  if (sources < 1 || sources > 0xffff) {
    throw new RangeError(`Cannot blend ${sources} sources: expected 1 … 65535`);
  }
  if (!Number.isInteger(size) || size < 0 || size > 0xffffffff) {
    throw new RangeError(`Cannot blend ${size} samples: expected an integer in 0 … 2^32-1`);
  }
}

/**
 * megatron-core's check after building a blend: no source may be chosen more often than its
 * dataset has samples.
 *
 * @param counts how often each source was chosen
 * @param lengths each source's dataset length
 * @param labels each source's name, for the message
 * @throws {DatasetConfigError} (field `mid_level_dataset_surplus`) naming the oversampled source
 */
export function checkNoOversampling(counts: ArrayLike<number>, lengths: ArrayLike<number>, labels: readonly string[]): void {
  for (let i = 0; i < counts.length; i++) {
    if (counts[i] > lengths[i]) {
      throw new DatasetConfigError(
        "mid_level_dataset_surplus",
        `the blend takes ${counts[i]} samples from "${labels[i]}" but its dataset has only ${lengths[i]}; raise the surplus`,
      );
    }
  }
}
