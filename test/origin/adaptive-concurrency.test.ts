import { describe, expect, it } from "vitest";
import { OriginGateway } from "../../src/origin/origin-gateway.ts";
import type { ListedObject, ObjectInfo, Origin } from "../../src/origin/origin.ts";
import type { ReadTiming } from "../../src/origin/part-sizer.ts";

const MiB = 2 ** 20;
const INFO: ObjectInfo = { size: 2 ** 40, version: "v1", etag: '"v1"', lastModified: new Date(0) };

/**
 * An origin that answers at once but reports each read as taking `firstByteMs` to its first byte
 * and `bytesPerSecond` per connection after that (what an S3 origin measures), and throttles on demand.
 */
class TimedOrigin implements Origin {
  readonly name = "far";
  firstByteMs = 50;
  bytesPerSecond = 10e6;
  #reads: ((t: ReadTiming) => void)[] = [];
  #throttles: (() => void)[] = [];
  stat(): Promise<ObjectInfo> {
    return Promise.resolve(INFO);
  }
  read(_key: string, _info: ObjectInfo, _offset: number, dest: Uint8Array): Promise<void> {
    const t = { bytes: dest.length, firstByteMs: this.firstByteMs, totalMs: this.firstByteMs + (dest.length / this.bytesPerSecond) * 1000 };
    for (const o of this.#reads) o(t);
    return Promise.resolve();
  }
  list(): Promise<ListedObject[]> {
    return Promise.resolve([]);
  }
  observeReads(o: (t: ReadTiming) => void): void {
    this.#reads.push(o);
  }
  observeThrottling(o: () => void): void {
    this.#throttles.push(o);
  }
  throttle(): void {
    for (const o of this.#throttles) o();
  }
  close(): Promise<void> {
    return Promise.resolve();
  }
}

function gateway(origin: TimedOrigin, maxConcurrency: number, now = () => performance.now()) {
  return new OriginGateway(origin, {
    concurrency: 4,
    maxConcurrency,
    targetBytesPerSecond: 512 * MiB,
    maxQueue: 1000,
    metadataTtl: 0,
    now,
    parts: { minBytes: MiB, maxBytes: 8 * MiB },
  });
}

async function reads(gw: OriginGateway, n: number, bytes = MiB): Promise<void> {
  const dest = new Uint8Array(bytes);
  for (let i = 0; i < n; i++) await gw.read("k", INFO, 0, dest);
}

describe("adaptive origin concurrency (Little's law, slow start, AIMD)", () => {
  it("grows the read limit from --origin-concurrency to what the origin's latency × bandwidth needs, doubling per window", async () => {
    const origin = new TimedOrigin(); // 50 ms to first byte, 10 MB/s per connection
    const gw = gateway(origin, 64);
    expect(gw.stats()).toMatchObject({ concurrencyLimit: 4, concurrencyCeiling: 4 });
    await reads(gw, 7); // the part sizer's warm-up (8 reads): nothing known yet
    expect(gw.stats()).toMatchObject({ concurrencyLimit: 4, concurrencyCeiling: 4 });
    await reads(gw, 1);
    // Parts grow to 4 × 0.05 s × 10 MB/s = 2 MB -> 2 MiB; one read takes 50 ms + 2 MiB / 10 MB/s
    // = 259.7 ms, so 512 MiB/s needs 512 MiB/s × 0.2597 s / 2 MiB = 66.5 reads in flight: 64 at most.
    const s = gw.stats();
    expect(s.partBytes).toBe(2 * MiB);
    expect(s.concurrencyCeiling).toBe(64);
    // Slow start: each window of `limit` successful reads doubles the limit, 4 -> 8 -> 16 -> 32 -> 64.
    const seen = [gw.stats().concurrencyLimit];
    for (let i = 0; i < 200 && gw.stats().concurrencyLimit < 64; i++) {
      await reads(gw, 1);
      const l = gw.stats().concurrencyLimit;
      if (l !== seen[seen.length - 1]) seen.push(l);
    }
    expect(seen).toEqual([4, 8, 16, 32, 64]);
  });

  it("asks only as many as Little's law gives, halves on throttling, then grows one per window", async () => {
    const origin = new TimedOrigin();
    origin.firstByteMs = 20;
    origin.bytesPerSecond = 100e6; // parts 4 × 0.02 × 1e8 = 8 MB -> 8 MiB (a block)
    let t = 0;
    const gw = gateway(origin, 64, () => t);
    await reads(gw, 200);
    // One read: 20 ms + 8 MiB / 100 MB/s = 103.9 ms; 512 MiB/s × 0.1039 s / 8 MiB = 6.65 -> 7.
    expect(gw.stats()).toMatchObject({ partBytes: 8 * MiB, concurrencyCeiling: 7, concurrencyLimit: 7 });
    t = 5000;
    origin.throttle();
    expect(gw.stats().concurrencyLimit).toBe(3);
    await reads(gw, 3); // one window of 3 reads: +1 (no more doubling once throttled)
    expect(gw.stats().concurrencyLimit).toBe(4);
    await reads(gw, 4);
    expect(gw.stats().concurrencyLimit).toBe(5);
  });

  it("comes back down when the origin gets near, and never goes below --origin-concurrency", async () => {
    const origin = new TimedOrigin();
    const gw = gateway(origin, 64);
    await reads(gw, 300);
    expect(gw.stats().concurrencyLimit).toBe(64);
    origin.firstByteMs = 0.5; // a local, fast origin now
    origin.bytesPerSecond = 2e9;
    await reads(gw, 300);
    expect(gw.stats()).toMatchObject({ concurrencyCeiling: 4, concurrencyLimit: 4 });
  });

  it("does not ask for ever more reads from an origin that is simply full (its connections slow down under our own load)", async () => {
    // 200 MB/s in all, at most 100 MB/s per connection, 20 ms to first byte: with N reads in
    // flight each connection gets 200/N MB/s. Averages of what is measured under load would keep
    // asking for more reads (the per-connection figure falls as the limit grows).
    const origin = new TimedOrigin();
    origin.firstByteMs = 20;
    let inFlight = 0;
    const read = origin.read.bind(origin);
    origin.read = async (key, info, offset, dest) => {
      inFlight++;
      origin.bytesPerSecond = Math.min(100e6, 200e6 / inFlight);
      await read(key, info, offset, dest);
      await new Promise((r) => setImmediate(r));
      inFlight--;
    };
    const gw = gateway(origin, 64);
    const dest = new Uint8Array(MiB);
    let maxInFlight = 0;
    await Promise.all(Array.from({ length: 64 }, async () => {
      for (let i = 0; i < 40; i++) {
        await gw.read("k", INFO, 0, dest);
        maxInFlight = Math.max(maxInFlight, inFlight);
      }
    }));
    const s = gw.stats();
    // Little's law on the origin unloaded (20 ms + part ÷ 100 MB/s) stays well below the maximum.
    expect(s.concurrencyCeiling).toBeLessThan(64);
    expect(s.concurrencyLimit).toBeLessThanOrEqual(s.concurrencyCeiling);
    expect(s.concurrencyCeiling).toBe(Math.ceil((512 * MiB * (0.02 + s.partBytes! / 100e6)) / s.partBytes!));
  });

  it("keeps a fixed limit when the maximum is --origin-concurrency, and refuses a maximum below it", async () => {
    const origin = new TimedOrigin();
    const gw = gateway(origin, 4);
    await reads(gw, 100);
    expect(gw.stats()).toMatchObject({ concurrencyCeiling: 4, concurrencyLimit: 4 });
    expect(() => gateway(new TimedOrigin(), 3)).toThrow(/maxConcurrency must be an integer >= concurrency \(4\), received 3/);
  });
});
