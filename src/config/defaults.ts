/**
 * @module The one table of rackfeed's tunables: name, flag, environment variable, default,
 * parser and doc. `loadConfig` reads it, and the README's configuration table is generated
 * from it (`npm run docs:config`), so a default is written down exactly once.
 */

import { parseDuration, parseSize } from "./size.ts";

/** How a raw flag, environment or config-file value becomes a typed one. */
type Parser<T> = (raw: string | number | boolean, what: string) => T;

/** One tunable. `default` is the raw text, parsed like any user input so the table stays honest. */
export interface Tunable<T> {
  /** camelCase key in the JSON config file and in `Config`. */
  readonly key: string;
  /** Command-line flag of `rackfeed serve`. */
  readonly flag: string;
  /** Environment variable that sets it. */
  readonly env: string;
  /** Default, as text; `undefined` means unset. */
  readonly default: string | undefined;
  /** Turns raw input into the typed value; throws `RangeError` naming `what`. */
  readonly parse: Parser<T>;
  /** One line for the README. */
  readonly doc: string;
}

function sizeIn(min: number, max: number): Parser<number> {
  return (raw, what) => {
    const v = parseSize(typeof raw === "boolean" ? String(raw) : raw, what);
    if (v < min || v > max) {
      throw new RangeError(`Invalid ${what}: expected between ${min} and ${max} bytes, received ${v}`);
    }
    return v;
  };
}

function intIn(min: number, max: number): Parser<number> {
  return (raw, what) => {
    const v = typeof raw === "number" ? raw : Number(String(raw).trim());
    if (!Number.isSafeInteger(v) || v < min || v > max) {
      throw new RangeError(`Invalid ${what}: expected an integer from ${min} to ${max}, received "${raw}"`);
    }
    return v;
  };
}

function durationIn(maxMs: number): Parser<number> {
  return (raw, what) => {
    const v = parseDuration(typeof raw === "boolean" ? String(raw) : raw, what);
    if (v > maxMs) throw new RangeError(`Invalid ${what}: expected at most ${maxMs} ms, received ${v} ms`);
    return v;
  };
}

const text: Parser<string> = (raw, what) => {
  const v = String(raw);
  if (v.length === 0) throw new RangeError(`Invalid ${what}: expected a non-empty value`);
  return v;
};

const token: Parser<string> = (raw, what) => {
  const v = text(raw, what);
  if (v.length < 8 || /\s/.test(v)) {
    throw new RangeError(`Invalid ${what}: expected at least 8 characters without spaces`);
  }
  return v;
};

const MiB = 2 ** 20;
const TiB = 2 ** 40;

/** Every tunable of `rackfeed serve`. Add new ones here and nowhere else. */
export const TUNABLES = {
  listen: {
    key: "listen",
    flag: "--listen",
    env: "RACKFEED_LISTEN",
    default: "127.0.0.1:8080",
    parse: text,
    doc: "HOST:PORT to serve HTTP on; loopback unless you say otherwise (port 0 picks a free port)",
  } as Tunable<string>,
  cacheDir: {
    key: "cacheDir",
    flag: "--cache-dir",
    env: "RACKFEED_CACHE_DIR",
    default: "./.rackfeed-cache",
    parse: text,
    doc: "Directory of the NVMe tier (block files and their index); survives restarts",
  } as Tunable<string>,
  memoryBytes: {
    key: "memoryBytes",
    flag: "--memory-bytes",
    env: "RACKFEED_MEMORY_BYTES",
    default: "1GiB",
    parse: sizeIn(MiB, 4 * TiB),
    doc: "Byte budget of the memory tier",
  } as Tunable<number>,
  diskBytes: {
    key: "diskBytes",
    flag: "--disk-bytes",
    env: "RACKFEED_DISK_BYTES",
    default: "16GiB",
    parse: sizeIn(MiB, 1024 * TiB),
    doc: "Byte budget of the NVMe tier (block payloads and headers)",
  } as Tunable<number>,
  blockBytes: {
    key: "blockBytes",
    flag: "--block-bytes",
    env: "RACKFEED_BLOCK_BYTES",
    default: "8MiB",
    parse: sizeIn(4096, 256 * MiB),
    doc: "Size of the aligned blocks objects are cut into (the unit of caching)",
  } as Tunable<number>,
  partBytes: {
    key: "partBytes",
    flag: "--part-bytes",
    env: "RACKFEED_PART_BYTES",
    default: "1MiB",
    parse: sizeIn(4096, 256 * MiB),
    doc: "Size of one origin read while filling a block; waiting readers get bytes part by part",
  } as Tunable<number>,
  originConcurrency: {
    key: "originConcurrency",
    flag: "--origin-concurrency",
    env: "RACKFEED_ORIGIN_CONCURRENCY",
    default: "16",
    parse: intIn(1, 1024),
    doc: "Origin reads in flight at once, per origin; more wait in a bounded queue",
  } as Tunable<number>,
  originQueue: {
    key: "originQueue",
    flag: "--origin-queue",
    env: "RACKFEED_ORIGIN_QUEUE",
    default: "4096",
    parse: intIn(1, 1_000_000),
    doc: "Origin reads that may wait for a slot, per origin; beyond it requests get 503 + Retry-After",
  } as Tunable<number>,
  readAheadBlocks: {
    key: "readAheadBlocks",
    flag: "--read-ahead-blocks",
    env: "RACKFEED_READ_AHEAD_BLOCKS",
    default: "2",
    parse: intIn(0, 64),
    doc: "Blocks fetched ahead of the one being sent while streaming a long range",
  } as Tunable<number>,
  metadataTtl: {
    key: "metadataTtl",
    flag: "--metadata-ttl",
    env: "RACKFEED_METADATA_TTL",
    default: "1s",
    parse: durationIn(3_600_000),
    doc: "How long an object's size and version are trusted before the origin is asked again",
  } as Tunable<number>,
  diskWriteQueue: {
    key: "diskWriteQueue",
    flag: "--disk-write-queue",
    env: "RACKFEED_DISK_WRITE_QUEUE",
    default: "8",
    parse: intIn(0, 1024),
    doc: "Filled blocks waiting to be written to the NVMe tier; beyond it a block stays memory-only",
  } as Tunable<number>,
  readToken: {
    key: "readToken",
    flag: "--read-token",
    env: "RACKFEED_READ_TOKEN",
    default: undefined,
    parse: token,
    doc: "Bearer token required for reads (objects, datasets); unset means reads are open",
  } as Tunable<string>,
  adminToken: {
    key: "adminToken",
    flag: "--admin-token",
    env: "RACKFEED_ADMIN_TOKEN",
    default: undefined,
    parse: token,
    doc: "Bearer token for admin endpoints; unset means admin endpoints are refused",
  } as Tunable<string>,
} as const;

/** The name of a tunable. */
export type TunableKey = keyof typeof TUNABLES;
