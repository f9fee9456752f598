/**
 * @module Megatron-LM token datasets, bit-exact: parse `.idx` files, validate a registration, build
 * `GPTDataset`/`BlendedDataset` indexes and plan each sample as `.bin` byte ranges. Web-standard only.
 *
 * @example
 * ```ts
 * import { buildTokenDataset, parseDatasetConfig, parseIndex, PIECE_STRIDE } from "./dataset/mod.ts";
 *
 * const config = parseDatasetConfig(body);
 * const indexes = config.sources.map((s, k) => parseIndex(idxBytes[k], { path: `${s.prefix}.idx`, binSize: binSizes[k] }));
 * const ds = buildTokenDataset(config, indexes);
 * const plan = new Float64Array(PIECE_STRIDE * ds.maxPiecesPerSample);
 * const pieces = ds.planSample(0, plan); // (source, byteOffset, tokenCount) × pieces
 * ```
 */

export { DatasetConfigError, DatasetFormatError, DatasetMemoryError } from "./errors.ts";
export {
  binPathFor,
  checkBinSize,
  DTYPE_CODES,
  encodeIndex,
  type EncodeIndexInput,
  IDX_HEADER_BYTES,
  IDX_MAGIC,
  type IndexedDatasetIndex,
  MAX_SEQUENCES,
  parseIndex,
  type ParseIndexOptions,
  readIndexHeader,
  type TokenDtype,
} from "./indexed-dataset.ts";
export {
  type DatasetConfig,
  type DatasetSourceConfig,
  DEFAULT_MID_LEVEL_DATASET_SURPLUS,
  MAX_SOURCES,
  parseDatasetConfig,
} from "./config.ts";
export { parseSplit, type SequenceRange, splitBookends, splitExists, type SplitIndex, SPLIT_NAMES, splitRange } from "./split.ts";
export { RandomState, type ShuffleTarget } from "./random-state.ts";
export { floorDiv, normalize, pairwiseSum, roundHalfEven } from "./numpy-math.ts";
export {
  buildGptIndices,
  buildSampleIndex,
  type GptIndexOptions,
  type GptIndices,
  MAX_INDEX_ENTRIES,
  numEpochs,
} from "./gpt-indices.ts";
export {
  type BlendingIndices,
  blendSizes,
  type BlendSizes,
  buildBlendingIndices,
  buildExhaustiveBlendingIndices,
  checkNoOversampling,
} from "./blend.ts";
export { PIECE_STRIDE, planGptWindow } from "./sample-plan.ts";
export {
  buildTokenDataset,
  type BuildTokenDatasetOptions,
  servedDtype,
  type TokenDataset,
  type TokenDatasetBlend,
  type TokenDatasetDescription,
  tokenDatasetFromParts,
  type TokenDatasetParts,
  tokenDatasetParts,
  type TokenDatasetSource,
} from "./token-dataset.ts";
export { buildFromIndexFiles, type IndexBuildInput, shareArrays, transferablesOf, unsharedBytes } from "./index-build.ts";
export {
  BLEND_SAMPLE_BYTES,
  DOCUMENT_ENTRY_BYTES,
  estimateIndexMemory,
  indexMemoryLowerBound,
  type IndexMemoryEstimate,
  SAMPLE_BYTES,
} from "./index-memory.ts";
export { PAD_TOKEN, readSample, type TokenArray } from "./read-sample.ts";
