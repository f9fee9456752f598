/** @module Assembling a sample's tokens from in-memory `.bin` buffers, following its plan (small datasets, demos, tests). */

import type { TokenDtype } from "./indexed-dataset.ts";
import { PIECE_STRIDE } from "./sample-plan.ts";
import type { TokenDataset } from "./token-dataset.ts";

/** Typed arrays a window can be read into. A `BigInt64Array` receives tokens widened to int64, as Megatron returns them. */
export type TokenArray =
  | Uint8Array
  | Int8Array
  | Int16Array
  | Uint16Array
  | Int32Array
  | Float32Array
  | Float64Array
  | BigInt64Array;

/** Megatron's pad id when the tokenizer has none; only a keep-partial last window is padded. */
export const PAD_TOKEN = -1;

const LITTLE_ENDIAN = new Uint8Array(Uint16Array.of(1).buffer)[0] === 1;

const SAME_LAYOUT: Record<TokenDtype, (a: TokenArray) => boolean> = {
  uint8: (a) => a instanceof Uint8Array,
  int8: (a) => a instanceof Int8Array,
  int16: (a) => a instanceof Int16Array,
  uint16: (a) => a instanceof Uint16Array,
  int32: (a) => a instanceof Int32Array,
  int64: (a) => a instanceof BigInt64Array,
  float32: (a) => a instanceof Float32Array,
  float64: (a) => a instanceof Float64Array,
};

function readToken(view: DataView, at: number, dtype: TokenDtype): number {
  switch (dtype) {
    case "uint8":
      return view.getUint8(at);
    case "int8":
      return view.getInt8(at);
    case "int16":
      return view.getInt16(at, true);
    case "uint16":
      return view.getUint16(at, true);
    case "int32":
      return view.getInt32(at, true);
    case "int64":
      return Number(view.getBigInt64(at, true));
    case "float32":
      return view.getFloat32(at, true);
    case "float64":
      return view.getFloat64(at, true);
  }
}

/**
 * Reads sample `i` of a dataset from the sources' whole `.bin` files held in memory: plans the
 * window, then copies each piece (a byte copy when `out` has the source's dtype on a
 * little-endian host, a converting loop otherwise). A short keep-partial window is padded with
 * {@link PAD_TOKEN}.
 *
 * @param dataset the built dataset
 * @param bins each source's `.bin` bytes, in source order
 * @param i the sample
 * @param out receives `dataset.windowLength` tokens from index 0
 * @param scratch optional plan buffer of at least `PIECE_STRIDE × dataset.maxPiecesPerSample` numbers, reused across calls
 * @returns the number of tokens read from the files (the rest of the window is padding)
 * @throws {RangeError} when `i` is out of range, `out` is too short, or a piece lies outside its `.bin`
 * @example
 * ```ts
 * const out = new Uint16Array(ds.windowLength);
 * readSample(ds, [binBytes], 0, out);
 * ```
 */
export function readSample(
  dataset: TokenDataset,
  bins: readonly Uint8Array[],
  i: number,
  out: TokenArray,
  scratch: Float64Array = new Float64Array(PIECE_STRIDE * dataset.maxPiecesPerSample),
): number {
  const w = dataset.windowLength;
  if (out.length < w) throw new RangeError(`Cannot read sample ${i}: output holds ${out.length} tokens, the window has ${w}`);
  const pieces = dataset.planSample(i, scratch, 0);
  let dst = 0;
  for (let p = 0; p < pieces; p++) {
    const source = scratch[PIECE_STRIDE * p];
    const byteOffset = scratch[PIECE_STRIDE * p + 1];
    const count = scratch[PIECE_STRIDE * p + 2];
    const { dtype, itemSize, path } = dataset.sources[source].index;
    const bin = bins[source];
    const byteEnd = byteOffset + count * itemSize;
    if (bin === undefined || byteEnd > bin.byteLength) {
      throw new RangeError(`Cannot read sample ${i}: bytes ${byteOffset}-${byteEnd - 1} lie outside the .bin of "${path}"`);
    }
    if (dst + count > w) throw new RangeError(`Cannot read sample ${i}: its pieces exceed the window of ${w} tokens`);
    if (LITTLE_ENDIAN && SAME_LAYOUT[dtype](out)) {
      new Uint8Array(out.buffer, out.byteOffset + dst * itemSize, count * itemSize).set(bin.subarray(byteOffset, byteEnd));
    } else {
      const view = new DataView(bin.buffer, bin.byteOffset, bin.byteLength);
      if (out instanceof BigInt64Array) {
        for (let t = 0; t < count; t++) {
          const at = byteOffset + t * itemSize;
          // numpy's astype(int64) truncates float tokens toward zero.
          out[dst + t] = dtype === "int64" ? view.getBigInt64(at, true) : BigInt(Math.trunc(readToken(view, at, dtype)));
        }
      } else {
        for (let t = 0; t < count; t++) out[dst + t] = readToken(view, byteOffset + t * itemSize, dtype);
      }
    }
    dst += count;
  }
  const tokens = dst;
  if (out instanceof BigInt64Array) out.fill(BigInt(PAD_TOKEN), dst, w);
  else out.fill(PAD_TOKEN, dst, w);
  return tokens;
}
