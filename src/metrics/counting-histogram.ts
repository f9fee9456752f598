/**
 * @module A Prometheus histogram for the per-batch and per-step paths. prom-client's `observe`
 * checks and hashes the labels on every call, even through `labels()` (a closure, an object and
 * a string each time): 0.2–0.3 µs per observation, several per token batch. Here a series is
 * resolved once and an observation is a bucket search and two additions; prom-client still
 * renders it, in its own format, through `get()`.
 */

import type { Registry } from "prom-client";

/** Options of {@link CountingHistogram}. */
export interface CountingHistogramOptions {
  readonly name: string;
  readonly help: string;
  readonly labelNames: readonly string[];
  /** Upper bounds, increasing (`+Inf` is implied). */
  readonly buckets: readonly number[];
  readonly registers: readonly Registry[];
}

/** One label set's counts: what a hot path keeps and observes into. */
export class HistogramSeries {
  /** Observations per bucket (not cumulative); the last counts those above every bound. */
  readonly counts: Float64Array;
  sum = 0;
  count = 0;
  readonly #bounds: Float64Array;
  readonly #onFirst: (s: HistogramSeries) => void;

  /** @internal made by `CountingHistogram.series` */
  constructor(readonly labels: Readonly<Record<string, string>>, bounds: Float64Array, onFirst: (s: HistogramSeries) => void) {
    this.#bounds = bounds;
    this.#onFirst = onFirst;
    this.counts = new Float64Array(bounds.length + 1);
  }

  /**
   * Records `n` observations of `value` seconds (several batches copied together share their time).
   * Not finite values are dropped: they cannot be placed in a bucket.
   */
  observe(value: number, n = 1): void {
    if (!Number.isFinite(value)) return;
    if (this.count === 0) this.#onFirst(this);
    const bounds = this.#bounds;
    let b = 0;
    while (b < bounds.length && value > bounds[b]) b++;
    this.counts[b] += n;
    this.sum += value * n;
    this.count += n;
  }
}

/** A prom-client metric value, as its registry renders it. */
interface MetricValue {
  readonly labels: Record<string, string | number>;
  readonly sharedLabels?: Record<string, string>;
  readonly value: number;
  readonly metricName: string;
  /** Buckets carry none (prom-client's shape: `null`, not absent). */
  readonly exemplar?: null;
}

/**
 * A histogram whose series are resolved once and observed without a label lookup.
 *
 * @example
 * ```ts
 * const h = new CountingHistogram({ name: "rackfeed_t_wait_seconds", help: "…", labelNames: ["dataset"], buckets: [0.001, 0.01], registers: [registry] });
 * const web = h.series("web");
 * web.observe(0.004);
 * ```
 */
export class CountingHistogram {
  readonly name: string;
  readonly help: string;
  readonly type = "histogram";
  readonly aggregator = "sum";
  readonly #labelNames: readonly string[];
  readonly #bounds: Float64Array;
  readonly #series = new Map<string, HistogramSeries>();
  /** Series in the order of their first observation (since the last reset): prom-client's order. */
  #observed: HistogramSeries[] = [];

  /**
   * @param opts name, help, label names, bucket bounds and the registries to join
   * @throws {RangeError} when the bounds are not finite and increasing
   */
  constructor(opts: CountingHistogramOptions) {
    this.name = opts.name;
    this.help = opts.help;
    this.#labelNames = opts.labelNames;
    if (!opts.buckets.every((b, i) => Number.isFinite(b) && (i === 0 || b > opts.buckets[i - 1]))) {
      throw new RangeError(`Histogram ${opts.name}: bucket bounds must be finite and increasing, got ${opts.buckets.join(", ")}`);
    }
    this.#bounds = Float64Array.from(opts.buckets);
    for (const r of opts.registers) r.registerMetric(this as never);
  }

  /**
   * The series of these label values (in `labelNames` order), made at its first use. Callers keep
   * it: this lookup joins the values into a key.
   *
   * @throws {RangeError} when the number of values is not the number of label names
   */
  series(...values: string[]): HistogramSeries {
    if (values.length !== this.#labelNames.length) {
      throw new RangeError(`Histogram ${this.name} has labels ${this.#labelNames.join(", ")}; got ${values.length} values`);
    }
    const key = values.join("\u0000");
    let s = this.#series.get(key);
    if (s === undefined) {
      s = new HistogramSeries(Object.fromEntries(this.#labelNames.map((l, i) => [l, values[i]])), this.#bounds, (first) => this.#observed.push(first));
      this.#series.set(key, s);
    }
    return s;
  }

  /** Forgets every observation (prom-client's `resetMetrics`); series already handed out restart from zero. */
  reset(): void {
    this.#observed = [];
    for (const s of this.#series.values()) {
      s.counts.fill(0);
      s.sum = 0;
      s.count = 0;
    }
  }

  /** The values as prom-client's registry renders a histogram: cumulative buckets, `+Inf`, sum and count per observed series. */
  getForPromString(): { name: string; help: string; type: string; aggregator: string; values: MetricValue[] } {
    const values: MetricValue[] = [];
    const bucket = `${this.name}_bucket`;
    // As prom-client: a series appears with its first observation, in that order.
    for (const s of this.#observed) {
      let acc = 0;
      for (let b = 0; b < this.#bounds.length; b++) {
        acc += s.counts[b];
        values.push({ labels: { le: this.#bounds[b] }, sharedLabels: s.labels, value: acc, metricName: bucket, exemplar: null });
      }
      values.push({ labels: { le: "+Inf" }, sharedLabels: s.labels, value: s.count, metricName: bucket, exemplar: null });
      values.push({ labels: {}, sharedLabels: s.labels, value: s.sum, metricName: `${this.name}_sum` });
      values.push({ labels: {}, sharedLabels: s.labels, value: s.count, metricName: `${this.name}_count` });
    }
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  /** The same values with each series' labels merged in (prom-client's JSON form). */
  get(): Promise<{ name: string; help: string; type: string; aggregator: string; values: MetricValue[] }> {
    const data = this.getForPromString();
    return Promise.resolve({ ...data, values: data.values.map(({ sharedLabels, ...v }) => ({ ...v, labels: { ...v.labels, ...sharedLabels } })) });
  }
}
