/** @module The server's state as one JSON document (`GET /v1/status`): what the dashboard draws, from the same sources as `/metrics`. */

import type { SlowBatch, SlowBatchCause } from "../batch/batch-stats.ts";
import type { ConsumerLookahead } from "../batch/read-ahead.ts";
import type { PrefetchProgress } from "../prefetch/prefetch-jobs.ts";
import type { MetricSources } from "./prometheus.ts";

/** One tier's usage. */
export interface TierStatus {
  readonly bytes: number;
  readonly budgetBytes: number;
  readonly blocks: number;
  readonly evictions: number;
}

/** The document `GET /v1/status` returns. */
export interface ServerStatus {
  readonly uptimeSeconds: number;
  readonly cache: {
    readonly hits: { readonly memory: number; readonly disk: number };
    readonly misses: number;
    /** hits / (hits + misses); null before the first lookup. */
    readonly hitRatio: number | null;
    readonly tiers: { readonly memory: TierStatus; readonly disk: TierStatus | null };
  };
  readonly origins: readonly {
    readonly name: string;
    readonly bytes: number;
    readonly reads: number;
    readonly errors: number;
    readonly active: number;
    readonly queued: number;
  }[];
  readonly servedBytes: Readonly<Record<string, number>>;
  readonly datasets: readonly {
    readonly name: string;
    readonly batches: number;
    readonly bytes: number;
    readonly hitRatio: number | null;
  }[];
  readonly consumers: readonly ConsumerLookahead[];
  readonly prefetch: readonly PrefetchProgress[];
  readonly slowBatches: { readonly byCause: Readonly<Record<SlowBatchCause, number>> | null; readonly recent: readonly SlowBatch[] };
}

/**
 * Builds the status document.
 *
 * @param src the metric sources of the server
 * @param extra prefetch jobs and uptime
 */
export function buildStatus(
  src: MetricSources,
  extra: { prefetch: () => readonly PrefetchProgress[]; uptimeSeconds: number },
): ServerStatus {
  const c = src.cache();
  const m = src.memory();
  const d = src.disk();
  const hits = c.memoryHits + c.diskHits;
  const batches = src.batches?.();
  return {
    uptimeSeconds: extra.uptimeSeconds,
    cache: {
      hits: { memory: c.memoryHits, disk: c.diskHits },
      misses: c.misses,
      hitRatio: hits + c.misses === 0 ? null : hits / (hits + c.misses),
      tiers: {
        memory: { bytes: m.bytes, budgetBytes: m.maxBytes, blocks: m.blocks, evictions: m.evictions },
        disk: d ? { bytes: d.bytes, budgetBytes: d.maxBytes, blocks: d.blocks, evictions: d.evictions } : null,
      },
    },
    origins: src.origins().map((o) => ({
      name: o.name,
      bytes: o.bytes,
      reads: o.requests.read,
      errors: o.errors,
      active: o.active,
      queued: o.queued,
    })),
    servedBytes: { ...src.served() },
    datasets: [...(batches?.datasets() ?? new Map()).entries()].map(([name, t]) => {
      const all = t.blocks.memory + t.blocks.disk + t.blocks.origin;
      return { name, batches: t.batches, bytes: t.bytes, hitRatio: all === 0 ? null : t.blocks.memory / all };
    }),
    consumers: src.lookahead?.() ?? [],
    prefetch: extra.prefetch().slice(0, 20),
    slowBatches: { byCause: batches?.slowCounts() ?? null, recent: batches?.recentSlow().slice(0, 20) ?? [] },
  };
}
