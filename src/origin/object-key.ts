/** @module Validation of object keys, so a key can never name anything outside its origin. */

import { badRequest } from "../errors.ts";

/** Longest key accepted, in UTF-8 bytes (the S3 limit). */
export const MAX_KEY_BYTES = 1024;

/**
 * Decodes the percent-encoded path segments of a request into an object key, refusing
 * anything that could escape the origin: `.`/`..` segments (also when encoded as `%2e`),
 * encoded slashes or backslashes inside a segment, empty segments (`//`, a leading `/`),
 * control characters including NUL, and keys longer than `MAX_KEY_BYTES`.
 *
 * @param rawSegments the path segments as they appear in the URL, still percent-encoded
 * @returns the key, segments joined by `/`
 * @throws {CacheServerError} `BAD_REQUEST` naming the offending segment
 * @example
 * ```ts
 * decodeObjectKey(["shards", "part%2D0001.bin"]); // "shards/part-0001.bin"
 * ```
 */
export function decodeObjectKey(rawSegments: readonly string[]): string {
  if (rawSegments.length === 0) throw badRequest("Missing object key: expected /v1/objects/{origin}/{key}");
  const out: string[] = [];
  for (const raw of rawSegments) {
    let seg: string;
    try {
      seg = decodeURIComponent(raw);
    } catch {
      throw badRequest(`Invalid object key segment "${raw}": malformed percent-encoding`);
    }
    checkSegment(seg, raw);
    out.push(seg);
  }
  const key = out.join("/");
  if (utf8Length(key) > MAX_KEY_BYTES) {
    throw badRequest(`Invalid object key: longer than ${MAX_KEY_BYTES} bytes`);
  }
  return key;
}

/**
 * Checks an already-decoded key (from a config file, a prefetch request or a listing).
 *
 * @param key the key
 * @returns the key, unchanged
 * @throws {CacheServerError} `BAD_REQUEST` when it could escape its origin
 */
export function validateObjectKey(key: string): string {
  if (key.length === 0) throw badRequest("Invalid object key: empty");
  for (const seg of key.split("/")) checkSegment(seg, seg);
  if (utf8Length(key) > MAX_KEY_BYTES) {
    throw badRequest(`Invalid object key: longer than ${MAX_KEY_BYTES} bytes`);
  }
  return key;
}

function checkSegment(seg: string, raw: string): void {
  if (seg.length === 0) throw badRequest(`Invalid object key: empty path segment (check for "//" or a leading "/")`);
  if (seg === "." || seg === "..") throw badRequest(`Invalid object key segment "${raw}": "." and ".." are not allowed`);
  // deno-lint-ignore no-control-regex
  if (/[\u0000-\u001f\u007f]/.test(seg)) {
    throw badRequest(`Invalid object key segment "${encodeURIComponent(seg)}": control characters are not allowed`);
  }
  if (seg.includes("/") || seg.includes("\\")) {
    throw badRequest(`Invalid object key segment "${raw}": encoded "/" or "\\" is not allowed`);
  }
}

const encoder = new TextEncoder();

/** UTF-8 length; a key of at most MAX_KEY_BYTES / 3 characters cannot exceed the limit. */
function utf8Length(key: string): number {
  return key.length * 3 <= MAX_KEY_BYTES ? key.length : encoder.encode(key).length;
}
