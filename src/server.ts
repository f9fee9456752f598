/** @module `createServer(config)`: builds every part from a `Config` and wires them into the app. */

import type { Hono } from "hono";
import { createApp } from "./app.ts";
import { BatchStats } from "./batch/batch-stats.ts";
import { BatchBodyPool } from "./batch/body-pool.ts";
import { HeldBlocks } from "./http/held-blocks.ts";
import { DatasetCatalog } from "./batch/dataset-catalog.ts";
import { ReadAhead } from "./batch/read-ahead.ts";
import { PrefetchJobs } from "./prefetch/prefetch-jobs.ts";
import { BlockCache } from "./cache/block-cache.ts";
import type { LockFile } from "./cache/cache-dir-lock.ts";
import { DiskTier, type DiskTierOptions } from "./cache/disk-tier.ts";
import { MemoryTier } from "./cache/memory-tier.ts";
import type { Config } from "./config/load.ts";
import { ServedBytes } from "./http/served-bytes.ts";
import { type MetricSources, Metrics } from "./metrics/prometheus.ts";
import { buildStatus } from "./metrics/status.ts";
import { checkFsRoot, FsOrigin } from "./origin/fs-origin.ts";
import type { FetchPool, S3Http } from "./origin/s3-origin.ts";
import { OriginGateway } from "./origin/origin-gateway.ts";
import type { Origin } from "./origin/origin.ts";
import type { IndexBuilder } from "./runtime/index-builder.ts";
import type { ClientGone, WhenDone } from "./runtime/listener.ts";
import type { MapFile } from "./shm/ring-file.ts";
import { type PieceCopier, withThreads } from "./batch/piece-copier.ts";
import type { PlanningThreadHandle } from "./batch/plan-exchange.ts";
import { SHM_PROTOCOL_VERSION } from "./shm/protocol.ts";
import { type PeerIdentity, ShmServer } from "./shm/shm-server.ts";

/** A built server: the app to serve and how to shut it down. */
export interface RackfeedServer {
  readonly app: Hono;
  /** The fetch handler to give the runtime. */
  readonly fetch: (req: Request, env?: unknown) => Response | Promise<Response>;
  readonly cache: BlockCache;
  readonly origins: ReadonlyMap<string, OriginGateway>;
  readonly metrics: Metrics;
  readonly datasets: DatasetCatalog;
  readonly prefetch: PrefetchJobs;
  readonly batchStats: BatchStats;
  /** Consumers' read-ahead schedules (their look-ahead, fresh; /metrics shows a snapshot). */
  readonly readAhead: ReadAhead;
  /** How batches are copied: the native gather with its thread count, or undefined (JavaScript). */
  readonly copier: PieceCopier | undefined;
  /**
   * Opens the shared-memory control socket (after HTTP is listening, since its default name holds
   * the port). Resolves to undefined when `--shm-dir off`.
   *
   * @throws {ShmStartupError} when the socket path is too long, held by a live server, or the directory is unusable
   */
  startShm(port: number): Promise<ShmServer | undefined>;
  /**
   * Waits for fills (at most `graceMs`, default 5 s) and disk writes in flight, then closes origins.
   */
  close(graceMs?: number): Promise<void>;
}

/**
 * How long an HTTP batch may wait for room under `--batch-inflight-bytes` before it is refused
 * with 503 (a reader that stalls holds its body's bytes until its response ends).
 */
const BATCH_WAIT_MS = 30_000;

// Fixed bounds (not tunables: each keeps a structure bounded, and none is a trade-off an
// operator would make). The README quotes them.
/** The longest one look-ahead snapshot serves /metrics and /v1/status. */
const LOOKAHEAD_SNAPSHOT_MAX_MS = 1000;
/** Most datasets registered at once (400 beyond). */
const MAX_DATASETS = 256;
/** Most consumers read-ahead tracks (the least recently seen is forgotten beyond). */
const MAX_CONSUMERS = 4096;
/** Most prefetch jobs unfinished at once (503 beyond), and most objects one job may warm. */
const MAX_PREFETCH_JOBS = 256;
const MAX_PREFETCH_OBJECTS = 1_000_000;
/** Slow batches kept for /v1/status. */
const SLOW_BATCHES_KEPT = 100;
/** HTTP batches waiting for room in --batch-inflight-bytes at once (503 beyond). */
const MAX_BATCHES_WAITING = 1024;
/** Object responses waiting for room in --object-inflight-bytes at once (503 beyond). */
const MAX_OBJECT_READS_WAITING = 1024;

/** CPUs from which `--planning-thread auto` starts the thread: on fewer it takes a core the batches need. */
const PLANNING_THREAD_MIN_CPUS = 4;

/** Things `createServer` takes from its surroundings rather than from globals. */
export interface ServerEnv {
  /** Monotonic clock in ms. */
  readonly now: () => number;
  /** Where warnings and unexpected errors go. */
  readonly log: (message: string, err?: unknown) => void;
  /**
   * Wraps a response body that is one view of cached bytes. Deno copies a `Uint8Array` body but
   * streams a `ReadableStream` chunk as is, so its host passes a one-chunk stream here; Node
   * writes a `Uint8Array` directly and leaves this unset.
   */
  readonly wrapBody?: (bytes: Uint8Array) => BodyInit;
  /** This process's id: ring file names carry it, so a later server can tell dead servers' rings. */
  readonly pid?: number;
  /** Whether a process id is running (rings of dead servers are removed at start-up). */
  readonly isAlive?: (pid: number) => boolean;
  /** Takes the cache directory's lock from the kernel (`flock`); without it the lock goes by pid. */
  readonly lockFile?: LockFile;
  /** Reads the size of the cache's file system (`statfs`); default node:fs's. */
  readonly fileSystem?: DiskTierOptions["fileSystem"];
  /** Maps a file shared and writable; without it the shm path writes rings with pwrite (one more copy). */
  readonly mapFile?: MapFile;
  /** The native gather (`native/gather.c`), where the runtime loads it; used unless `--native-gather off`. */
  readonly copier?: PieceCopier;
  /** Reads shm peers' Unix credentials (SO_PEERCRED); without it every peer needs the read token. */
  readonly peers?: PeerIdentity;
  /** See `WhenDone`: when a response is over. HTTP batch bodies are reused, and bounded in flight, only where this is given. */
  readonly whenDone?: WhenDone;
  /** See `ClientGone`: a batch whose client left while it waited for room is not assembled. */
  readonly clientGone?: ClientGone;
  /** Builds large datasets' indexes off the event loop (see `IndexBuilder`); unset: on it. */
  readonly buildOffThread?: IndexBuilder;
  /** Starts a planning thread for read-ahead (see `PlanningThread`); unset: every step is planned on the event loop. */
  readonly startPlanningThread?: (log: (message: string, err?: unknown) => void) => PlanningThreadHandle;
  /** CPUs this process may run on (`--planning-thread auto` starts the thread from `PLANNING_THREAD_MIN_CPUS` on); default 1. */
  readonly cpus?: number;
  /** How often a quiet prefetch event stream gets a comment line (default `SSE_KEEP_ALIVE_MS`; tests shorten it). */
  readonly sseKeepAliveMs?: number;
  /** How long a shm connection may go without asking for a consumer (default 30 s; tests shorten it). */
  readonly shmOpenTimeoutMs?: number;
  /** See `ShmServerOptions.spareRingMs`. */
  readonly shmSpareRingMs?: number;
  /** Builds an origin from its spec; tests inject fault-injecting origins here. */
  readonly makeOrigin?: (spec: Config["origins"][number]) => Origin | Promise<Origin>;
  /** The HTTP client S3 origins use under `--s3-http auto` on this runtime (default `node`). */
  readonly s3HttpAuto?: S3Http;
  /** Makes an S3 origin's own fetch connection pool, where the runtime can (see `FetchPool`). */
  readonly s3FetchPool?: (maxIdle: number) => FetchPool;
}

/**
 * The configured origins, each behind its gateway (concurrency, queue, metadata cache, part
 * sizing); a files origin's root is checked first, so a missing mount fails the start.
 *
 * @throws {OriginStartupError} when a files origin's directory is missing or unusable
 */
async function openOrigins(config: Config, env: ServerEnv): Promise<Map<string, OriginGateway>> {
  for (const spec of config.origins) {
    if (spec.kind !== "fs") continue;
    await checkFsRoot(spec.root).catch((e) => {
      throw new OriginStartupError(`Invalid --origin ${spec.name}=${spec.root}: ${(e as Error).message}`, { cause: e });
    });
  }
  const makeOrigin = env.makeOrigin ?? ((spec: Config["origins"][number]) => defaultOrigin(spec, config, env));
  const origins = new Map<string, OriginGateway>();
  for (const spec of config.origins) {
    origins.set(
      spec.name,
      new OriginGateway(await makeOrigin(spec), {
        concurrency: config.originConcurrency,
        maxConcurrency: config.originConcurrencyMax,
        targetBytesPerSecond: config.originTargetBandwidth,
        maxQueue: config.originQueue,
        metadataTtl: config.metadataTtl,
        now: env.now,
        // Remote origins grow their parts from --part-bytes up to a block as latency × bandwidth asks.
        parts: config.partSizing === "auto" ? { minBytes: config.partBytes, maxBytes: config.blockBytes } : undefined,
      }),
    );
  }
  return origins;
}

/**
 * Builds a server from a configuration: origins, tiers (opening the NVMe tier rebuilds its
 * index), cache, metrics and the HTTP app.
 *
 * @param config the validated configuration
 * @param env clock, logger and origin factory
 * @returns the server, not yet listening
 * @throws {OriginStartupError} when a files origin's directory is missing or unusable
 * @throws {CacheDirStartupError} when the cache directory cannot be made, read or locked
 * @throws {DatasetStartupError} when a dataset configured at start-up cannot be registered
 * @example
 * ```ts
 * const server = await createServer(loadConfig(sources), { now: () => performance.now(), log: console.error });
 * Deno.serve(server.fetch);
 * ```
 */
export async function createServer(config: Config, env: ServerEnv): Promise<RackfeedServer> {
  const origins = await openOrigins(config, env);
  // Origins hold connection pools (Deno: an HttpClient each): a failed start closes them too.
  const closeOrigins = () => Promise.all([...origins.values()].map((o) => o.origin.close())).then(() => {});
  // Belady eviction asks the read-ahead schedules, which are built after the cache: bind late.
  let nextUse: (key: string) => number = () => Infinity;
  const memory = new MemoryTier({
    maxBytes: config.memoryBytes,
    nextUse: config.memoryEviction === "belady" ? (k) => nextUse(k) : undefined,
  });
  const disk = await DiskTier.open({
    dir: config.cacheDir,
    maxBytes: config.diskBytes,
    maxPendingWrites: config.diskWriteQueue,
    onError: (m, e) => env.log(m, e),
    now: env.now,
    owner: env.pid !== undefined && env.isAlive ? { pid: env.pid, isAlive: env.isAlive, lockFile: env.lockFile } : undefined,
    fileSystem: env.fileSystem,
  }).catch(async (e) => {
    await closeOrigins();
    throw new CacheDirStartupError(`Invalid --cache-dir ${config.cacheDir}: ${(e as Error).message}`, { cause: e });
  });
  let metrics: Metrics | undefined = undefined;
  const cache = new BlockCache({
    memory,
    disk,
    blockBytes: config.blockBytes,
    partBytes: config.partBytes,
    readAheadBlocks: config.readAheadBlocks,
    // Deep enough to keep twice the origin's concurrency of reads queued even when adaptive
    // parts grow to whole blocks (a slow origin then always has work), never more than a
    // quarter of the memory tier per stream.
    maxReadAheadBlocks: Math.max(
      config.readAheadBlocks,
      Math.min(64, 2 * (config.partSizing === "auto" ? config.originConcurrencyMax : config.originConcurrency), Math.floor(config.memoryBytes / 4 / config.blockBytes)),
    ),
    now: env.now,
    onFill: (s, source) => metrics?.fillSeconds.observe({ source }, s),
  });
  const served = new ServedBytes();
  // Decided before the catalog is made: with a planning thread, datasets built off the event loop
  // come back in shared memory, which the thread reads without a copy.
  const planning = config.planningThread === "on" || (config.planningThread === "auto" && (env.cpus ?? 1) >= PLANNING_THREAD_MIN_CPUS)
    ? env.startPlanningThread?.(env.log)
    : undefined;
  let shm: ShmServer | undefined;
  /** The shm path failed to start: `GET /v1/shm` says it is off, not "starting". */
  let shmFailed = false;
  const datasets = new DatasetCatalog({
    origins,
    cache,
    maxDatasets: MAX_DATASETS,
    maxIndexBytes: config.maxIndexBytes,
    datasetIndexBytes: config.datasetIndexBytes,
    now: env.now,
    recheckMs: Math.max(config.metadataTtl, 1000),
    log: env.log,
    buildOffThread: env.buildOffThread,
    shareIndexes: planning !== undefined,
    // Read-ahead is made just below, before any dataset can be registered, let alone replaced.
    onReplaced: (old) => {
      readAhead.versionReplaced(old);
      shm?.versionReplaced(old);
    },
  });
  const readAhead = new ReadAhead({
    cache,
    now: env.now,
    budgetSeconds: config.readAheadSeconds / 1000,
    maxSteps: config.readAheadMaxSteps,
    // Look-ahead beyond half the memory tier would evict the blocks it just fetched.
    maxBytesPerConsumer: Math.max(config.blockBytes, Math.floor(config.memoryBytes / 2)),
    maxConsumers: MAX_CONSUMERS,
    plansAhead: planning,
  });
  nextUse = (k) => readAhead.nextUse(k);
  const prefetch = new PrefetchJobs({
    origins,
    cache,
    catalog: datasets,
    // The disk budget in force: less than --disk-bytes while the file system cannot hold that much.
    tierBytes: {
      memory: config.memoryBytes,
      get disk() {
        return disk.stats().maxBytes;
      },
    },
    // Half the origin's slots at most: the limiter keeps a quarter for trainers anyway.
    parallelBlocks: Math.max(1, Math.ceil(config.originConcurrency / 2)),
    maxJobs: MAX_PREFETCH_JOBS,
    maxObjects: MAX_PREFETCH_OBJECTS,
    clock: () => Date.now(),
    log: env.log,
    background: config.prefetchPriority === "background",
  });
  const batchStats = new BatchStats({
    slowSeconds: config.slowBatch / 1000,
    keep: SLOW_BATCHES_KEPT,
    clock: () => Date.now(),
    log: (line) => env.log(line),
  });
  // HTTP batch bodies, reused and bounded in flight, where the runtime tells when a response is over.
  const copier = config.nativeGather === "off" ? undefined : withThreads(env.copier, config.nativeGatherThreads);
  const bodies = env.whenDone
    ? new BatchBodyPool({ poolBytes: config.batchPoolBytes, inflightBytes: config.batchInflightBytes, maxWaiting: MAX_BATCHES_WAITING, waitMs: BATCH_WAIT_MS })
    : undefined;
  // Cached blocks that object responses are sending, bounded: a stalled reader keeps its block
  // alive past eviction. Waits as long as a batch may (BATCH_WAIT_MS).
  const objectHolds = new HeldBlocks({ maxBytes: config.objectInflightBytes, maxWaiting: MAX_OBJECT_READS_WAITING, waitMs: BATCH_WAIT_MS });
  const instance = crypto.randomUUID().slice(0, 8);
  // Planning every consumer's look-ahead costs up to --read-ahead-max-steps plans each, all on the
  // event loop (~0.4 s for 512 consumers): /metrics (open to anyone) and /v1/status (the dashboard
  // polls it every second, per open tab) share a snapshot kept 50 × as long as it took to make
  // (at most 1 s), so it costs at most ~2 % of the loop, and a few consumers' is always fresh.
  let lookaheadSnap: { until: number; value: ReturnType<ReadAhead["lookahead"]> } | undefined;
  const lookahead = () => {
    const t0 = env.now();
    if (!lookaheadSnap || t0 >= lookaheadSnap.until) {
      const value = readAhead.lookahead();
      const t1 = env.now();
      lookaheadSnap = { until: t1 + Math.min(LOOKAHEAD_SNAPSHOT_MAX_MS, 50 * (t1 - t0)), value };
    }
    return lookaheadSnap.value;
  };
  const sources: MetricSources = {
    shm: () => shm?.stats(),
    batches: () => batchStats,
    datasetBuilds: () => datasets.builds(),
    lookahead,
    readAheadBlocks: () => readAhead.blocksWarmed,
    readAheadSteps: () => ({ warmed: readAhead.stepsWarmed, plannedAhead: planning?.plansTaken ?? 0 }),
    cache: () => cache.stats(),
    memory: () => memory.stats(),
    disk: () => disk.stats(),
    origins: () => [...origins.values()].map((o) => o.stats()),
    served: () => served.stats(),
    bodies: () => bodies?.stats(),
    objectHolds: () => objectHolds.stats(),
  };
  metrics = new Metrics(sources);
  const startedAt = env.now();
  const status = () => buildStatus(sources, { prefetch: () => prefetch.list(), uptimeSeconds: (env.now() - startedAt) / 1000 });
  for (const d of config.datasets) {
    try {
      await datasets.register(d.name, d.body);
    } catch (e) {
      await planning?.close();
      await cache.close();
      await disk.close();
      await closeOrigins();
      throw new DatasetStartupError(`Cannot register dataset "${d.name}" (${d.source}): ${(e as Error).message}`, { cause: e });
    }
  }
  const app = createApp({
    origins,
    cache,
    metrics,
    served,
    datasets,
    readAhead,
    prefetch,
    batchStats,
    status,
    shm: () => (shm ? { socket: shm.socketPath, instance, protocol: SHM_PROTOCOL_VERSION } : config.shmDir !== undefined && !shmFailed ? "starting" : undefined),
    wrapBody: env.wrapBody ?? ((b: Uint8Array) => b as Uint8Array<ArrayBuffer>),
    readToken: config.readToken,
    adminToken: config.adminToken,
    maxBatchBytes: config.maxBatchBytes,
    requestBodyBytes: config.requestBodyBytes,
    bodies: env.whenDone && bodies ? { pool: bodies, whenDone: env.whenDone, clientGone: env.clientGone } : undefined,
    objectHolds: { holds: objectHolds, whenDone: env.whenDone },
    copier,
    sseKeepAliveMs: env.sseKeepAliveMs,
    now: env.now,
    log: env.log,
  });
  return {
    app,
    fetch: app.fetch,
    cache,
    origins,
    metrics,
    datasets,
    prefetch,
    batchStats,
    readAhead,
    copier,
    async startShm(port) {
      if (config.shmDir === undefined || shm) return shm;
      const socketPath = config.shmSocket ?? `${config.shmDir}/rackfeed-${port}.sock`;
      // sockaddr_un holds 108 bytes with its terminating NUL.
      if (new TextEncoder().encode(socketPath).length > 107) {
        shmFailed = true;
        throw new ShmStartupError(`Shared-memory socket path ${socketPath} is longer than 107 bytes; pass a shorter --shm-socket`);
      }
      try {
        shm = await ShmServer.start({
          socketPath,
          openTimeoutMs: env.shmOpenTimeoutMs,
          spareRingMs: env.shmSpareRingMs,
          dir: config.shmDir,
          catalog: datasets,
          cache,
          readAhead,
          served,
          stats: batchStats,
          onBatch: (s, c) => metrics!.observeBatch(s, c),
          onTimings: (d, t) => metrics!.observeStep(d, t),
          maxBatchBytes: config.maxBatchBytes,
          slots: config.shmSlots,
          spareRings: config.shmSpareRings,
          budgetBytes: config.shmBytes,
          readToken: config.readToken,
          instance,
          pid: env.pid ?? 0,
          isAlive: env.isAlive ?? (() => true),
          lockFile: env.lockFile,
          mapFile: env.mapFile,
          copier,
          peers: env.peers,
          now: env.now,
          log: env.log,
        });
      } catch (e) {
        shmFailed = true;
        throw new ShmStartupError(`Cannot start the shared-memory path on ${socketPath}: ${(e as Error).message}`, { cause: e });
      }
      return shm;
    },
    async close(graceMs?: number) {
      await shm?.close();
      prefetch.close();
      await planning?.close();
      await cache.close(graceMs);
      await disk.close();
      await closeOrigins();
    },
  };
}

/** The shm path could not start; the CLI exits 2 with its message (e.g. pass `--shm-dir off`). */
export class ShmStartupError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ShmStartupError";
  }
}

/** The NVMe tier's directory cannot be used (not a directory, not writable, or another server's); the CLI exits 2. */
export class CacheDirStartupError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "CacheDirStartupError";
  }
}

/** A files origin's root is missing, not a directory, or unreadable; the CLI exits 2. */
export class OriginStartupError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "OriginStartupError";
  }
}

/** A dataset named in the configuration could not be registered; the CLI exits 2 with its message. */
export class DatasetStartupError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "DatasetStartupError";
  }
}

/**
 * Builds the origin a spec names, with the fault policy of the configuration.
 *
 * @param spec the origin's spec
 * @param config timeouts, retries, hedging and the concurrency that sizes connection pools
 * @param runtime what the runtime brings to S3 origins: its client under `--s3-http auto` (default `node`), its fetch pools
 * @returns the origin
 */
export async function defaultOrigin(
  spec: Config["origins"][number],
  config: Config,
  runtime: Pick<ServerEnv, "s3HttpAuto" | "s3FetchPool"> = {},
): Promise<Origin> {
  if (spec.kind === "fs") return new FsOrigin({ name: spec.name, root: spec.root, timeoutMs: config.originTimeout });
  // Loaded only for an S3 origin: the AWS SDK costs start-up time and, on Deno, reads environment
  // variables as it loads (without --allow-env even `--help` failed).
  const { S3Origin } = await import("./origin/s3-origin.ts");
  return new S3Origin({
    name: spec.name,
    bucket: spec.bucket,
    prefix: spec.prefix,
    endpoint: spec.endpoint,
    region: spec.region,
    forcePathStyle: spec.forcePathStyle,
    http: config.s3Http === "auto" ? (runtime.s3HttpAuto ?? "node") : config.s3Http,
    fetchPool: runtime.s3FetchPool,
    concurrency: config.originConcurrency,
    maxConcurrency: config.originConcurrencyMax,
    timeoutMs: config.originTimeout,
    retry: { retries: config.originRetries, baseMs: config.originBackoff, capMs: config.originBackoffMax },
    hedgeFactor: config.originHedge,
  });
}
