/**
 * @module The memory a dataset's indexes take, worked out from the registration and its `.idx`
 * files before anything is built: a registration too large for the server is refused before it
 * allocates (see `DatasetCatalog` and `--dataset-index-bytes`).
 */

import { blendSizes } from "./blend.ts";
import type { DatasetConfig } from "./config.ts";
import { numEpochs } from "./gpt-indices.ts";
import type { IndexBuildInput } from "./index-build.ts";
import { IDX_HEADER_BYTES, readIndexHeader } from "./indexed-dataset.ts";
import { splitRange } from "./split.ts";

/**
 * Bytes per sample a source's `GPTDataset` keeps: its sample index (a position and an offset per
 * row, 4 bytes each) and its shuffle index (4 bytes).
 */
export const SAMPLE_BYTES = 12;
/** Bytes per document-index entry (an `Int32Array`: one entry per document and epoch). */
export const DOCUMENT_ENTRY_BYTES = 4;
/** Bytes per blended sample: its source (`Uint16Array`) and its sample of that source (`Uint32Array`). */
export const BLEND_SAMPLE_BYTES = 6;
/** Bytes per blended source: five `Float64Array` entries (weights, targets, buffers, weights used, counts). */
const BLEND_SOURCE_BYTES = 40;

/** The memory of one dataset's indexes, in bytes, and what it is made of. */
export interface IndexMemoryEstimate {
  /**
   * Held while the dataset is registered: the parsed `.idx` arrays (lengths, pointers, document
   * boundaries: about the file's size) and the built indexes.
   */
  readonly heldBytes: number;
  /** While it is built: `heldBytes` and the `.idx` files as read, which the build parses. */
  readonly buildBytes: number;
  /** The `.idx` files as read. */
  readonly idxBytes: number;
  /** Their parsed arrays. */
  readonly parsedBytes: number;
  /** The sources' document indexes: documents of the split × epochs × 4 bytes. */
  readonly documentIndexBytes: number;
  /** The sources' sample and shuffle indexes: 12 bytes per sample (Megatron builds whole epochs, so at least `num_samples`). */
  readonly sampleBytes: number;
  /** A blend's two indexes: 6 bytes per blended sample. */
  readonly blendBytes: number;
  /** Samples over all sources' `GPTDataset`s. */
  readonly samples: number;
  /** Document-index entries over all sources. */
  readonly documentEntries: number;
  /** Most epochs of one source. */
  readonly maxEpochs: number;
}

/** A blend's two indexes (per blended sample) and its per-source arrays; 0 without a blend. */
function blendIndexBytes(blendSize: number, sources: number): number {
  return blendSize > 0 ? BLEND_SAMPLE_BYTES * blendSize + BLEND_SOURCE_BYTES * sources : 0;
}

/** Samples asked of each source's `GPTDataset`: `num_samples`, or a blend's per-source buffers. */
function samplesAsked(config: DatasetConfig): { perSource: number[]; blendSize: number } {
  if (config.sources[0].weight === undefined) return { perSource: [config.num_samples], blendSize: 0 };
  const sizes = blendSizes(config.sources.map((s) => s.weight!), config.num_samples, config.mid_level_dataset_surplus);
  return { perSource: Array.from(sizes.buffers), blendSize: sizes.size };
}

/**
 * A lower bound of `estimateIndexMemory(...).buildBytes` that needs only the `.idx` sizes (their
 * `stat`), for refusing a registration before its files are read: the files themselves, 12 bytes
 * per sample asked of each source and a blend's indexes.
 *
 * @param config the validated registration
 * @param idxSizes each source's `.idx` size in bytes, in configuration order
 * @returns the bytes
 * @example
 * ```ts
 * indexMemoryLowerBound(config, [656482]); // 656482 + 12 × num_samples for one source
 * ```
 */
export function indexMemoryLowerBound(config: DatasetConfig, idxSizes: readonly number[]): number {
  const { perSource, blendSize } = samplesAsked(config);
  let bytes = 0;
  for (const s of idxSizes) bytes += s;
  for (const n of perSource) bytes += SAMPLE_BYTES * n;
  return bytes + blendIndexBytes(blendSize, perSource.length);
}

/**
 * The memory a dataset's build takes and its indexes keep, computed as the build would lay them
 * out (`buildTokenDataset`): per source, the parsed `.idx` (4 + 8 bytes per sequence, 8 per
 * document boundary), the document index (4 bytes per document of the split per epoch; epochs
 * from the split's tokens, read from the `.idx` lengths, and `num_samples × seq_length`, so a long
 * `seq_length` over a small corpus makes it large), the sample and shuffle indexes (12 bytes per
 * sample of the whole epochs built), and a blend's indexes (6 bytes per blended sample). O(sequences
 * in the splits) for the token counts, once per distinct file and split. A source the build would
 * refuse (a malformed `.idx`, an empty split) counts its file only: the build names the problem.
 *
 * @param input the registration and the `.idx` bytes, as the build gets them
 * @returns the estimate
 * @example
 * ```ts
 * const e = estimateIndexMemory({ config, idx: [idxBytes], paths: ["data/a.idx"], binSizes: [binBytes] });
 * e.heldBytes; // what stays in memory while the dataset is registered
 * ```
 */
export function estimateIndexMemory(input: IndexBuildInput): IndexMemoryEstimate {
  const { config } = input;
  const { perSource, blendSize } = samplesAsked(config);
  const L = config.seq_length;
  const x = config.add_extra_token_to_sequence ? 1 : 0;
  const tokensOf = new Map<string, number>();
  let idxBytes = 0;
  let parsedBytes = 0;
  let documentEntries = 0;
  let samples = 0;
  let sampleBytes = 0;
  let maxEpochs = 0;
  input.idx.forEach((idx, k) => {
    idxBytes += idx.byteLength;
    let header;
    try {
      header = readIndexHeader(idx, input.paths[k]);
    } catch {
      return;
    }
    const { sequenceCount: S, boundaryCount: B } = header;
    // A file shorter than its counts is refused by the build before it allocates the arrays.
    if (idx.byteLength < IDX_HEADER_BYTES + 12 * S + 8 * B) return;
    parsedBytes += 12 * S + 8 * B;
    const range = splitRange(config.split, config.split_index, S);
    if (range === null) return;
    const key = `${input.paths[k]}\u0000${S}\u0000${range.begin}\u0000${range.end}`;
    let T = tokensOf.get(key);
    if (T === undefined) {
      T = 0;
      const view = new DataView(idx.buffer, idx.byteOffset, idx.byteLength);
      for (let d = range.begin; d < range.end; d++) {
        const len = view.getInt32(IDX_HEADER_BYTES + 4 * d, true);
        if (len < 0) {
          T = -1; // refused by the build
          break;
        }
        T += len;
      }
      tokensOf.set(key, T);
    }
    if (T <= 1) return; // refused by the build, naming the split
    const needed = perSource[k] * L + x;
    // Exactly as the build counts them where it can; past 2^53 tokens (refused by the build too) roughly.
    const E = Number.isSafeInteger(needed) && Number.isSafeInteger(T) ? numEpochs(T, needed) : Math.max(1, Math.ceil(needed / T));
    const rows = Math.max(0, Math.floor((E * T - x) / L));
    documentEntries += E * (range.end - range.begin);
    samples += rows;
    // The sample index has one row more than the shuffle index.
    sampleBytes += SAMPLE_BYTES * rows + 8;
    maxEpochs = Math.max(maxEpochs, E);
  });
  const documentIndexBytes = DOCUMENT_ENTRY_BYTES * documentEntries;
  const blendBytes = blendIndexBytes(blendSize, perSource.length);
  const heldBytes = parsedBytes + documentIndexBytes + sampleBytes + blendBytes;
  return {
    heldBytes,
    buildBytes: heldBytes + idxBytes,
    idxBytes,
    parsedBytes,
    documentIndexBytes,
    sampleBytes,
    blendBytes,
    samples,
    documentEntries,
    maxEpochs,
  };
}
