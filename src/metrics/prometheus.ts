/**
 * @module Prometheus exposition of `/metrics`. Components keep cheap counters and expose
 * `stats()` snapshots; this module reads them at scrape time (prom-client `collect`), so no
 * metrics library call sits on a cache lookup. Each server owns its own registry, so two
 * servers can run in one process.
 */

import { Counter, Gauge, Histogram, Registry } from "prom-client";
import { CountingHistogram, type HistogramSeries } from "./counting-histogram.ts";
import { type BatchStats, SLOW_BATCH_CAUSES } from "../batch/batch-stats.ts";
import type { ConsumerLookahead } from "../batch/read-ahead.ts";
import type { BodyPoolStats } from "../batch/body-pool.ts";
import type { HeldBlocksStats } from "../http/held-blocks.ts";
import type { BlockCacheStats } from "../cache/block-cache.ts";
import type { DiskTierStats } from "../cache/disk-tier.ts";
import type { MemoryTierStats } from "../cache/memory-tier.ts";
import type { OriginStats } from "../origin/origin-gateway.ts";
import type { Transport } from "../http/served-bytes.ts";

/** Where the metrics come from: snapshot functions, called at scrape time. */
export interface MetricSources {
  readonly cache: () => BlockCacheStats;
  readonly memory: () => MemoryTierStats;
  readonly disk: () => DiskTierStats | undefined;
  readonly origins: () => readonly OriginStats[];
  readonly served: () => Readonly<Record<Transport, number>>;
  /** Per-consumer dataset look-ahead (absent: no dataset layer). */
  readonly lookahead?: () => readonly ConsumerLookahead[];
  /** Blocks whose fills read-ahead started. */
  readonly readAheadBlocks?: () => number;
  /** Steps read-ahead warmed, and plans the planning thread made that were used. */
  readonly readAheadSteps?: () => { readonly warmed: number; readonly plannedAhead: number };
  /** Per-dataset traffic and slow batches. */
  readonly batches?: () => BatchStats;
  /** Dataset index builds, by where they ran (absent: no dataset layer). */
  readonly datasetBuilds?: () => { readonly eventLoop: number; readonly worker: number };
  /** The pool of HTTP batch bodies (absent or undefined: a new body per batch). */
  readonly bodies?: () => BodyPoolStats | undefined;
  /** Cached blocks that object responses are sending (absent: not bounded). */
  readonly objectHolds?: () => HeldBlocksStats;
  /** Shared-memory rings and connections (absent or undefined: the shm path is off). */
  readonly shm?: () => { readonly rings: number; readonly ringBytes: number; readonly spareRings: number; readonly connections: number } | undefined;
}

type Sample = readonly [labels: Record<string, string>, value: number];

/** A dataset's reported step timings. */
interface StepSeries {
  readonly wait: HistogramSeries;
  readonly h2d: HistogramSeries;
  readonly compute: HistogramSeries;
  healthy: number;
  unhealthy: number;
}

/**
 * The metric registry of one server.
 *
 * @example
 * ```ts
 * const metrics = new Metrics(sources);
 * const text = await metrics.render();
 * ```
 */
export class Metrics {
  readonly #registry = new Registry();
  /** Block fill durations, by where the block came from. Observed once per fill. */
  readonly fillSeconds: Histogram<"source">;
  /** Time to assemble one batch (or samples response), by whether its blocks were all in memory. */
  readonly #batchSecondsBy: Record<"hit" | "filling" | "miss", HistogramSeries>;
  readonly #tWait: CountingHistogram;
  readonly #tH2d: CountingHistogram;
  readonly #tCompute: CountingHistogram;
  /**
   * The step series of each dataset reported on, resolved once (reports carry up to 10 000 steps
   * of three timings each). As many as the registered names ever reported on.
   */
  readonly #stepSeries = new Map<string, StepSeries>();
  /** The (dataset, healthy) counts of `rackfeed_steps_total` in the order they were first counted. */
  readonly #stepCounts: [dataset: string, healthy: boolean][] = [];
  /**
   * Consumers' look-ahead, taken once per scrape: planning it costs up to `--read-ahead-max-steps`
   * plans per consumer, and four metrics read it (a scrape with 4096 consumers took 2 s when each
   * planned its own).
   */
  #lookahead: readonly ConsumerLookahead[] | undefined;

  /** Records `n` assembled batches of `seconds` each (per batch on the hot path, so without a label lookup). */
  observeBatch(seconds: number, cache: "hit" | "filling" | "miss", n = 1): void {
    this.#batchSecondsBy[cache].observe(seconds, n);
  }

  /** @param src the snapshot functions */
  constructor(src: MetricSources) {
    const reg = [this.#registry];
    const lookahead = () => (this.#lookahead ??= src.lookahead?.() ?? []);
    const counter = (name: string, help: string, labelNames: string[], read: () => Sample[]) =>
      new Counter({
        name,
        help,
        labelNames,
        registers: reg,
        collect() {
          // Mirror the component's own counter: reset, then add its current total.
          this.reset();
          for (const [labels, value] of read()) this.inc(labels, value);
        },
      });
    const gauge = (name: string, help: string, labelNames: string[], read: () => Sample[]) =>
      new Gauge({
        name,
        help,
        labelNames,
        registers: reg,
        collect() {
          this.reset();
          for (const [labels, value] of read()) this.set(labels, value);
        },
      });

    counter("rackfeed_cache_hits_total", "Block lookups answered by a cache tier", ["tier"], () => {
      const c = src.cache();
      return [[{ tier: "memory" }, c.memoryHits], [{ tier: "disk" }, c.diskHits]];
    });
    counter("rackfeed_cache_misses_total", "Blocks filled from an origin (read-ahead included)", [], () => [
      [{}, src.cache().misses],
    ]);
    counter("rackfeed_cache_coalesced_total", "Block lookups that joined a fill already in flight", [], () => [
      [{}, src.cache().coalesced],
    ]);
    counter("rackfeed_cache_fill_errors_total", "Block fills that failed", [], () => [[{}, src.cache().fillErrors]]);
    gauge("rackfeed_cache_hit_ratio", "Cache hits / (hits + misses) since start", [], () => {
      const c = src.cache();
      const hits = c.memoryHits + c.diskHits;
      return [[{}, hits + c.misses === 0 ? 0 : hits / (hits + c.misses)]];
    });
    gauge("rackfeed_cache_bytes", "Bytes held per cache tier", ["tier"], () => {
      const d = src.disk();
      return [[{ tier: "memory" }, src.memory().bytes], ...(d ? [[{ tier: "disk" }, d.bytes] as Sample] : [])];
    });
    gauge("rackfeed_cache_budget_bytes", "Byte budget per cache tier", ["tier"], () => {
      const d = src.disk();
      return [[{ tier: "memory" }, src.memory().maxBytes], ...(d ? [[{ tier: "disk" }, d.maxBytes] as Sample] : [])];
    });
    gauge("rackfeed_cache_blocks", "Blocks held per cache tier", ["tier"], () => {
      const d = src.disk();
      return [[{ tier: "memory" }, src.memory().blocks], ...(d ? [[{ tier: "disk" }, d.blocks] as Sample] : [])];
    });
    counter("rackfeed_cache_evictions_total", "Blocks evicted per tier to stay within budget", ["tier"], () => {
      const d = src.disk();
      return [[{ tier: "memory" }, src.memory().evictions], ...(d ? [[{ tier: "disk" }, d.evictions] as Sample] : [])];
    });
    counter("rackfeed_cache_corrupt_blocks_total", "Block files found corrupt and dropped", [], () => [
      [{}, src.disk()?.corrupt ?? 0],
    ]);
    counter("rackfeed_disk_writes_total", "Block writes to the NVMe tier by result", ["result"], () => {
      const d = src.disk();
      if (!d) return [];
      return [[{ result: "ok" }, d.writes], [{ result: "skipped" }, d.writesSkipped], [{ result: "error" }, d.writeErrors]];
    });
    counter("rackfeed_origin_requests_total", "Requests sent to an origin, by operation", ["origin", "op"], () =>
      src.origins().flatMap((o) =>
        (["stat", "read", "list"] as const).map((op) => [{ origin: o.name, op }, o.requests[op]] as Sample)
      ));
    counter("rackfeed_origin_bytes_total", "Payload bytes read from an origin", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.bytes] as Sample));
    counter("rackfeed_origin_errors_total", "Failed origin requests", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.errors] as Sample));
    counter("rackfeed_origin_retries_total", "Origin requests tried again after a failure", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.retries] as Sample));
    counter("rackfeed_origin_timeouts_total", "Origin requests abandoned by the per-request timeout", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.timeouts] as Sample));
    counter("rackfeed_origin_hedged_requests_total", "Hedged second requests, by whether they finished first", ["origin", "won"], () =>
      src.origins().flatMap((o) => [
        [{ origin: o.name, won: "true" }, o.hedgeWins] as Sample,
        [{ origin: o.name, won: "false" }, o.hedges - o.hedgeWins] as Sample,
      ]));
    counter("rackfeed_origin_metadata_hits_total", "Object metadata answered from the TTL cache", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.metadataHits] as Sample));
    gauge("rackfeed_origin_inflight_requests", "Origin requests in flight", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.active] as Sample));
    gauge("rackfeed_origin_queued_requests", "Origin requests waiting for a slot", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.queued] as Sample));
    gauge("rackfeed_origin_down", "1 while the origin is judged down (its last requests all failed): requests fail at once but one probe at a time", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.down ? 1 : 0] as Sample));
    gauge("rackfeed_origin_concurrency_limit", "Origin reads allowed in flight now (halved when the origin throttles, regained gradually)", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.concurrencyLimit] as Sample));
    gauge("rackfeed_origin_concurrency_ceiling", "What the read limit may grow to now: reads in flight that sustain --origin-target-bandwidth at the measured latency and bandwidth", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.concurrencyCeiling] as Sample));
    counter("rackfeed_origin_throttled_total", "Attempts the origin throttled (503 SlowDown, 429)", ["origin"], () =>
      src.origins().map((o) => [{ origin: o.name }, o.throttled] as Sample));
    const adaptive = () => src.origins().filter((o) => o.partBytes !== undefined);
    gauge("rackfeed_origin_part_bytes", "Origin read size now (adaptive parts)", ["origin"], () =>
      adaptive().map((o) => [{ origin: o.name }, o.partBytes!] as Sample));
    gauge("rackfeed_origin_first_byte_seconds", "Moving average of a read's time to first byte", ["origin"], () =>
      adaptive().map((o) => [{ origin: o.name }, o.firstByteSeconds!] as Sample));
    gauge("rackfeed_origin_stream_bytes_per_second", "Moving average of one read's body bandwidth", ["origin"], () =>
      adaptive().map((o) => [{ origin: o.name }, o.streamBytesPerSecond!] as Sample));
    const shm = () => src.shm?.() ?? { rings: 0, ringBytes: 0, spareRings: 0, connections: 0 };
    gauge("rackfeed_shm_rings", "Shared-memory rings open (one per co-located consumer)", [], () => [[{}, shm().rings]]);
    gauge("rackfeed_shm_ring_bytes", "Bytes of all shared-memory ring files, spare ones included", [], () => [[{}, shm().ringBytes]]);
    gauge("rackfeed_shm_spare_rings", "Rings of ended consumers kept for the next consumer of the same ring size", [], () => [[{}, shm().spareRings]]);
    gauge("rackfeed_shm_connections", "Connections on the shared-memory control socket", [], () => [[{}, shm().connections]]);
    counter("rackfeed_served_bytes_total", "Body bytes handed to each transport", ["transport"], () =>
      Object.entries(src.served()).map(([transport, v]) => [{ transport }, v] as Sample));
    // The batch body pool's figures; none where the pool is off.
    const pool = (pick: (b: BodyPoolStats) => Sample[]) => (): Sample[] => {
      const b = src.bodies?.();
      return b ? pick(b) : [];
    };
    counter("rackfeed_batch_bodies_total", "HTTP batch bodies by where they came from: reused from the pool, or newly allocated", ["source"],
      pool((b) => [[{ source: "pool" }, b.reused], [{ source: "new" }, b.allocated]]));
    gauge("rackfeed_batch_body_pool_bytes", "Bytes of sent HTTP batch bodies waiting in the pool for reuse", [], pool((b) => [[{}, b.bytes]]));
    gauge("rackfeed_batch_inflight_bytes", "Bytes of HTTP batch bodies assembled and not yet sent (bounded by --batch-inflight-bytes)", [],
      pool((b) => [[{}, b.inflightBytes]]));
    gauge("rackfeed_batch_waiting", "HTTP batches waiting for room under --batch-inflight-bytes", [], pool((b) => [[{}, b.waiting]]));
    counter("rackfeed_batch_abandoned_total", "HTTP batches not assembled: their client left while they waited for room", [],
      pool((b) => [[{}, b.abandoned]]));
    counter("rackfeed_batch_refused_total", "HTTP batches refused with 503: too many waited for room, or one waited too long", [],
      pool((b) => [[{}, b.refused]]));
    const holds = (pick: (h: HeldBlocksStats) => number) => (): Sample[] => {
      const h = src.objectHolds?.();
      return h ? [[{}, pick(h)]] : [];
    };
    gauge("rackfeed_object_inflight_bytes", "Bytes of the cached blocks object responses are sending, each counted once (bounded by --object-inflight-bytes)", [],
      holds((h) => h.bytes));
    gauge("rackfeed_object_inflight_blocks", "Cached blocks object responses are sending", [], holds((h) => h.blocks));
    gauge("rackfeed_object_reads_waiting", "Object responses waiting for room under --object-inflight-bytes", [], holds((h) => h.waiting));
    counter("rackfeed_object_reads_refused_total", "Object reads refused with 503 (or cut, once their headers were out): too many waited for room, or one waited too long", [],
      holds((h) => h.refused));

    const consumerLabels = ["dataset", "rank", "world", "micro_batch"];
    const consumerSamples = (pick: (c: ConsumerLookahead) => number) => () =>
      lookahead().map((c) =>
        [{ dataset: c.dataset, rank: String(c.rank), world: String(c.world), micro_batch: String(c.microBatch) }, pick(c)] as Sample
      );
    gauge("rackfeed_readahead_steps", "Steps after a consumer's last one whose blocks are all in memory", consumerLabels,
      consumerSamples((c) => c.stepsBuffered));
    gauge("rackfeed_readahead_seconds", "Seconds of a consumer's consumption buffered in memory (steps x step time)",
      consumerLabels, consumerSamples((c) => c.secondsBuffered));
    gauge("rackfeed_consumer_step_seconds", "A consumer's observed time between steps (moving average)", consumerLabels,
      consumerSamples((c) => c.stepSeconds));
    counter("rackfeed_readahead_blocks_total", "Block fills started by dataset read-ahead", [], () =>
      [[{}, src.readAheadBlocks?.() ?? 0]]);
    counter("rackfeed_readahead_steps_total", "Steps whose blocks dataset read-ahead warmed", [], () => [[{}, src.readAheadSteps?.().warmed ?? 0]]);
    counter("rackfeed_plans_made_ahead_total", "Plans of steps made on the planning thread (--planning-thread) and used: each one the event loop did not make", [], () =>
      [[{}, src.readAheadSteps?.().plannedAhead ?? 0]]);
    counter("rackfeed_stream_readahead_stalls_total", "Times an object stream caught up with its read-ahead, which then doubled (up to the cap)", [], () =>
      [[{}, src.cache().streamStalls]]);

    const datasets = () => [...(src.batches?.().datasets() ?? new Map()).entries()];
    counter("rackfeed_dataset_blocks_total", "Blocks a dataset's batches used, by where they came from (memory = hit)",
      ["dataset", "source"], () =>
        datasets().flatMap(([dataset, d]) =>
          (["memory", "disk", "origin"] as const).map((source) => [{ dataset, source }, d.blocks[source]] as Sample)
        ));
    gauge("rackfeed_dataset_hit_ratio", "Share of a dataset's batch blocks found in memory, since start", ["dataset"], () =>
      datasets().map(([dataset, d]) => {
        const all = d.blocks.memory + d.blocks.disk + d.blocks.origin;
        return [{ dataset }, all === 0 ? 0 : d.blocks.memory / all] as Sample;
      }));
    counter("rackfeed_dataset_batches_total", "Batch and samples responses per dataset", ["dataset"], () =>
      datasets().map(([dataset, d]) => [{ dataset }, d.batches] as Sample));
    counter("rackfeed_dataset_served_bytes_total", "Token bytes served per dataset", ["dataset"], () =>
      datasets().map(([dataset, d]) => [{ dataset }, d.bytes] as Sample));
    gauge("rackfeed_dataset_consumers", "Consumers (rank, world, micro_batch) seen per dataset", ["dataset"], () => {
      const n = new Map<string, number>();
      for (const c of lookahead()) n.set(c.dataset, (n.get(c.dataset) ?? 0) + 1);
      return [...n].map(([dataset, v]) => [{ dataset }, v] as Sample);
    });
    counter("rackfeed_dataset_builds_total", "Dataset index builds (registrations and rebuilds), by where they ran: large ones on a worker thread", ["thread"], () => {
      const b = src.datasetBuilds?.();
      return b ? [[{ thread: "event_loop" }, b.eventLoop], [{ thread: "worker" }, b.worker]] : [];
    });
    counter("rackfeed_slow_batches_total", "Batches slower than --slow-batch, by cause", ["cause"], () => {
      const counts = src.batches?.().slowCounts();
      return SLOW_BATCH_CAUSES.map((cause) => [{ cause }, counts?.[cause] ?? 0] as Sample);
    });

    const batchSeconds = new CountingHistogram({
      name: "rackfeed_batch_seconds",
      help: "Time to assemble a batch or samples response; cache=hit (all blocks in memory), filling (some still arriving), miss",
      labelNames: ["cache"],
      buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
      registers: reg,
    });
    this.#batchSecondsBy = { hit: batchSeconds.series("hit"), filling: batchSeconds.series("filling"), miss: batchSeconds.series("miss") };

    const stepBuckets = [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
    const stepHistogram = (name: string, help: string) =>
      new CountingHistogram({ name, help, labelNames: ["dataset"], buckets: stepBuckets, registers: reg });
    this.#tWait = stepHistogram("rackfeed_t_wait_seconds", "Trainer-reported time a step waited for its batch (client SDK)");
    this.#tH2d = stepHistogram("rackfeed_t_h2d_seconds", "Trainer-reported host-to-device copy time of a batch");
    this.#tCompute = stepHistogram("rackfeed_t_compute_seconds", "Trainer-reported compute time of a step");
    counter("rackfeed_steps_total", "Reported steps with all three timings; healthy when t_wait + t_h2d < t_compute", ["dataset", "healthy"], () => {
      // In the order each count was first reached, as prom-client orders a counter's series.
      return this.#stepCounts.map(([dataset, healthy]) => {
        const s = this.#stepSeries.get(dataset)!;
        return [{ dataset, healthy: String(healthy) }, healthy ? s.healthy : s.unhealthy] as Sample;
      });
    });

    this.fillSeconds = new Histogram({
      name: "rackfeed_fill_seconds",
      help: "Time to fill one block, by source",
      labelNames: ["source"],
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
      registers: reg,
    });
  }

  /** Records one reported step of a consumer of `dataset`. */
  observeStep(dataset: string, s: { t_wait?: number; t_h2d?: number; t_compute?: number }): void {
    let series = this.#stepSeries.get(dataset);
    if (series === undefined) {
      series = { wait: this.#tWait.series(dataset), h2d: this.#tH2d.series(dataset), compute: this.#tCompute.series(dataset), healthy: 0, unhealthy: 0 };
      this.#stepSeries.set(dataset, series);
    }
    if (s.t_wait !== undefined) series.wait.observe(s.t_wait);
    if (s.t_h2d !== undefined) series.h2d.observe(s.t_h2d);
    if (s.t_compute !== undefined) series.compute.observe(s.t_compute);
    if (s.t_wait !== undefined && s.t_h2d !== undefined && s.t_compute !== undefined) {
      const healthy = s.t_wait + s.t_h2d < s.t_compute;
      if ((healthy ? series.healthy++ : series.unhealthy++) === 0) this.#stepCounts.push([dataset, healthy]);
    }
  }

  /** Content type of the exposition. */
  get contentType(): string {
    return this.#registry.contentType;
  }

  /** The exposition text. */
  async render(): Promise<string> {
    this.#lookahead = undefined;
    try {
      return await this.#registry.metrics();
    } finally {
      this.#lookahead = undefined;
    }
  }
}
