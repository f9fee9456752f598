import { describe, expect, it } from "vitest";
import { BatchBodyPool } from "../../src/batch/body-pool.ts";

describe("BatchBodyPool", () => {
  it("hands a given-back body out again for the same size, and a new one for another size", () => {
    const pool = new BatchBodyPool(1 << 20);
    const a = pool.take(4096);
    expect(a.length).toBe(4096);
    pool.give(a);
    expect(pool.stats().bytes).toBe(4096);
    expect(pool.take(4096)).toBe(a);
    const b = pool.take(8192);
    expect(b).not.toBe(a);
    expect(pool.stats()).toMatchObject({ reused: 1, allocated: 2, bytes: 0 });
  });

  it("never hands out one body twice while it is out", () => {
    const pool = new BatchBodyPool(1 << 20);
    const out = Array.from({ length: 4 }, () => pool.take(1000));
    for (const b of out) pool.give(b);
    const again = Array.from({ length: 4 }, () => pool.take(1000));
    expect(new Set(again).size).toBe(4);
    expect(new Set([...again, ...out]).size).toBe(4); // the same four bodies, each once
    expect(pool.take(1000)).not.toBeOneOf(again);
  });

  it("stays within its budget, dropping bodies of the size used least recently first", () => {
    const pool = new BatchBodyPool(10_000);
    const small = [pool.take(2000), pool.take(2000)];
    const large = [pool.take(3000), pool.take(3000)];
    for (const b of small) pool.give(b);
    for (const b of large) pool.give(b); // 4000 + 6000 = the whole budget
    expect(pool.stats().bytes).toBe(10_000);
    pool.take(3000); // 3000 is now the most recently used size
    pool.give(pool.take(2000)); // 2000 touched again: 3000 is now the oldest
    const extra = new Uint8Array(4000);
    pool.give(extra);
    const s = pool.stats();
    expect(s.bytes).toBeLessThanOrEqual(10_000);
    expect(pool.take(4000)).toBe(extra);
    // The 3000-byte body left went first; both 2000-byte ones stayed.
    expect(pool.take(3000)).not.toBe(large[0]);
    expect(pool.take(3000)).not.toBe(large[1]);
    expect(pool.take(2000)).toBeOneOf(small);
    expect(pool.take(2000)).toBeOneOf(small);
  });

  it("drops what it cannot keep: a body over the budget, a view into a larger buffer, any body with a budget of 0", () => {
    const pool = new BatchBodyPool(4096);
    pool.give(new Uint8Array(8192));
    pool.give(new Uint8Array(8192).subarray(0, 4096));
    expect(pool.stats()).toMatchObject({ bytes: 0, dropped: 2 });
    const none = new BatchBodyPool(0);
    none.give(none.take(100));
    expect(none.stats()).toMatchObject({ bytes: 0, dropped: 1, reused: 0 });
  });

  it("refuses a budget that is not a non-negative integer", () => {
    expect(() => new BatchBodyPool(-1)).toThrow(/non-negative integer of bytes, received -1/);
    expect(() => new BatchBodyPool(1.5)).toThrow(RangeError);
  });
});
