import { describe, expect, it } from "vitest";
import { PartSizer } from "../../src/origin/part-sizer.ts";

const MiB = 2 ** 20;

describe("PartSizer", () => {
  it("keeps the configured part until it has measured enough reads", () => {
    const s = new PartSizer({ minBytes: MiB, maxBytes: 8 * MiB, warmup: 4 });
    for (let i = 0; i < 3; i++) s.observe({ bytes: MiB, firstByteMs: 20, totalMs: 20 + MiB / 50_000 });
    expect(s.partBytes).toBe(MiB);
  });

  it("sizes parts to 4 × time to first byte × bandwidth, as a power of two", () => {
    const s = new PartSizer({ minBytes: 256 * 1024, maxBytes: 64 * MiB, warmup: 4 });
    // 20 ms to first byte, 50 MB/s per connection: 4 × 0.02 s × 50e6 B/s = 4e6 B -> 4 MiB.
    for (let i = 0; i < 10; i++) s.observe({ bytes: MiB, firstByteMs: 20, totalMs: 20 + MiB / 50_000 });
    expect(s.partBytes).toBe(4 * MiB);
    expect(s.stats().firstByteSeconds).toBeCloseTo(0.02, 5);
    expect(s.stats().bytesPerSecond).toBeCloseTo(50e6, -3);
  });

  it("never goes below the configured part or above a block, and ignores reads too small to measure", () => {
    const fast = new PartSizer({ minBytes: MiB, maxBytes: 8 * MiB, warmup: 2 });
    for (let i = 0; i < 5; i++) fast.observe({ bytes: MiB, firstByteMs: 0.2, totalMs: 1.2 }); // local disk
    expect(fast.partBytes).toBe(MiB);
    const far = new PartSizer({ minBytes: MiB, maxBytes: 8 * MiB, warmup: 2 });
    for (let i = 0; i < 5; i++) far.observe({ bytes: MiB, firstByteMs: 200, totalMs: 210 }); // 100 MB/s, 200 ms away
    expect(far.partBytes).toBe(8 * MiB);
    const tiny = new PartSizer({ minBytes: MiB, maxBytes: 8 * MiB, warmup: 1 });
    tiny.observe({ bytes: 1000, firstByteMs: 200, totalMs: 201 });
    expect(tiny.stats().samples).toBe(0);
  });

  it("refuses a minimum above the maximum", () => {
    expect(() => new PartSizer({ minBytes: 2 * MiB, maxBytes: MiB })).toThrow(/minBytes \(2097152\) <= maxBytes \(1048576\)/);
  });
});
