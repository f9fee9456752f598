/** @module Parsing and validation of Megatron-LM indexed dataset `.idx` files (the `MMIDIDX` format) against their `.bin`. */

import { DatasetFormatError } from "./errors.ts";

/** Token dtypes a Megatron `.idx` can declare, by numpy name. */
export type TokenDtype = "uint8" | "int8" | "int16" | "int32" | "int64" | "float64" | "float32" | "uint16";

/** Dtype code (byte 17 of the `.idx`) → numpy name and item size, as Megatron's `DType` enum numbers them. */
export const DTYPE_CODES: Readonly<Record<number, { readonly dtype: TokenDtype; readonly itemSize: number }>> = Object.freeze({
  1: { dtype: "uint8", itemSize: 1 },
  2: { dtype: "int8", itemSize: 1 },
  3: { dtype: "int16", itemSize: 2 },
  4: { dtype: "int32", itemSize: 4 },
  5: { dtype: "int64", itemSize: 8 },
  6: { dtype: "float64", itemSize: 8 },
  7: { dtype: "float32", itemSize: 4 },
  8: { dtype: "uint16", itemSize: 2 },
});

/** The nine magic bytes every `.idx` starts with: `"MMIDIDX"` and two zero bytes. */
export const IDX_MAGIC: Readonly<Uint8Array> = Uint8Array.of(0x4d, 0x4d, 0x49, 0x44, 0x49, 0x44, 0x58, 0x00, 0x00);

/** Size of the fixed header before the arrays. */
export const IDX_HEADER_BYTES = 34;

/**
 * Sequences beyond this are refused: lengths are kept in an `Int32Array` and the document index
 * addresses sequences with 32-bit entries. Such an `.idx` would be over 25 GB.
 */
export const MAX_SEQUENCES = 2 ** 31 - 1;

const TWO_32 = 2 ** 32;

/** A parsed `.idx`: the arrays the dataset layer needs, in aligned typed arrays. */
export interface IndexedDatasetIndex {
  /** The name the index was parsed under (used in error messages). */
  readonly path: string;
  /** Token dtype of the `.bin`. */
  readonly dtype: TokenDtype;
  /** The raw dtype code from the header. */
  readonly dtypeCode: number;
  /** Bytes per token. */
  readonly itemSize: number;
  /** `S`: number of sequences (what the GPT dataset calls documents). */
  readonly sequenceCount: number;
  /** Number of documents (`B - 1`); informational, the GPT dataset never reads boundaries. */
  readonly documentCount: number;
  /** Tokens per sequence. */
  readonly lengths: Int32Array;
  /** Byte offset of each sequence in the `.bin`; exact integers below 2^53. */
  readonly pointers: Float64Array;
  /** First sequence of each document, `B` entries, the last equal to `S`. */
  readonly documentBoundaries: Float64Array;
  /** Whether the multimodal per-sequence mode array follows (GPT ignores it). */
  readonly hasModes: boolean;
  /** Sum of all lengths. */
  readonly totalTokens: number;
  /** Smallest `.bin` size that holds every sequence: max over sequences of pointer + length × itemSize. */
  readonly requiredBinBytes: number;
}

/** Options of {@link parseIndex}. */
export interface ParseIndexOptions {
  /** Name of the `.idx` for error messages (e.g. `origin/path/prefix.idx`). */
  readonly path: string;
  /** Size of the matching `.bin` in bytes; when given, every sequence must lie inside it. */
  readonly binSize?: number;
  /** Name of the `.bin` for error messages; default: `path` with `.idx` replaced by `.bin`. */
  readonly binPath?: string;
}

/**
 * The `.bin` name that goes with an `.idx` name.
 *
 * @param idxPath a name ending in `.idx` (or a bare prefix)
 * @returns the same name ending in `.bin`
 */
export function binPathFor(idxPath: string): string {
  return idxPath.endsWith(".idx") ? `${idxPath.slice(0, -4)}.bin` : `${idxPath}.bin`;
}

function hex(bytes: Uint8Array): string {
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join(" ");
}

/**
 * Reads an unsigned 64-bit little-endian count and refuses values a double cannot hold exactly.
 */
function readU64(view: DataView, offset: number, path: string, what: string): number {
  const lo = view.getUint32(offset, true);
  const hi = view.getUint32(offset + 4, true);
  if (hi >= 2 ** 21) {
    throw new DatasetFormatError(path, `${what} at byte ${offset} is too large (high word ${hi}); expected below 2^53`);
  }
  return hi * TWO_32 + lo;
}

/**
 * Reads and checks a Megatron `.idx` header (magic, version 1, a known dtype, counts a server can
 * hold), without the arrays after it.
 *
 * @param u8 the index file, or at least its first `IDX_HEADER_BYTES`
 * @param path named in errors
 * @returns the dtype code, the sequence count and the document boundary count (documents + 1)
 * @throws {DatasetFormatError} for a header that is not one
 */
export function readIndexHeader(u8: Uint8Array, path: string): { dtypeCode: number; sequenceCount: number; boundaryCount: number } {
  if (u8.byteLength < IDX_HEADER_BYTES) {
    throw new DatasetFormatError(path, `truncated: ${u8.byteLength} bytes, the header alone needs ${IDX_HEADER_BYTES}`);
  }
  for (let i = 0; i < IDX_MAGIC.length; i++) {
    if (u8[i] !== IDX_MAGIC[i]) {
      throw new DatasetFormatError(
        path,
        `bad magic bytes ${hex(u8.subarray(0, IDX_MAGIC.length))} (expected ${hex(IDX_MAGIC)}); not a Megatron MMIDIDX index`,
      );
    }
  }
  const view = new DataView(u8.buffer, u8.byteOffset, u8.byteLength);
  const versionLo = view.getUint32(9, true);
  const versionHi = view.getUint32(13, true);
  if (versionLo !== 1 || versionHi !== 0) {
    throw new DatasetFormatError(path, `unsupported version ${versionHi * TWO_32 + versionLo} (expected 1)`);
  }
  const dtypeCode = u8[17];
  if (DTYPE_CODES[dtypeCode] === undefined) {
    throw new DatasetFormatError(path, `unknown dtype code ${dtypeCode} (expected 1 … 8)`);
  }
  const s = readU64(view, 18, path, "sequence count");
  const b = readU64(view, 26, path, "document boundary count");
  if (s > MAX_SEQUENCES) {
    throw new DatasetFormatError(path, `${s} sequences exceed the supported maximum of ${MAX_SEQUENCES}`);
  }
  if (b < 1) {
    throw new DatasetFormatError(path, `document boundary count is 0 (expected at least 1: documents + 1)`);
  }
  return { dtypeCode, sequenceCount: s, boundaryCount: b };
}

/**
 * Parses and validates a Megatron `.idx` file. Everything megatron-core checks is checked
 * (magic, version 1, `boundaries[B-1] == S`), plus what a server must not trust blindly: known
 * dtype code, a file size that matches the declared counts, non-negative lengths and pointers,
 * and, when `binSize` is given, every sequence inside the `.bin`.
 *
 * @param bytes the whole `.idx` file
 * @param options the file's name for messages, and optionally the `.bin` size to check against
 * @returns the parsed index, with aligned copies of its arrays
 * @throws {DatasetFormatError} naming the file, on any malformed or inconsistent content
 * @example
 * ```ts
 * const index = parseIndex(idxBytes, { path: "data/pub_i32_b.idx", binSize: 193964 });
 * index.dtype; // "int32"
 * index.lengths[1]; // 265
 * ```
 */
export function parseIndex(bytes: Uint8Array | ArrayBuffer, options: ParseIndexOptions): IndexedDatasetIndex {
  const path = options.path;
  const u8 = bytes instanceof Uint8Array ? bytes : new Uint8Array(bytes);
  const { dtypeCode, sequenceCount: s, boundaryCount: b } = readIndexHeader(u8, path);
  const dt = DTYPE_CODES[dtypeCode];
  const view = new DataView(u8.buffer, u8.byteOffset, u8.byteLength);
  const expected = IDX_HEADER_BYTES + 12 * s + 8 * b;
  if (u8.byteLength < expected) {
    throw new DatasetFormatError(
      path,
      `truncated: ${s} sequences and ${b} document boundaries need ${expected} bytes, file has ${u8.byteLength}`,
    );
  }
  const hasModes = u8.byteLength === expected + s && s > 0;
  if (u8.byteLength !== expected && !hasModes) {
    throw new DatasetFormatError(
      path,
      `size ${u8.byteLength} bytes does not match the ${s} sequences and ${b} document boundaries it declares ` +
        `(expected ${expected}, or ${expected + s} with a mode array)`,
    );
  }

  const itemSize = dt.itemSize;
  const lengths = new Int32Array(s);
  const pointers = new Float64Array(s);
  let totalTokens = 0;
  let requiredBinBytes = 0;
  const lengthsAt = IDX_HEADER_BYTES;
  const pointersAt = lengthsAt + 4 * s;
  // The arrays sit at unaligned offsets, so a typed-array view would throw: read through the DataView.
  for (let k = 0; k < s; k++) {
    const len = view.getInt32(lengthsAt + 4 * k, true);
    if (len < 0) throw new DatasetFormatError(path, `sequence ${k} has negative length ${len}`);
    const at = pointersAt + 8 * k;
    const lo = view.getUint32(at, true);
    const hi = view.getInt32(at + 4, true);
    if (hi < 0 || hi >= 2 ** 21) {
      throw new DatasetFormatError(
        path,
        `sequence ${k} has pointer ${BigInt.asIntN(64, (BigInt(hi) << 32n) | BigInt(lo))} (expected 0 … 2^53-1)`,
      );
    }
    const ptr = hi * TWO_32 + lo;
    // Megatron's writer keeps every sequence at a whole token; a pointer inside a token would
    // make every read of that sequence straddle tokens (and a widened read run past a block).
    if (ptr % itemSize !== 0) {
      throw new DatasetFormatError(path, `sequence ${k} has pointer ${ptr}, not a multiple of its ${itemSize}-byte tokens`);
    }
    lengths[k] = len;
    pointers[k] = ptr;
    totalTokens += len;
    const end = ptr + len * itemSize;
    if (end > requiredBinBytes) requiredBinBytes = end;
  }
  const boundariesAt = pointersAt + 8 * s;
  const documentBoundaries = new Float64Array(b);
  for (let d = 0; d < b; d++) {
    const at = boundariesAt + 8 * d;
    // Signed 64-bit; values beyond 2^53 lose precision, which is harmless: only the last is checked.
    documentBoundaries[d] = view.getInt32(at + 4, true) * TWO_32 + view.getUint32(at, true);
  }
  if (documentBoundaries[b - 1] !== s) {
    throw new DatasetFormatError(path, `last document boundary is ${documentBoundaries[b - 1]} (expected the sequence count ${s})`);
  }

  const index: IndexedDatasetIndex = Object.freeze({
    path,
    dtype: dt.dtype,
    dtypeCode,
    itemSize,
    sequenceCount: s,
    documentCount: b - 1,
    lengths,
    pointers,
    documentBoundaries,
    hasModes,
    totalTokens,
    requiredBinBytes,
  });
  if (options.binSize !== undefined) checkBinSize(index, options.binSize, options.binPath);
  return index;
}

/**
 * Checks that every sequence of a parsed index lies inside a `.bin` of `binSize` bytes, for
 * callers that learn the `.bin` size after parsing the `.idx`.
 *
 * @param index a parsed index
 * @param binSize the `.bin` size in bytes
 * @param binPath the `.bin` name for the message (default derived from `index.path`)
 * @throws {DatasetFormatError} naming the `.idx` when a sequence ends past the `.bin`'s end
 * @example
 * ```ts
 * checkBinSize(index, 193964); // ok
 * checkBinSize(index, 100); // throws: ... sequences need at least 193964 bytes but "data/pub_i32_b.bin" has 100
 * ```
 */
export function checkBinSize(index: IndexedDatasetIndex, binSize: number, binPath = binPathFor(index.path)): void {
  if (!Number.isSafeInteger(binSize) || binSize < 0) {
    throw new RangeError(`Cannot check "${binPath}": size must be a non-negative integer, received ${binSize}`);
  }
  if (index.requiredBinBytes <= binSize) return;
  const { lengths, pointers, itemSize } = index;
  let k = 0;
  while (k < lengths.length && pointers[k] + lengths[k] * itemSize <= binSize) k++;
  throw new DatasetFormatError(
    index.path,
    `counts do not match the .bin: sequences need at least ${index.requiredBinBytes} bytes but "${binPath}" has ${binSize} ` +
      `(sequence ${k}, ${lengths[k]} tokens at byte ${pointers[k]}, ends at byte ${pointers[k] + lengths[k] * itemSize})`,
  );
}

/** Contents of an `.idx` to write with {@link encodeIndex}. */
export interface EncodeIndexInput {
  /** Token dtype code (1 … 8). */
  readonly dtypeCode: number;
  /** Tokens per sequence. */
  readonly lengths: ArrayLike<number>;
  /** Byte offsets in the `.bin`; default: back to back from 0, as Megatron's writer lays them out. */
  readonly pointers?: ArrayLike<number>;
  /** First sequence of each document plus a final `S`; default: one sequence per document. */
  readonly documentBoundaries?: ArrayLike<number>;
  /** Multimodal per-sequence modes, written after the boundaries when given. */
  readonly modes?: ArrayLike<number>;
}

/**
 * Writes an `.idx` the way Megatron's `IndexedDatasetBuilder` does, for generated datasets
 * (the demo, tests, benchmarks).
 *
 * @param input dtype code, lengths and optionally pointers, boundaries and modes
 * @returns the file's bytes
 * @throws {RangeError} on an unknown dtype code or arrays of the wrong length
 * @example
 * ```ts
 * const idx = encodeIndex({ dtypeCode: 8, lengths: [3, 5] });
 * parseIndex(idx, { path: "gen.idx" }).pointers; // [0, 6]
 * ```
 */
export function encodeIndex(input: EncodeIndexInput): Uint8Array {
  const dt = DTYPE_CODES[input.dtypeCode];
  if (dt === undefined) throw new RangeError(`Cannot encode index: unknown dtype code ${input.dtypeCode}`);
  const s = input.lengths.length;
  const boundaries = input.documentBoundaries;
  const b = boundaries === undefined ? s + 1 : boundaries.length;
  if (input.pointers !== undefined && input.pointers.length !== s) {
    throw new RangeError(`Cannot encode index: ${input.pointers.length} pointers for ${s} sequences`);
  }
  if (input.modes !== undefined && input.modes.length !== s) {
    throw new RangeError(`Cannot encode index: ${input.modes.length} modes for ${s} sequences`);
  }
  const size = IDX_HEADER_BYTES + 12 * s + 8 * b + (input.modes === undefined ? 0 : s);
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  out.set(IDX_MAGIC, 0);
  view.setUint32(9, 1, true);
  out[17] = input.dtypeCode;
  const setU64 = (at: number, v: number): void => {
    view.setUint32(at, v % TWO_32, true);
    view.setInt32(at + 4, Math.floor(v / TWO_32), true);
  };
  setU64(18, s);
  setU64(26, b);
  const pointersAt = IDX_HEADER_BYTES + 4 * s;
  let next = 0;
  for (let k = 0; k < s; k++) {
    view.setInt32(IDX_HEADER_BYTES + 4 * k, input.lengths[k], true);
    const ptr = input.pointers === undefined ? next : input.pointers[k];
    setU64(pointersAt + 8 * k, ptr);
    next += input.lengths[k] * dt.itemSize;
  }
  const boundariesAt = pointersAt + 8 * s;
  for (let d = 0; d < b; d++) setU64(boundariesAt + 8 * d, boundaries === undefined ? d : boundaries[d]);
  if (input.modes !== undefined) {
    for (let k = 0; k < s; k++) out[boundariesAt + 8 * b + k] = input.modes[k];
  }
  return out;
}
