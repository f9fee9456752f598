/** @module Loading the shared Megatron test vectors (`vectors/megatron/`) for the dataset tests. */

import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { join } from "node:path";

/**
 * Folder of the Megatron vectors: `$MEGATRON_VECTORS`, else the copy in `test/vectors/megatron`
 * (vendored from the project's shared vectors so a fresh clone tests without `../shared`).
 */
export const VECTOR_DIR: string = process.env.MEGATRON_VECTORS ??
  fileURLToPath(new URL("../vectors/megatron/", import.meta.url));

/**
 * Reads a vector file as bytes.
 *
 * @param rel path inside the vector folder
 * @returns the bytes
 */
export function vectorBytes(rel: string): Uint8Array {
  return new Uint8Array(readFileSync(join(VECTOR_DIR, rel)));
}

/**
 * Reads and parses a JSON vector file.
 *
 * @param rel path inside the vector folder
 * @returns the parsed JSON
 */
// deno-lint-ignore no-explicit-any -- callers type the vector themselves
export function vectorJson<T = any>(rel: string): T {
  return JSON.parse(readFileSync(join(VECTOR_DIR, rel), "utf8")) as T;
}

/**
 * Parses a C99 hexadecimal double such as `0x1.3333333333333p-2` exactly.
 *
 * @param hex the literal (normal numbers only, as numpy's `float.hex()` writes them)
 * @returns the double
 */
export function hexDouble(hex: string): number {
  const m = /^(-?)0x([01])\.([0-9a-f]{13})p([+-]\d+)$/.exec(hex);
  if (!m) throw new Error(`not a hex double: ${hex}`);
  const mant = Number(m[2]) * 2 ** 52 + parseInt(m[3], 16);
  const v = mant * 2 ** (Number(m[4]) - 52);
  return m[1] === "-" ? -v : v;
}

/**
 * SHA-256 of values written as little-endian int64, as the vectors hash token arrays.
 *
 * @param values integers
 * @returns the hex digest
 */
export function sha256Int64(values: ArrayLike<number>): string {
  const big = new BigInt64Array(values.length);
  for (let i = 0; i < values.length; i++) big[i] = BigInt(values[i]);
  return createHash("sha256").update(new Uint8Array(big.buffer)).digest("hex");
}
