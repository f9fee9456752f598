/** @module Parsing of byte sizes (`512MiB`, `64GiB`, `1TB`) and durations (`250ms`, `2s`) for flags and config files. */

const SIZE_UNITS: Record<string, number> = {
  "": 1,
  b: 1,
  k: 1e3,
  kb: 1e3,
  m: 1e6,
  mb: 1e6,
  g: 1e9,
  gb: 1e9,
  t: 1e12,
  tb: 1e12,
  kib: 2 ** 10,
  mib: 2 ** 20,
  gib: 2 ** 30,
  tib: 2 ** 40,
};

/**
 * Parses a byte size: a non-negative integer, or a number with a unit (`B`, `KB`, `MB`, `GB`,
 * `TB` in powers of 1000; `KiB`, `MiB`, `GiB`, `TiB` in powers of 1024), case-insensitive.
 *
 * @param input the text or number to parse
 * @param what the flag or field name, used in the error message
 * @returns the size in bytes, a safe integer
 * @throws {RangeError} when the text is not a size
 * @example
 * ```ts
 * parseSize("512MiB", "--memory-bytes"); // 536870912
 * ```
 */
export function parseSize(input: string | number, what: string): number {
  if (typeof input === "number") {
    if (Number.isSafeInteger(input) && input >= 0) return input;
    throw new RangeError(`Invalid ${what}: expected a non-negative integer number of bytes, received ${input}`);
  }
  const m = /^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$/.exec(input);
  const unit = m ? SIZE_UNITS[m[2].toLowerCase()] : undefined;
  if (!m || unit === undefined) {
    throw new RangeError(
      `Invalid ${what}: expected a size such as 4096, 512MiB, 64GiB or 1TB, received "${input}"`,
    );
  }
  const bytes = Math.round(Number(m[1]) * unit);
  if (!Number.isSafeInteger(bytes)) {
    throw new RangeError(`Invalid ${what}: "${input}" is too large`);
  }
  return bytes;
}

const DURATION_UNITS: Record<string, number> = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 };

/**
 * Parses a duration: text with a unit `ms`, `s`, `m` or `h`. A number without a unit is refused
 * unless it is 0 (it would be a guess between seconds and milliseconds).
 *
 * @param input the text or number to parse
 * @param what the flag or field name, used in the error message
 * @returns the duration in milliseconds
 * @throws {RangeError} when the text is not a duration, or has no unit and is not 0
 * @example
 * ```ts
 * parseDuration("2s", "--metadata-ttl"); // 2000
 * ```
 */
export function parseDuration(input: string | number, what: string): number {
  // A number with no unit is refused (0 aside): `--read-ahead-seconds 5` read as 5 ms would
  // all but switch read-ahead off without a word.
  if (typeof input === "number") {
    if (input === 0) return 0;
    if (!(Number.isFinite(input) && input > 0)) throw new RangeError(`Invalid ${what}: expected a duration such as 250ms, 2s, 1m or 1h, received ${input}`);
    throw new RangeError(`Invalid ${what}: ${input} has no unit; give a string such as "${input}s" or "${input}ms" (250ms, 2s, 1m or 1h)`);
  }
  const m = /^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$/.exec(input);
  if (!m) {
    throw new RangeError(`Invalid ${what}: expected a duration such as 250ms, 2s, 1m or 1h, received "${input}"`);
  }
  const n = Number(m[1]);
  if (m[2] === undefined && n !== 0) {
    throw new RangeError(`Invalid ${what}: "${input.trim()}" has no unit; write ${m[1]}s or ${m[1]}ms (a duration such as 250ms, 2s, 1m or 1h)`);
  }
  return n * DURATION_UNITS[m[2] ?? "ms"];
}

/**
 * Formats a byte count for people (`8 MiB`, `1.5 GiB`).
 *
 * @param bytes the count
 * @returns a short text
 * @example
 * ```ts
 * formatBytes(8 * 2 ** 20); // "8 MiB"
 * ```
 */
export function formatBytes(bytes: number): string {
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let v = bytes;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return `${Number.isInteger(v) ? v : v.toFixed(1)} ${units[i]}`;
}
