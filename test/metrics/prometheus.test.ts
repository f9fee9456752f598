import { describe, expect, it } from "vitest";
import type { ConsumerLookahead } from "../../src/batch/read-ahead.ts";
import { Metrics } from "../../src/metrics/prometheus.ts";

/** Sources of a server with no traffic, plus consumers whose look-ahead counts its calls. */
function sources(consumers: ConsumerLookahead[], calls: { n: number }) {
  return {
    cache: () => ({ memoryHits: 0, diskHits: 0, misses: 0, coalesced: 0, fillErrors: 0, inFlight: 0, streamStalls: 0, keysKept: 0 }),
    memory: () => ({ bytes: 0, blocks: 0, maxBytes: 1, evictions: 0 }),
    disk: () => undefined,
    origins: () => [],
    served: () => ({ http1: 0, http2: 0, shm: 0 }),
    lookahead: () => {
      calls.n++;
      return consumers;
    },
  };
}

const consumer = (rank: number): ConsumerLookahead => ({
  dataset: "d",
  rank,
  world: 2,
  microBatch: 8,
  step: 10,
  stepSeconds: 0.5,
  stepsBuffered: 4,
  secondsBuffered: 2,
  stepsScheduled: 6,
});

describe("Metrics", () => {
  it("plans consumers' look-ahead once per scrape, for all four metrics that show it", async () => {
    const calls = { n: 0 };
    const metrics = new Metrics(sources([consumer(0), consumer(1)], calls) as never);
    const text = await metrics.render();
    expect(calls.n).toBe(1);
    expect(text).toMatch(/rackfeed_readahead_steps\{dataset="d",rank="1",world="2",micro_batch="8"\} 4/);
    expect(text).toMatch(/rackfeed_readahead_seconds\{dataset="d",rank="0",world="2",micro_batch="8"\} 2/);
    expect(text).toMatch(/rackfeed_consumer_step_seconds\{dataset="d",rank="0",world="2",micro_batch="8"\} 0.5/);
    expect(text).toMatch(/rackfeed_dataset_consumers\{dataset="d"\} 2/);
  });

  it("takes a fresh look-ahead on the next scrape", async () => {
    const calls = { n: 0 };
    const consumers = [consumer(0)];
    const metrics = new Metrics(sources(consumers, calls) as never);
    await metrics.render();
    consumers.push(consumer(1));
    const text = await metrics.render();
    expect(calls.n).toBe(2);
    expect(text).toMatch(/rackfeed_dataset_consumers\{dataset="d"\} 2/);
  });
});
