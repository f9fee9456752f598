import { Histogram, Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { CountingHistogram } from "../../src/metrics/counting-histogram.ts";

const BUCKETS = [0.001, 0.01, 0.1, 1];

describe("CountingHistogram", () => {
  it("renders exactly what prom-client's Histogram renders for the same observations", async () => {
    const ours = new Registry();
    const theirs = new Registry();
    const h = new CountingHistogram({ name: "x_seconds", help: "Some time", labelNames: ["dataset", "cache"], buckets: BUCKETS, registers: [ours] });
    const p = new Histogram({ name: "x_seconds", help: "Some time", labelNames: ["dataset", "cache"], buckets: BUCKETS, registers: [theirs] });
    const observations: [string, string, number][] = [
      ["web", "hit", 0.0005], ["web", "hit", 0.001], ["web", "hit", 0.0011], ["web", "miss", 0.5],
      ["code", "hit", 3], ["code", "hit", 0], ["web", "hit", 0.09],
    ];
    h.series("code", "miss"); // resolved before any other, observed last: rendered last, as prom-client orders series
    observations.push(["code", "miss", 0.02]);
    for (const [dataset, cache, v] of observations) {
      h.series(dataset, cache).observe(v);
      p.observe({ dataset, cache }, v);
    }
    h.series("never", "observed"); // a series nobody observed is not rendered, as in prom-client
    expect(await ours.metrics()).toBe(await theirs.metrics());
    expect(await ours.getMetricsAsJSON()).toEqual(await theirs.getMetricsAsJSON());
  });

  it("counts n observations of one value at once, and forgets them on reset", async () => {
    const reg = new Registry();
    const h = new CountingHistogram({ name: "y_seconds", help: "h", labelNames: ["cache"], buckets: BUCKETS, registers: [reg] });
    const hit = h.series("hit");
    expect(h.series("hit")).toBe(hit); // resolved once, kept
    hit.observe(0.005, 16);
    hit.observe(Number.NaN); // dropped: no bucket holds it
    expect(hit.count).toBe(16);
    expect(hit.sum).toBeCloseTo(0.08, 12);
    const text = await reg.metrics();
    expect(text).toContain('y_seconds_bucket{le="0.001",cache="hit"} 0');
    expect(text).toContain('y_seconds_bucket{le="0.01",cache="hit"} 16');
    expect(text).toContain('y_seconds_count{cache="hit"} 16');
    reg.resetMetrics();
    expect(await reg.metrics()).not.toContain("y_seconds_count");
    // After a reset, series come back in the order of their new first observations.
    const miss = h.series("miss");
    miss.observe(0.5);
    hit.observe(0.5);
    const again = await reg.metrics();
    expect(again.indexOf('cache="miss"')).toBeLessThan(again.indexOf('cache="hit"'));
  });

  it("refuses bounds that are not increasing and label values that do not match the names", () => {
    expect(() => new CountingHistogram({ name: "z", help: "h", labelNames: [], buckets: [1, 0.5], registers: [] })).toThrow(/increasing/);
    const h = new CountingHistogram({ name: "z", help: "h", labelNames: ["a"], buckets: [1], registers: [] });
    expect(() => h.series()).toThrow(/labels a; got 0 values/);
  });
});
