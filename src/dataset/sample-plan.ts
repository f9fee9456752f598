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

/** Sample-index rows, then document positions, of the items being read ahead (`readGptIndexes`): reused, no allocation per batch. */
let startScratch = new Uint32Array(64);
let endScratch = new Uint32Array(64);
/** The documents of those items, in order (at most this many are read level by level). */
const docScratch = new Uint32Array(4096);

/**
 * Reads the index entries that planning `items` of one `GPTDataset` will read (shuffle row,
 * sample positions and offset, documents, their pointers and lengths), level by level across the
 * items. Planning one item at a time is a chain of dependent loads, each a cache miss in a large
 * dataset while batches stream through the cache (~0.5 µs per item); here the loads of one level
 * are independent of each other, so the processor overlaps their misses, and the planning that
 * follows finds the entries in cache.
 *
 * @param items the items, `count` of them
 * @returns a number that depends on every entry read (so the reads cannot be left out)
 */
export function readGptIndexes(ix: GptIndices, index: IndexedDatasetIndex, items: ArrayLike<number>, count: number): number {
  if (startScratch.length < count) {
    startScratch = new Uint32Array(count * 2);
    endScratch = new Uint32Array(count * 2);
  }
  const starts = startScratch;
  const ends = endScratch;
  const { shuffleIndex, samplePositions, sampleOffsets, documentIndex } = ix;
  const { pointers, lengths } = index;
  const n = ix.length;
  let acc = 0;
  for (let k = 0; k < count; k++) {
    const item = items[k];
    // Out of range: the planning that follows raises the error.
    starts[k] = item >= 0 && item < n ? shuffleIndex[item] : 0;
  }
  for (let k = 0; k < count; k++) {
    const row = starts[k];
    acc += sampleOffsets[row];
    starts[k] = samplePositions[row];
    ends[k] = samplePositions[row + 1];
  }
  // The documents first, then their pointers, then their lengths: each level's loads independent
  // of each other (4 % less event loop per token batch than reading a document's pointer and
  // length right after it). Beyond the scratch's room, the rest are read as they come.
  const docs = docScratch;
  let m = 0;
  for (let k = 0; k < count; k++) {
    for (let p = starts[k]; p <= ends[k]; p++) {
      if (m < docs.length) docs[m++] = documentIndex[p];
      else {
        const doc = documentIndex[p];
        acc += pointers[doc] + lengths[doc];
      }
    }
  }
  for (let j = 0; j < m; j++) acc += pointers[docs[j]];
  for (let j = 0; j < m; j++) acc += lengths[docs[j]];
  return acc;
}
