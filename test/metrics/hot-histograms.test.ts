// The batch-time and step-timing histograms are rackfeed's own (CountingHistogram, for the hot
// path): their exposition must stay what prom-client's Histogram and Counter render for the same
// observations, in the same order.
import { Counter, Histogram, Registry } from "prom-client";
import { describe, expect, it } from "vitest";
import { Metrics } from "../../src/metrics/prometheus.ts";

const sources = {
  cache: () => ({ memoryHits: 0, diskHits: 0, misses: 0, coalesced: 0, fillErrors: 0, inFlight: 0, streamStalls: 0, keysKept: 0 }),
  memory: () => ({ bytes: 0, blocks: 0, maxBytes: 1, evictions: 0 }),
  disk: () => undefined,
  origins: () => [],
  served: () => ({ http1: 0, http2: 0, shm: 0 }),
};
const FAMILIES = ["rackfeed_batch_seconds", "rackfeed_t_wait_seconds", "rackfeed_t_h2d_seconds", "rackfeed_t_compute_seconds", "rackfeed_steps_total"];
/** The lines of the families above, each family's block in the order rendered. */
function sections(text: string): string {
  const blocks = new Map<string, string[]>();
  for (const line of text.split("\n")) {
    const name = FAMILIES.find((f) => line.startsWith(`# HELP ${f} `) || line.startsWith(`# TYPE ${f} `) || line.startsWith(`${f}_`) || line.startsWith(`${f}{`) || line.startsWith(`${f} `));
    if (name) blocks.set(name, [...(blocks.get(name) ?? []), line]);
  }
  return FAMILIES.map((f) => (blocks.get(f) ?? []).join("\n")).join("\n");
}

function reference() {
  const reg = new Registry();
  const batch = new Histogram({
    name: "rackfeed_batch_seconds",
    help: "Time to assemble a batch or samples response; cache=hit (all blocks in memory), filling (some still arriving), miss",
    labelNames: ["cache"],
    buckets: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5],
    registers: [reg],
  });
  const stepBuckets = [0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10];
  const h = (name: string, help: string) => new Histogram({ name, help, labelNames: ["dataset"], buckets: stepBuckets, registers: [reg] });
  const wait = h("rackfeed_t_wait_seconds", "Trainer-reported time a step waited for its batch (client SDK)");
  const h2d = h("rackfeed_t_h2d_seconds", "Trainer-reported host-to-device copy time of a batch");
  const compute = h("rackfeed_t_compute_seconds", "Trainer-reported compute time of a step");
  const steps = new Counter({ name: "rackfeed_steps_total", help: "Reported steps with all three timings; healthy when t_wait + t_h2d < t_compute", labelNames: ["dataset", "healthy"], registers: [reg] });
  return {
    reg,
    observeBatch: (s: number, cache: string) => batch.observe({ cache }, s),
    observeStep(dataset: string, s: { t_wait?: number; t_h2d?: number; t_compute?: number }) {
      if (s.t_wait !== undefined) wait.observe({ dataset }, s.t_wait);
      if (s.t_h2d !== undefined) h2d.observe({ dataset }, s.t_h2d);
      if (s.t_compute !== undefined) compute.observe({ dataset }, s.t_compute);
      if (s.t_wait !== undefined && s.t_h2d !== undefined && s.t_compute !== undefined) steps.inc({ dataset, healthy: String(s.t_wait + s.t_h2d < s.t_compute) });
    },
  };
}

describe("the /metrics text of batch times and trainers' step timings", () => {
  it("is prom-client's Histogram and Counter text before any observation", async () => {
    expect(sections(await new Metrics(sources as never).render())).toBe(sections(await reference().reg.metrics()));
  });

  it("is prom-client's text, series in first-observation order: a miss before any hit, datasets first reported with different timings", async () => {
    const m = new Metrics(sources as never);
    const ref = reference();
    for (const x of [m, ref]) {
      x.observeBatch(0.002, "miss");
      x.observeBatch(0.0001, "hit");
      x.observeStep("b", { t_h2d: 0.01 });
      x.observeStep("a", { t_wait: 0.001, t_h2d: 0.002, t_compute: 0.1 });
      x.observeStep("a", { t_wait: 1, t_h2d: 1, t_compute: 0.5 });
      x.observeStep("b", { t_wait: 0.5, t_h2d: 0, t_compute: 1 });
    }
    expect(sections(await m.render())).toBe(sections(await ref.reg.metrics()));
  });
});
