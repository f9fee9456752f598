/** @module Planning a sample's window as `.bin` byte ranges, written into a caller's `Float64Array` so serving allocates nothing per sample. */

import type { GptIndices } from "./gpt-indices.ts";
import type { IndexedDatasetIndex } from "./indexed-dataset.ts";

/**
 * Numbers per piece in a plan: `(source, byteOffset, tokenCount)`. Piece `p` of a plan written at
 * `at` is `out[at + 3p]` (source number), `out[at + 3p + 1]` (byte offset in that source's
 * `.bin`) and `out[at + 3p + 2]` (tokens to copy; bytes = tokens × that source's item size).
 * Pieces are in window order; their tokens concatenated are the window.
 */
export const PIECE_STRIDE = 3;

/**
 * Writes the pieces of item `item` of one `GPTDataset` (section 4.7 of the spec): the shuffle
 * index picks a sample-index row, and the window runs from that row's (position, offset) to the
 * next row's, plus the extra token. Empty pieces (empty sequences, or the empty first piece
 * `x = 0` can start with) are left out, so a window of `w` tokens has at most `w` pieces.
 *
 * @param ix the source's indexes
 * @param index the source's parsed `.idx` (lengths, pointers, item size)
 * @param item the `GPTDataset` item, `0 … ix.length-1`
 * @param source the source number written into each piece
 * @param out receives the pieces, {@link PIECE_STRIDE} numbers each
 * @param at index in `out` of the first piece
 * @returns the number of pieces written
 * @throws {RangeError} when `item` is out of range or `out` is too short
 * @example
 * ```ts
 * const out = new Float64Array(3 * (seqLength + 1));
 * const n = planGptWindow(ix, index, 0, 0, out, 0); // out[0..3n) holds the pieces
 * ```
 */
export function planGptWindow(
  ix: GptIndices,
  index: IndexedDatasetIndex,
  item: number,
  source: number,
  out: Float64Array,
  at: number,
): number {
  if (!(item >= 0 && item < ix.length) || !Number.isInteger(item)) {
    throw new RangeError(`Cannot plan item ${item}: expected an integer in 0 … ${ix.length - 1}`);
  }
  const j = ix.shuffleIndex[item];
  const p0 = ix.samplePositions[j];
  const o0 = ix.sampleOffsets[j];
  const p1 = ix.samplePositions[j + 1];
  const o1 = ix.sampleOffsets[j + 1];
  const x = ix.extraToken;
  const doc = ix.documentIndex;
  const { lengths, pointers, itemSize } = index;
  // No closure or object per call: the server plans every sample of every batch through here.
  let k = at;
  if (p0 === p1) {
    k = writePiece(out, k, item, source, pointers[doc[p0]] + o0 * itemSize, o1 - o0 + x);
  } else {
    const first = doc[p0];
    k = writePiece(out, k, item, source, pointers[first] + o0 * itemSize, lengths[first] - o0);
    for (let p = p0 + 1; p < p1; p++) {
      const seq = doc[p];
      k = writePiece(out, k, item, source, pointers[seq], lengths[seq]);
    }
    k = writePiece(out, k, item, source, pointers[doc[p1]], o1 + x);
  }
  return (k - at) / PIECE_STRIDE;
}

function writePiece(out: Float64Array, k: number, item: number, source: number, byteOffset: number, count: number): number {
  if (count <= 0) return k;
  if (k + PIECE_STRIDE > out.length) {
    throw new RangeError(`Cannot plan item ${item}: the output array of ${out.length} numbers is too short`);
  }
  out[k] = source;
  out[k + 1] = byteOffset;
  out[k + 2] = count;
  return k + PIECE_STRIDE;
}
