/** @module `createServer(config)`: builds every part from a `Config` and wires them into the app. */

import type { Hono } from "hono";
import { createApp } from "./app.ts";
import { BlockCache } from "./cache/block-cache.ts";
import { DiskTier } from "./cache/disk-tier.ts";
import { MemoryTier } from "./cache/memory-tier.ts";
import type { Config } from "./config/load.ts";
import { ServedBytes } from "./http/served-bytes.ts";
import { Metrics } from "./metrics/prometheus.ts";
import { FsOrigin } from "./origin/fs-origin.ts";
import { OriginGateway } from "./origin/origin-gateway.ts";
import type { Origin } from "./origin/origin.ts";

/** A built server: the app to serve and how to shut it down. */
export interface RackfeedServer {
  readonly app: Hono;
  /** The fetch handler to give the runtime. */
  readonly fetch: (req: Request, env?: unknown) => Response | Promise<Response>;
  readonly cache: BlockCache;
  readonly origins: ReadonlyMap<string, OriginGateway>;
  readonly metrics: Metrics;
  /** Waits for fills and disk writes in flight, then closes origins. */
  close(): Promise<void>;
}

/** Things `createServer` takes from its surroundings rather than from globals. */
export interface ServerEnv {
  /** Monotonic clock in ms. */
  readonly now: () => number;
  /** Where warnings and unexpected errors go. */
  readonly log: (message: string, err?: unknown) => void;
  /** Builds an origin from its spec; tests inject fault-injecting origins here. */
  readonly makeOrigin?: (spec: Config["origins"][number]) => Origin;
}

/**
 * Builds a server from a configuration: origins, tiers (opening the NVMe tier rebuilds its
 * index), cache, metrics and the HTTP app.
 *
 * @param config the validated configuration
 * @param env clock, logger and origin factory
 * @returns the server, not yet listening
 * @throws {Error} when the cache directory cannot be created or read
 * @example
 * ```ts
 * const server = await createServer(loadConfig(sources), { now: () => performance.now(), log: console.error });
 * Deno.serve(server.fetch);
 * ```
 */
export async function createServer(config: Config, env: ServerEnv): Promise<RackfeedServer> {
  const makeOrigin = env.makeOrigin ?? defaultOrigin;
  const origins = new Map<string, OriginGateway>();
  for (const spec of config.origins) {
    origins.set(
      spec.name,
      new OriginGateway(makeOrigin(spec), {
        concurrency: config.originConcurrency,
        maxQueue: config.originQueue,
        metadataTtl: config.metadataTtl,
        now: env.now,
      }),
    );
  }
  const memory = new MemoryTier({ maxBytes: config.memoryBytes });
  const disk = await DiskTier.open({
    dir: config.cacheDir,
    maxBytes: config.diskBytes,
    maxPendingWrites: config.diskWriteQueue,
    onError: (m, e) => env.log(m, e),
  });
  let metrics: Metrics | undefined = undefined;
  const cache = new BlockCache({
    memory,
    disk,
    blockBytes: config.blockBytes,
    partBytes: config.partBytes,
    readAheadBlocks: config.readAheadBlocks,
    now: env.now,
    onFill: (s, source) => metrics?.fillSeconds.observe({ source }, s),
  });
  const served = new ServedBytes();
  metrics = new Metrics({
    cache: () => cache.stats(),
    memory: () => memory.stats(),
    disk: () => disk.stats(),
    origins: () => [...origins.values()].map((o) => o.stats()),
    served: () => served.stats(),
  });
  const app = createApp({ origins, cache, metrics, served, readToken: config.readToken, log: env.log });
  return {
    app,
    fetch: app.fetch,
    cache,
    origins,
    metrics,
    async close() {
      await cache.close();
      await Promise.all([...origins.values()].map((o) => o.origin.close()));
    },
  };
}

function defaultOrigin(spec: Config["origins"][number]): Origin {
  if (spec.kind === "fs") return new FsOrigin({ name: spec.name, root: spec.root });
  throw new RangeError(`Cannot create origin "${spec.name}": ${spec.kind} origins are not available in this build`);
}
