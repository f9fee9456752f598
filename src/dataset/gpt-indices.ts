/** @module megatron-core `GPTDataset` indexes: epochs, document index, sample index and shuffle index, in typed arrays. */

import { DatasetConfigError } from "./errors.ts";
import { floorDiv } from "./numpy-math.ts";
import { RandomState } from "./random-state.ts";

/**
 * Entries beyond this are refused for the document index and the sample rows: both are kept
 * in 32-bit typed arrays (4 bytes per entry), and arrays this long would take 16 GiB each.
 * It also keeps every shuffle on numpy's 32-bit draw branch.
 */
export const MAX_INDEX_ENTRIES = 2 ** 32 - 1;

/** Inputs of one `GPTDataset` (section 4 of the spec). */
export interface GptIndexOptions {
  /** Lengths of every sequence of the `.idx` (not only the split's). */
  readonly lengths: Int32Array;
  /** First sequence of the split. */
  readonly begin: number;
  /** One past the last sequence of the split. */
  readonly end: number;
  /** `L`, tokens per sample without the extra one. */
  readonly seqLength: number;
  /** `RandomState` seed. */
  readonly seed: number;
  /** `N`, samples requested; `undefined` builds exactly one epoch (Megatron's `num_samples=None`). */
  readonly numSamples: number | undefined;
  /** `add_extra_token_to_sequence` (`x = 1`). */
  readonly addExtraToken: boolean;
  /** Valid split with `drop_last_partial_validation_sequence = false`: keep a short last window. */
  readonly keepPartial: boolean;
  /** Config field named in errors (e.g. `sources[1]`); default `sources[0]`. */
  readonly field?: string;
  /** Source named in errors (its prefix). */
  readonly label?: string;
}

/** The three index arrays of one `GPTDataset` and the numbers they were derived from. */
export interface GptIndices {
  /** Sequence numbers in stream order, `E × |docs|` entries. */
  readonly documentIndex: Int32Array;
  /** Row `s` of the sample index: position in `documentIndex` where window `s` starts; `length + 1` rows. */
  readonly samplePositions: Uint32Array;
  /** Row `s` of the sample index: token offset in that sequence; `length + 1` rows. */
  readonly sampleOffsets: Int32Array;
  /** Dataset item → sample-index row, `length` entries. */
  readonly shuffleIndex: Uint32Array;
  /** `S_count`: the dataset length (>= the samples requested). */
  readonly length: number;
  /** `T`: tokens in one pass over the split. */
  readonly tokensPerEpoch: number;
  /** `E`. */
  readonly epochs: number;
  /** Whether the final epoch was shuffled on its own. */
  readonly separateFinalEpoch: boolean;
  /** With `E > 1`: samples before the final epoch (`F`). */
  readonly samplesBeforeFinalEpoch: number | undefined;
  /** With `E > 1`: whole samples in one epoch. */
  readonly samplesPerEpoch: number | undefined;
  /** `1` with `add_extra_token_to_sequence`, else `0`. */
  readonly extraToken: 0 | 1;
  /** `L`. */
  readonly seqLength: number;
}

/**
 * The epoch count `E`: the smallest integer >= 1 with `E × T >= N × L + x`. megatron-core finds
 * it by adding `T` until the total is big enough, which never ends for `T = 0`; this computes
 * it directly and refuses that input.
 *
 * @param tokensPerEpoch `T`, a positive safe integer
 * @param tokensNeeded `N × L + x`, a non-negative safe integer
 * @returns `E`
 * @throws {DatasetConfigError} (field `num_samples`) when `T` is 0 and tokens are needed, as
 *   megatron-core would loop forever there
 * @throws {RangeError} when an argument is not a safe integer in range
 * @example
 * ```ts
 * numEpochs(47022, 450 * 128 + 1); // 2
 * ```
 */
export function numEpochs(tokensPerEpoch: number, tokensNeeded: number): number {
  if (!Number.isSafeInteger(tokensNeeded) || tokensNeeded < 0) {
    throw new RangeError(`Cannot count epochs: tokens needed must be a non-negative safe integer, received ${tokensNeeded}`);
  }
  if (!Number.isSafeInteger(tokensPerEpoch) || tokensPerEpoch < 0) {
    throw new RangeError(`Cannot count epochs: tokens per epoch must be a non-negative safe integer, received ${tokensPerEpoch}`);
  }
  if (tokensNeeded <= tokensPerEpoch) return 1;
  if (tokensPerEpoch === 0) {
    throw new DatasetConfigError("num_samples", `${tokensNeeded} tokens requested from a split of 0 tokens; expected a split holding at least 2 tokens`);
  }
  // ceil(needed / T) is within one of the answer (the division may round); both loops below
  // move at most a step or two because the products are monotone in e.
  let e = Math.max(1, Math.ceil(tokensNeeded / tokensPerEpoch));
  while (e > 1 && (e - 1) * tokensPerEpoch >= tokensNeeded) e--;
  while (e * tokensPerEpoch < tokensNeeded) e++;
  return e;
}

/**
 * Builds the document, sample and shuffle indexes of one `GPTDataset` exactly as megatron-core
 * does, with one `RandomState(seed)` used by the document shuffle(s) then the shuffle-index
 * shuffle(s). Refuses, instead of imitating, the inputs on which megatron-core hangs or aborts.
 *
 * Memory: 4 bytes per document-index entry (`E × |docs|`) and 12 bytes per sample.
 *
 * @param opts the split's range, lengths and sampling parameters
 * @returns the indexes
 * @throws {DatasetConfigError} when the split holds at most one token, the arrays would exceed
 *   {@link MAX_INDEX_ENTRIES}, or a keep-partial build hits one of megatron-core's asserts
 * @example
 * ```ts
 * const ix = buildGptIndices({
 *   lengths: Int32Array.of(5, 3, 8), begin: 0, end: 3, seqLength: 4, seed: 1,
 *   numSamples: 3, addExtraToken: true, keepPartial: false,
 * });
 * ix.length; // 3
 * ```
 */
export function buildGptIndices(opts: GptIndexOptions): GptIndices {
  const { lengths, begin, end, seqLength: L, seed, numSamples: N } = opts;
  const x: 0 | 1 = opts.addExtraToken ? 1 : 0;
  const field = opts.field ?? "sources[0]";
  const label = opts.label === undefined ? "" : ` of "${opts.label}"`;
  if (!Number.isInteger(begin) || !Number.isInteger(end) || begin < 0 || end < begin || end > lengths.length) {
    throw new RangeError(`Cannot build GPT indexes: range [${begin}, ${end}) is not inside 0 … ${lengths.length}`);
  }
  if (!Number.isInteger(L) || L < 2) {
    throw new DatasetConfigError("seq_length", `expected an integer >= 2, received ${L}`);
  }
  if (!Number.isInteger(opts.seed) || seed < 0 || seed > 0xffffffff) {
    throw new DatasetConfigError("seed", `expected an integer in 0 … 4294967295, received ${seed}`);
  }
  if (N !== undefined && (!Number.isSafeInteger(N) || N < 0)) {
    throw new DatasetConfigError("num_samples", `expected a non-negative safe integer or undefined, received ${N}`);
  }
  const docCount = end - begin;
  let T = 0;
  for (let d = begin; d < end; d++) {
    const len = lengths[d];
    // parseIndex refuses negative lengths; a hand-made array could still carry one.
    if (len < 0) throw new RangeError(`Cannot build GPT indexes: sequence ${d}${label} has length ${len}, expected >= 0`);
    T += len;
  }
  // Megatron loops forever on T = 0 and asserts T > 1 in its C++ helper.
  if (T <= 1) {
    throw new DatasetConfigError(
      field,
      `split range [${begin}, ${end})${label} holds ${T} token${T === 1 ? "" : "s"}; at least 2 are needed (choose another split or more data)`,
    );
  }

  let E = 1;
  if (N !== undefined) {
    const needed = N * L + x;
    if (!Number.isSafeInteger(needed)) {
      throw new DatasetConfigError("num_samples", `${N} samples of ${L} tokens exceed 2^53 tokens`);
    }
    E = numEpochs(T, needed);
  }

  let separate = false;
  let samplesBeforeFinal: number | undefined;
  let samplesPerEpoch: number | undefined;
  if (E > 1 && N !== undefined) {
    samplesBeforeFinal = floorDiv((E - 1) * T - x, L);
    const samplesInFinal = N - samplesBeforeFinal;
    samplesPerEpoch = floorDiv(T - x, L);
    if (samplesInFinal < 0 || samplesInFinal > samplesPerEpoch + 1) {
      // Megatron asserts both bounds; the epoch rule above makes them unreachable.
      throw new Error(`GPT index invariant broken: ${samplesInFinal} samples in the final epoch of ${samplesPerEpoch}`);
    }
    separate = samplesInFinal < Math.trunc(0.8 * samplesPerEpoch);
  }

  const docEntries = E * docCount;
  if (docEntries > MAX_INDEX_ENTRIES) {
    throw new DatasetConfigError(
      "num_samples",
      `${E} epochs over ${docCount} sequences${label} need a document index of ${docEntries} entries; at most ${MAX_INDEX_ENTRIES} are supported`,
    );
  }
  const streamTokens = E * T;
  if (!Number.isSafeInteger(streamTokens)) {
    throw new DatasetConfigError("num_samples", `${E} epochs of ${T} tokens${label} exceed 2^53 tokens; expected fewer samples`);
  }
  const sCount = opts.keepPartial
    ? Math.ceil(Math.fround(Math.fround(streamTokens - x) / Math.fround(L)))
    : floorDiv(streamTokens - x, L);
  if (sCount + 1 > MAX_INDEX_ENTRIES) {
    throw new DatasetConfigError("num_samples", `${sCount} samples${label} exceed the supported ${MAX_INDEX_ENTRIES - 1}`);
  }
  if (N !== undefined && N > sCount) {
    // Only the single-precision keep-partial count can fall short; megatron-core's builder asserts.
    throw new DatasetConfigError("num_samples", `${N} samples requested but the split${label} yields ${sCount}`);
  }

  const rs = new RandomState(seed);

  const documentIndex = new Int32Array(docEntries);
  for (let e = 0, at = 0; e < E; e++) {
    for (let d = begin; d < end; d++) documentIndex[at++] = d;
  }
  if (separate) {
    const firstPart = (E - 1) * docCount;
    rs.shuffle(documentIndex.subarray(0, firstPart));
    rs.shuffle(documentIndex.subarray(firstPart));
  } else {
    rs.shuffle(documentIndex);
  }

  const { positions, offsets } = buildSampleIndex(lengths, documentIndex, L, x, sCount, field, label);

  const shuffleIndex = new Uint32Array(sCount);
  for (let s = 0; s < sCount; s++) shuffleIndex[s] = s;
  if (separate && samplesBeforeFinal !== undefined && samplesBeforeFinal < sCount) {
    rs.shuffle(shuffleIndex.subarray(0, samplesBeforeFinal));
    rs.shuffle(shuffleIndex.subarray(samplesBeforeFinal));
  } else {
    rs.shuffle(shuffleIndex);
  }

  return Object.freeze({
    documentIndex,
    samplePositions: positions,
    sampleOffsets: offsets,
    shuffleIndex,
    length: sCount,
    tokensPerEpoch: T,
    epochs: E,
    separateFinalEpoch: separate,
    samplesBeforeFinalEpoch: samplesBeforeFinal,
    samplesPerEpoch,
    extraToken: x,
    seqLength: L,
  });
}

/**
 * Megatron's `build_sample_idx` walk: row `s` is where window `s` starts, as (position in the
 * document index, token offset); `sampleCount + 1` rows. With `x = 1` a row names the last token
 * of the previous window, which is also the first of the next: consecutive windows overlap by one
 * token. Empty sequences are stepped over. Only a keep-partial count reaches the end of the
 * stream, on its last row, which then ends at the last token of the stream.
 *
 * @param lengths tokens per sequence of the `.idx`
 * @param documentIndex sequence numbers in stream order (non-empty)
 * @param L tokens per sample without the extra one
 * @param x 1 with the extra token, else 0
 * @param sampleCount rows to produce after row 0
 * @param field config field named in errors (default `sources[0]`)
 * @param label source named in errors (default none)
 * @returns the rows as two parallel arrays
 * @throws {DatasetConfigError} where megatron-core asserts: the stream ends before the last row,
 *   or the short final window would end in an empty sequence
 * @example
 * ```ts
 * const { positions, offsets } = buildSampleIndex(Int32Array.of(5, 3, 8), Int32Array.of(2, 0, 1), 4, 1, 3);
 * // rows (0,0) (0,4) (1,0) (1,4)
 * ```
 */
export function buildSampleIndex(
  lengths: Int32Array,
  documentIndex: Int32Array,
  L: number,
  x: 0 | 1,
  sampleCount: number,
  field = "sources[0]",
  label = "",
): { positions: Uint32Array; offsets: Int32Array } {
  if (!Number.isInteger(L) || L < 2) {
    throw new DatasetConfigError("seq_length", `expected an integer >= 2, received ${L}`);
  }
  if (!Number.isInteger(sampleCount) || sampleCount < 0 || sampleCount + 1 > MAX_INDEX_ENTRIES) {
    throw new DatasetConfigError("num_samples", `expected a sample count in 0 … ${MAX_INDEX_ENTRIES - 1}, received ${sampleCount}`);
  }
  const sCount = sampleCount;
  const positions = new Uint32Array(sCount + 1);
  const offsets = new Int32Array(sCount + 1);
  if (sCount === 0) return { positions, offsets };
  const docCount = documentIndex.length;
  if (docCount === 0) {
    throw new DatasetConfigError(field, `the document index${label} is empty but ${sCount} samples were asked of it; expected at least one sequence`);
  }
  for (let p = 0; p < docCount; p++) {
    const len = lengths[documentIndex[p]];
    // An entry outside `lengths` would read `undefined` and turn every count below into NaN.
    if (len === undefined || len < 0) {
      throw new RangeError(
        `Cannot build the sample index${label}: document index entry ${p} is sequence ${documentIndex[p]}, expected one of 0 … ${lengths.length - 1}`,
      );
    }
  }
  const lastPos = docCount - 1;
  let pos = 0;
  let off = 0;
  // Every step of the inner loop either ends the row or advances `pos`, and `pos` never passes
  // `lastPos`, so the walk is bounded by sCount + docCount steps even on bad input.
  for (let s = 1; s <= sCount; s++) {
    let need = L + x;
    for (;;) {
      const len = lengths[documentIndex[pos]];
      const avail = len - off;
      need -= avail;
      if (need <= 0) {
        off += avail + need - x;
        break;
      }
      if (pos === lastPos) {
        // Only the keep-partial count reaches the end of the stream, and only on its last row.
        if (s !== sCount) {
          // Reached only when a keep-partial single-precision count overshoots the stream.
          throw new DatasetConfigError(
            "drop_last_partial_validation_sequence",
            `the token stream${label} ends at row ${s} of the sample index, but ${sCount} samples of ${L} tokens were asked ` +
              `(expected at most ${s}, the last one short; megatron-core asserts here)`,
          );
        }
        off = len - x;
        if (off < 0) {
          throw new DatasetConfigError(
            field,
            `the last sequence in the document index${label} is empty, so the short final window has no end (megatron-core asserts here)`,
          );
        }
        break;
      }
      pos++;
      off = 0;
    }
    positions[s] = pos;
    offsets[s] = off;
  }
  return { positions, offsets };
}
