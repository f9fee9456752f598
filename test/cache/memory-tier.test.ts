import { channel } from "node:diagnostics_channel";
import { describe, expect, it } from "vitest";
import { MemoryTier } from "../../src/cache/memory-tier.ts";

const MiB = 2 ** 20;
const block = () => new Uint8Array(MiB);

describe("MemoryTier", () => {
  it("refuses an unbounded or non-positive budget", () => {
    expect(() => new MemoryTier({ maxBytes: 0 })).toThrow(/maxBytes/);
    expect(() => new MemoryTier({ maxBytes: Infinity })).toThrow(/maxBytes/);
  });

  it("evicts least recently used blocks to stay within its byte budget", () => {
    const tier = new MemoryTier({ maxBytes: 3 * MiB });
    for (const k of ["a", "b", "c"]) tier.set(k, block());
    tier.get("a"); // a is now the most recent
    tier.set("d", block());
    expect(["a", "b", "c", "d"].filter((k) => tier.has(k))).toEqual(["a", "c", "d"]);
    expect(tier.stats()).toMatchObject({ bytes: 3 * MiB, blocks: 3, evictions: 1 });
  });

  it("with a schedule, evicts an unscheduled block first, then the one needed furthest in the future (Belady)", () => {
    const due: Record<string, number> = { a: 100, b: Infinity, c: 10, d: 50 };
    const tier = new MemoryTier({ maxBytes: 4 * MiB, nextUse: (k) => due[k] ?? Infinity });
    for (const k of ["a", "b", "c", "d"]) tier.set(k, block());
    due.e = 20;
    tier.set("e", block()); // b is unscheduled: it goes although a is older
    expect(["a", "b", "c", "d", "e"].filter((k) => tier.has(k))).toEqual(["a", "c", "d", "e"]);
    due.f = 5;
    tier.set("f", block()); // all scheduled: a (needed at 100) is furthest
    expect(["a", "c", "d", "e", "f"].filter((k) => tier.has(k))).toEqual(["c", "d", "e", "f"]);
    tier.set("g", block()); // g unscheduled itself, but the tier evicts d (50), the furthest
    expect(tier.has("d")).toBe(false);
    expect(tier.stats().bytes).toBeLessThanOrEqual(4 * MiB);
  });

  it("re-setting a held key replaces it without evicting anything else", () => {
    const tier = new MemoryTier({ maxBytes: 2 * MiB, nextUse: () => Infinity });
    tier.set("a", block());
    tier.set("b", block());
    tier.set("a", block());
    expect(tier.has("a") && tier.has("b")).toBe(true);
  });

  it("gives a diagnostics subscriber (lru-cache:metrics) its own record per lookup, and keeps none after it", () => {
    const tier = new MemoryTier({ maxBytes: 4 * MiB });
    tier.set("a", block());
    tier.set("b", block());
    const records: { op?: string; key?: string }[] = [];
    const listen = (m: unknown) => records.push(m as { op?: string; key?: string });
    const metrics = channel("lru-cache:metrics");
    metrics.subscribe(listen);
    try {
      expect(tier.get("a")).toBeDefined();
      expect(tier.get("b")).toBeDefined();
      expect(tier.has("a")).toBe(true);
    } finally {
      metrics.unsubscribe(listen);
    }
    // Each lookup's own record (a shared one would read "b", "b", "a" by now).
    expect(records.filter((r) => r.op === "get" || r.op === "has").map((r) => r.key)).toEqual(["a", "b", "a"]);
    expect(new Set(records).size).toBe(records.length);
  });
});
