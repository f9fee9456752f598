/**
 * @module The one table of rackfeed's tunables: name, flag, environment variable, default,
 * parser and doc. `loadConfig` reads it, and the README's configuration table is generated
 * from it (`npm run docs:config`), so a default is written down exactly once.
 */

import { MAX_RING_SLOTS } from "../shm/protocol.ts";
import { SPARE_RING_MS } from "../shm/ring-pool.ts";
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

/** A size that is also a multiple of `unit` (so tokens of every dtype lie whole inside a block). */
function sizeMultipleIn(unit: number, min: number, max: number): Parser<number> {
  const inRange = sizeIn(min, max);
  return (raw, what) => {
    const v = inRange(raw, what);
    if (v % unit !== 0) throw new RangeError(`Invalid ${what}: expected a multiple of ${unit} bytes, received ${v}`);
    return v;
  };
}

function intIn(min: number, max: number): Parser<number> {
  return (raw, what) => {
    // Decimal digits only: Number("") and Number(" ") are 0, Number("0x10") is 16.
    const v = typeof raw === "number" ? raw : /^\s*\d+\s*$/.test(String(raw)) ? Number(String(raw).trim()) : NaN;
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

function positiveDurationIn(maxMs: number): Parser<number> {
  const inner = durationIn(maxMs);
  return (raw, what) => {
    const v = inner(raw, what);
    if (v <= 0) throw new RangeError(`Invalid ${what}: expected a duration above 0, received "${raw}"`);
    return v;
  };
}

function factor(min: number, max: number): Parser<number> {
  return (raw, what) => {
    const v = typeof raw === "number" ? raw : /^\s*\d+(\.\d+)?\s*$/.test(String(raw)) ? Number(String(raw).trim()) : NaN;
    if (!Number.isFinite(v) || (v !== 0 && (v < min || v > max))) {
      throw new RangeError(`Invalid ${what}: expected 0 (off) or a number from ${min} to ${max}, received "${raw}"`);
    }
    return v;
  };
}

/** "auto" (parsed as 0), or what `parse` accepts. */
function autoOr(parse: Parser<number>): Parser<number> {
  return (raw, what) => {
    if (String(raw).trim().toLowerCase() === "auto") return 0;
    try {
      return parse(raw, what);
    } catch (e) {
      throw new RangeError((e as Error).message.replace("expected ", "expected auto or "));
    }
  };
}

function oneOf<T extends string>(choices: readonly T[]): Parser<T> {
  return (raw, what) => {
    const v = String(raw).trim() as T;
    if (!choices.includes(v)) {
      throw new RangeError(`Invalid ${what}: expected one of ${choices.join(", ")}, received "${raw}"`);
    }
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
  // Visible ASCII only (RFC 6750 tokens): HTTP headers carry bytes, which Node reads as Latin-1,
  // so a token with other characters could never match the one a client sends.
  if (v.length < 8 || !/^[\x21-\x7e]+$/.test(v)) {
    throw new RangeError(`Invalid ${what}: expected at least 8 visible ASCII characters (no spaces, no other characters)`);
  }
  return v;
};

const MiB = 2 ** 20;
const GiB = 2 ** 30;
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
    parse: sizeMultipleIn(8, 4096, 256 * MiB),
    doc: "Size of the aligned blocks objects are cut into (the unit of caching); a multiple of 8 bytes",
  } as Tunable<number>,
  partBytes: {
    key: "partBytes",
    flag: "--part-bytes",
    env: "RACKFEED_PART_BYTES",
    default: "1MiB",
    parse: sizeIn(4096, 256 * MiB),
    doc: "Size of one origin read while filling a block; waiting readers get bytes part by part",
  } as Tunable<number>,
  partSizing: {
    key: "partSizing",
    flag: "--part-sizing",
    env: "RACKFEED_PART_SIZING",
    default: "auto",
    parse: oneOf(["auto", "fixed"]),
    doc: "auto: an S3 origin's parts grow from --part-bytes up to a block, to 4 × its measured time to first byte × per-connection bandwidth; fixed: always --part-bytes",
  } as Tunable<"auto" | "fixed">,
  originConcurrency: {
    key: "originConcurrency",
    flag: "--origin-concurrency",
    env: "RACKFEED_ORIGIN_CONCURRENCY",
    default: "16",
    parse: intIn(1, 1024),
    doc: "Origin reads in flight at once, per origin; more wait in a bounded queue",
  } as Tunable<number>,
  originConcurrencyMax: {
    key: "originConcurrencyMax",
    flag: "--origin-concurrency-max",
    env: "RACKFEED_ORIGIN_CONCURRENCY_MAX",
    default: "64",
    parse: intIn(1, 1024),
    doc: "Most reads in flight an S3 origin's limit may grow to when its measured latency × bandwidth needs them for --origin-target-bandwidth (set it to --origin-concurrency for a fixed limit)",
  } as Tunable<number>,
  originTargetBandwidth: {
    key: "originTargetBandwidth",
    flag: "--origin-target-bandwidth",
    env: "RACKFEED_ORIGIN_TARGET_BANDWIDTH",
    default: "1GiB",
    parse: sizeIn(MiB, 1024 * GiB),
    doc: "Bytes per second per origin the adaptive read limit aims to sustain (Little's law: reads in flight = bandwidth × read time ÷ part size)",
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
    doc: "Blocks fetched ahead of the one being sent while streaming a long range, at first: it doubles each time the reader catches up with a fill, up to twice --origin-concurrency-max blocks (twice --origin-concurrency with --part-sizing fixed; 64 at most, and at most a quarter of --memory-bytes)",
  } as Tunable<number>,
  originTimeout: {
    key: "originTimeout",
    flag: "--origin-timeout",
    env: "RACKFEED_ORIGIN_TIMEOUT",
    default: "5s",
    parse: positiveDurationIn(600_000),
    doc: "S3: a request that gets no answer or body bytes for this long is abandoned and retried. Files (NFS): a stat or read not done in this long (plus its bytes at 256 KiB/s) fails with 504",
  } as Tunable<number>,
  originRetries: {
    key: "originRetries",
    flag: "--origin-retries",
    env: "RACKFEED_ORIGIN_RETRIES",
    default: "4",
    parse: intIn(0, 20),
    doc: "S3: retries of a failed request (5xx, SlowDown, throttling, timeout, reset) before the client gets 502/504",
  } as Tunable<number>,
  originBackoff: {
    key: "originBackoff",
    flag: "--origin-backoff",
    env: "RACKFEED_ORIGIN_BACKOFF",
    default: "50ms",
    parse: durationIn(60_000),
    doc: "S3: backoff ceiling before the first retry; doubles per retry, full jitter",
  } as Tunable<number>,
  originBackoffMax: {
    key: "originBackoffMax",
    flag: "--origin-backoff-max",
    env: "RACKFEED_ORIGIN_BACKOFF_MAX",
    default: "2s",
    parse: durationIn(600_000),
    doc: "S3: cap of the backoff between retries",
  } as Tunable<number>,
  originHedge: {
    key: "originHedge",
    flag: "--origin-hedge",
    env: "RACKFEED_ORIGIN_HEDGE",
    default: "3",
    parse: factor(1.1, 100),
    doc: "S3: send a second GET for a part still running after this many times the median part time; 0 = never",
  } as Tunable<number>,
  s3Http: {
    key: "s3Http",
    flag: "--s3-http",
    env: "RACKFEED_S3_HTTP",
    default: "auto",
    parse: oneOf(["auto", "node", "fetch"]),
    doc: "S3: the HTTP client of origin requests: node (node:http, a keep-alive pool sized to the concurrency), fetch (the runtime's fetch); auto = fetch on Deno (its node:http kept the sockets of aborted requests open), node on Node",
  } as Tunable<"auto" | "node" | "fetch">,
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
  readAheadSeconds: {
    key: "readAheadSeconds",
    flag: "--read-ahead-seconds",
    env: "RACKFEED_READ_AHEAD_SECONDS",
    default: "2s",
    parse: durationIn(600_000),
    doc: "Dataset read-ahead: seconds of each consumer's consumption (at its observed step rate) fetched ahead; 0 turns it off",
  } as Tunable<number>,
  memoryEviction: {
    key: "memoryEviction",
    flag: "--memory-eviction",
    env: "RACKFEED_MEMORY_EVICTION",
    default: "belady",
    parse: oneOf(["belady", "lru"]),
    doc: "Memory tier eviction: belady (drop the block whose next scheduled use is furthest, LRU for unscheduled ones) or lru",
  } as Tunable<"belady" | "lru">,
  readAheadMaxSteps: {
    key: "readAheadMaxSteps",
    flag: "--read-ahead-max-steps",
    env: "RACKFEED_READ_AHEAD_MAX_STEPS",
    default: "64",
    parse: intIn(1, 100_000),
    doc: "Dataset read-ahead: most steps fetched ahead per consumer, whatever its step rate",
  } as Tunable<number>,
  prefetchPriority: {
    key: "prefetchPriority",
    flag: "--prefetch-priority",
    env: "RACKFEED_PREFETCH_PRIORITY",
    default: "background",
    parse: oneOf(["background", "normal"]),
    doc: "Origin priority of /prefetch reads: background (behind trainers, never the last quarter of slots) or normal",
  } as Tunable<"background" | "normal">,
  slowBatch: {
    key: "slowBatch",
    flag: "--slow-batch",
    env: "RACKFEED_SLOW_BATCH",
    default: "100ms",
    parse: durationIn(600_000),
    doc: "A batch slower than this is logged with its cause and counted in rackfeed_slow_batches_total",
  } as Tunable<number>,
  maxBatchBytes: {
    key: "maxBatchBytes",
    flag: "--max-batch-bytes",
    env: "RACKFEED_MAX_BATCH_BYTES",
    default: "256MiB",
    // A body is one buffer: Node 20 allocates none over 4 GiB (a larger batch was a 500).
    parse: sizeIn(4096, 4 * 2 ** 30),
    doc: "Largest samples/batch response body (at most 4GiB, the largest buffer Node allocates); larger requests get 400",
  } as Tunable<number>,
  batchInflightBytes: {
    key: "batchInflightBytes",
    flag: "--batch-inflight-bytes",
    env: "RACKFEED_BATCH_INFLIGHT_BYTES",
    default: "1GiB",
    parse: sizeIn(4096, TiB),
    doc: "HTTP batch bodies assembled and not yet sent, all requests together; more wait (up to 30 s, then 503). At least --max-batch-bytes",
  } as Tunable<number>,
  objectInflightBytes: {
    key: "objectInflightBytes",
    flag: "--object-inflight-bytes",
    env: "RACKFEED_OBJECT_INFLIGHT_BYTES",
    default: "1GiB",
    parse: sizeIn(4096, TiB),
    doc: "Cached blocks that object responses are sending, each counted once, all requests together: a reader that stops keeps its block past eviction; more wait (up to 30 s, then 503). At least --block-bytes",
  } as Tunable<number>,
  requestBodyBytes: {
    key: "requestBodyBytes",
    flag: "--request-body-bytes",
    env: "RACKFEED_REQUEST_BODY_BYTES",
    default: "64MiB",
    // At least the largest body a route takes (a telemetry report, 2 MiB).
    parse: sizeIn(2 * MiB, 16 * 2 ** 30),
    doc: "Request bodies (telemetry reports, registrations, prefetch jobs) received at once, all requests together; more get 503 with Retry-After",
  } as Tunable<number>,
  batchPoolBytes: {
    key: "batchPoolBytes",
    flag: "--batch-pool-bytes",
    env: "RACKFEED_BATCH_POOL_BYTES",
    default: "64MiB",
    parse: sizeIn(0, 16 * 2 ** 30),
    doc: "HTTP batch bodies kept for reuse once their response is out (0 allocates a new body per batch, which costs fresh pages)",
  } as Tunable<number>,
  nativeGather: {
    key: "nativeGather",
    flag: "--native-gather",
    env: "RACKFEED_NATIVE_GATHER",
    default: "auto",
    parse: oneOf(["auto", "off"]),
    doc: "Batch copies: auto = memcpy through native/build/librackfeed.so where it is built and the runtime can load it (on Deno with --allow-ffi; large batches are cut into slices copied on up to 8 threads), else JavaScript; off = always JavaScript",
  } as Tunable<"auto" | "off">,
  nativeGatherThreads: {
    key: "nativeGatherThreads",
    flag: "--native-gather-threads",
    env: "RACKFEED_NATIVE_GATHER_THREADS",
    default: "auto",
    parse: autoOr(intIn(1, 64)),
    doc: "Threads the native gather may copy on: auto = the CPUs this process may run on (a cgroup's CPU quota, a container's --cpus, counts), at most 8 (on Node, at most libuv's pool, UV_THREADPOOL_SIZE). Large batches are cut into slices, one per thread; with 4 threads or more, small shm batches are copied about 1 MiB of steps at a time on one of them; 1 copies every batch on the event loop",
  } as Tunable<number>,
  planningThread: {
    key: "planningThread",
    flag: "--planning-thread",
    env: "RACKFEED_PLANNING_THREAD",
    default: "auto",
    parse: oneOf(["auto", "on", "off"]),
    doc: "Plans of consumers' coming steps (which bytes of which blocks a batch takes) made on a thread of their own, which the event loop then copies out of shared memory: auto = on where the process may run on 4 CPUs or more, a cgroup's CPU quota counted (on fewer, the thread takes a core the batches need); off = every step planned on the event loop",
  } as Tunable<"auto" | "on" | "off">,
  maxIndexBytes: {
    key: "maxIndexBytes",
    flag: "--max-index-bytes",
    env: "RACKFEED_MAX_INDEX_BYTES",
    default: "4GiB",
    parse: sizeIn(4096, TiB),
    doc: "Largest Megatron .idx file accepted (it is held in memory while its dataset is registered)",
  } as Tunable<number>,
  datasetIndexBytes: {
    key: "datasetIndexBytes",
    flag: "--dataset-index-bytes",
    env: "RACKFEED_DATASET_INDEX_BYTES",
    default: "4GiB",
    parse: sizeIn(MiB, 64 * TiB),
    doc: "Memory the indexes of all registered datasets may take together, builds in flight included (about the .idx files, 12 bytes per sample, 4 per document per epoch, 6 per blended sample; estimated before the build); a registration or rebuild that would go beyond is refused (400, with its estimate)",
  } as Tunable<number>,
  shmDir: {
    key: "shmDir",
    flag: "--shm-dir",
    env: "RACKFEED_SHM_DIR",
    default: "/dev/shm",
    parse: text,
    doc: "Directory of the shared-memory rings (and, by default, their control socket); off disables the shm path",
  } as Tunable<string>,
  shmSocket: {
    key: "shmSocket",
    flag: "--shm-socket",
    env: "RACKFEED_SHM_SOCKET",
    default: undefined,
    parse: text,
    doc: "Unix socket of the shm control channel; unset: <shm-dir>/rackfeed-<port>.sock",
  } as Tunable<string>,
  shmSlots: {
    key: "shmSlots",
    flag: "--shm-slots",
    env: "RACKFEED_SHM_SLOTS",
    default: "4",
    parse: intIn(1, MAX_RING_SLOTS),
    doc: "Slots per shm ring when the client asks for none: batches filled ahead of the trainer",
  } as Tunable<number>,
  shmSpareRings: {
    key: "shmSpareRings",
    flag: "--shm-spare-rings",
    env: "RACKFEED_SHM_SPARE_RINGS",
    default: "4",
    parse: intIn(0, 64),
    doc: `Rings of ended consumers kept (each for ${SPARE_RING_MS / 1000} s, within --shm-bytes) for the next consumer of the same ring size, which then starts without allocating and mapping a new one; 0 removes every ring with its consumer`,
  } as Tunable<number>,
  shmBytes: {
    key: "shmBytes",
    flag: "--shm-bytes",
    env: "RACKFEED_SHM_BYTES",
    default: "2GiB",
    parse: sizeIn(MiB, 4 * TiB),
    doc: "Byte budget of all shm rings together (they live in RAM); a ring that does not fit is refused and the client uses HTTP",
  } as Tunable<number>,
  shutdownGrace: {
    key: "shutdownGrace",
    flag: "--shutdown-grace",
    env: "RACKFEED_SHUTDOWN_GRACE",
    default: "10s",
    parse: positiveDurationIn(600_000),
    doc: "On SIGINT/SIGTERM, how long requests and origin fills in flight may take to finish before the process exits without them",
  } as Tunable<number>,
  tlsCert: {
    key: "tlsCert",
    flag: "--tls-cert",
    env: "RACKFEED_TLS_CERT",
    default: undefined,
    parse: text,
    doc: "PEM certificate file: serve HTTPS with ALPN h2 and http/1.1 (needs --tls-key); unset serves cleartext HTTP/1.1 and h2c",
  } as Tunable<string>,
  tlsKey: {
    key: "tlsKey",
    flag: "--tls-key",
    env: "RACKFEED_TLS_KEY",
    default: undefined,
    parse: text,
    doc: "PEM private key file of --tls-cert",
  } as Tunable<string>,
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
