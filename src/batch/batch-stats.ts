/**
 * @module What batches cost, per dataset: block sources (memory, disk, origin), bytes served,
 * and slow batches with their cause — the distinction a person needs when batches stall.
 */

import type { AssembledBatch } from "./assemble-batch.ts";

/** Why a batch was slow. */
export type SlowBatchCause = "readahead_exhausted" | "origin_slow" | "disk_slow" | "assembly";

/** Every cause, for metrics that should show zeros too. */
export const SLOW_BATCH_CAUSES: readonly SlowBatchCause[] = ["readahead_exhausted", "origin_slow", "disk_slow", "assembly"];

/** The numbers a slow batch is judged on. */
export type BatchCost = Pick<
  AssembledBatch,
  "blocksTotal" | "blocksMissing" | "missingFromOrigin" | "blocksFilling" | "fromMemory" | "fromDisk" | "fromOrigin" | "fetchSeconds" | "copySeconds"
>;

/**
 * Decides why a batch was slow:
 * - `assembly`: planning and copying took longer than waiting for blocks (or nothing was waited for);
 * - `readahead_exhausted`: blocks nobody had started fetching had to come from the origin —
 *   the consumer outran its look-ahead (or has none);
 * - `origin_slow`: the blocks were already being fetched (read-ahead was on it) but the origin
 *   did not deliver in time;
 * - `disk_slow`: the wait was for blocks read from the NVMe tier.
 */
export function classifySlowBatch(c: BatchCost): SlowBatchCause {
  if (c.copySeconds >= c.fetchSeconds || c.fromMemory === c.blocksTotal) return "assembly";
  // Blocks nobody had started fetching that came from the origin (not those read from NVMe while
  // read-ahead's origin fills were late: that wait is the origin's).
  if (c.missingFromOrigin > 0) return "readahead_exhausted";
  if (c.fromOrigin > 0) return "origin_slow";
  // Fills already in flight that came from the NVMe tier (read-ahead's disk reads) are the disk's.
  if (c.fromDisk > 0) return "disk_slow";
  return "assembly";
}

/** One slow batch, as the dashboard lists it. */
export interface SlowBatch extends BatchCost {
  readonly at: string;
  readonly dataset: string;
  /** e.g. `rank 3/8 × 4 step 1200`, or `samples 0+16`. */
  readonly request: string;
  readonly seconds: number;
  readonly cause: SlowBatchCause;
}

/** Per-dataset counters. */
export interface DatasetTraffic {
  readonly batches: number;
  readonly bytes: number;
  readonly blocks: { readonly memory: number; readonly disk: number; readonly origin: number };
}

/** Options of `BatchStats`. */
export interface BatchStatsOptions {
  /** A batch slower than this is classified, logged and counted. */
  readonly slowSeconds: number;
  /** Slow batches kept for the dashboard. */
  readonly keep: number;
  /** Wall clock (ms since the epoch), for timestamps. */
  readonly clock: () => number;
  readonly log: (line: string) => void;
}

/**
 * Accumulates what batches cost.
 *
 * @example
 * ```ts
 * const stats = new BatchStats({ slowSeconds: 0.1, keep: 50, clock: Date.now, log: console.error });
 * stats.record("pile", () => "rank 0/8 × 4 step 12", batch, 0.25); // logs and counts a slow batch
 * ```
 */
export class BatchStats {
  readonly #opts: BatchStatsOptions;
  readonly #datasets = new Map<string, { batches: number; bytes: number; blocks: { memory: number; disk: number; origin: number } }>();
  readonly #slow: SlowBatch[] = [];
  readonly #slowCounts: Record<SlowBatchCause, number> = { readahead_exhausted: 0, origin_slow: 0, disk_slow: 0, assembly: 0 };

  /** @param opts threshold, history length, clock and log */
  constructor(opts: BatchStatsOptions) {
    this.#opts = opts;
  }

  /**
   * Records one served batch; returns its cause when it was slow. `request` names the batch
   * (e.g. `rank 0/8 × 4 step 12`) and is only called for a slow one: no string per batch.
   */
  record(dataset: string, request: () => string, batch: AssembledBatch, seconds: number): SlowBatchCause | undefined {
    let d = this.#datasets.get(dataset);
    if (!d) {
      d = { batches: 0, bytes: 0, blocks: { memory: 0, disk: 0, origin: 0 } };
      this.#datasets.set(dataset, d);
    }
    d.batches++;
    d.bytes += batch.body.length;
    d.blocks.memory += batch.fromMemory;
    d.blocks.disk += batch.fromDisk;
    d.blocks.origin += batch.fromOrigin;
    if (seconds < this.#opts.slowSeconds) return undefined;
    const cause = classifySlowBatch(batch);
    this.#slowCounts[cause]++;
    const entry: SlowBatch = {
      at: new Date(this.#opts.clock()).toISOString(),
      dataset,
      request: request(),
      seconds,
      cause,
      blocksTotal: batch.blocksTotal,
      blocksMissing: batch.blocksMissing,
      missingFromOrigin: batch.missingFromOrigin,
      blocksFilling: batch.blocksFilling,
      fromMemory: batch.fromMemory,
      fromDisk: batch.fromDisk,
      fromOrigin: batch.fromOrigin,
      fetchSeconds: batch.fetchSeconds,
      copySeconds: batch.copySeconds,
    };
    this.#slow.push(entry);
    if (this.#slow.length > this.#opts.keep) this.#slow.shift();
    this.#opts.log(
      `slow batch: ${dataset} ${entry.request} took ${(seconds * 1000).toFixed(1)} ms, cause ${cause} ` +
        `(blocks ${batch.blocksTotal}: ${batch.fromMemory} memory, ${batch.fromDisk} disk, ${batch.fromOrigin} origin; ` +
        `${batch.blocksMissing} not yet fetched (${batch.missingFromOrigin} from the origin), ${batch.blocksFilling} still arriving; ` +
        `wait ${(batch.fetchSeconds * 1000).toFixed(1)} ms, copy ${(batch.copySeconds * 1000).toFixed(1)} ms)`,
    );
    return cause;
  }

  /** Per-dataset counters. */
  datasets(): ReadonlyMap<string, DatasetTraffic> {
    return this.#datasets;
  }

  /** Slow batches by cause, since start. */
  slowCounts(): Readonly<Record<SlowBatchCause, number>> {
    return this.#slowCounts;
  }

  /** The most recent slow batches, newest first. */
  recentSlow(): SlowBatch[] {
    return [...this.#slow].reverse();
  }
}
