import { describe, expect, it } from "vitest";
import { BatchBodyPool, type BodyPoolOptions } from "../../src/batch/body-pool.ts";
import { OverloadedError } from "../../src/errors.ts";

/** Timers the test fires by hand. */
function manualTimers() {
  const pending = new Set<() => void>();
  return {
    setTimer: (fn: () => void) => {
      pending.add(fn);
      return { clear: () => pending.delete(fn) };
    },
    fireAll: () => {
      for (const fn of [...pending]) {
        pending.delete(fn);
        fn();
      }
    },
    get count() {
      return pending.size;
    },
  };
}

const pool = (o: Partial<BodyPoolOptions> = {}) =>
  new BatchBodyPool({ poolBytes: 1 << 20, inflightBytes: 1 << 30, maxWaiting: 16, waitMs: 1000, ...o });
const settled = () => new Promise((r) => setTimeout(r, 0));

describe("BatchBodyPool: reuse", () => {
  it("hands a body whose lease ended reusable out again for the same size, and a new one for another size", async () => {
    const p = pool();
    const a = await p.lease(4096);
    expect(a.body.length).toBe(4096);
    a.end(true);
    expect(p.stats().bytes).toBe(4096);
    const again = await p.lease(4096);
    expect(again.body).toBe(a.body);
    const b = await p.lease(8192);
    expect(b.body).not.toBe(a.body);
    expect(p.stats()).toMatchObject({ reused: 1, allocated: 2, bytes: 0, inflightBytes: 4096 + 8192 });
  });

  it("never hands out one body twice while it is leased, and drops a body whose lease ended not reusable", async () => {
    const p = pool();
    const out = await Promise.all(Array.from({ length: 4 }, () => p.lease(1000)));
    for (const l of out.slice(0, 3)) l.end(true);
    out[3].end(false);
    const again = await Promise.all(Array.from({ length: 4 }, () => p.lease(1000)));
    expect(new Set(again.map((l) => l.body)).size).toBe(4);
    expect(again.map((l) => l.body)).not.toContain(out[3].body);
    out[0].end(true); // a second end is ignored: the body is leased again, it must not come back
    expect(p.stats().bytes).toBe(0);
  });

  it("keeps free bodies within its budget, dropping those of the size used least recently first", async () => {
    const p = pool({ poolBytes: 10_000 });
    const small = await Promise.all([p.lease(2000), p.lease(2000)]);
    const large = await Promise.all([p.lease(3000), p.lease(3000)]);
    for (const l of [...small, ...large]) l.end(true); // 4000 + 6000 = the whole budget
    expect(p.stats().bytes).toBe(10_000);
    (await p.lease(3000)).end(false); // 3000 used most recently...
    (await p.lease(2000)).end(true); // ...then 2000: 3000 is now the oldest size
    const extra = await p.lease(4000);
    extra.end(true);
    expect(p.stats().bytes).toBeLessThanOrEqual(10_000);
    expect((await p.lease(4000)).body).toBe(extra.body);
    const threes = [(await p.lease(3000)).body, (await p.lease(3000)).body];
    for (const b of threes) expect(large.map((l) => l.body)).not.toContain(b); // both 3000s went first
    expect(small.map((l) => l.body)).toContain((await p.lease(2000)).body);
    expect(small.map((l) => l.body)).toContain((await p.lease(2000)).body);
  });

  it("keeps no body over its budget, and none at all with a budget of 0", async () => {
    const p = pool({ poolBytes: 4096 });
    (await p.lease(8192)).end(true);
    expect(p.stats()).toMatchObject({ bytes: 0, dropped: 1 });
    const none = pool({ poolBytes: 0 });
    const l = await none.lease(100);
    l.end(true);
    expect((await none.lease(100)).body).not.toBe(l.body);
  });

  it("refuses bounds that are not non-negative integers, and an in-flight bound of 0", () => {
    expect(() => pool({ poolBytes: -1 })).toThrow(/Cannot create BatchBodyPool: poolBytes must be a non-negative integer: received -1/);
    expect(() => pool({ waitMs: 1.5 })).toThrow(RangeError);
    expect(() => pool({ inflightBytes: 0 })).toThrow(/inflightBytes must be at least 1/);
  });
});

describe("BatchBodyPool: bytes in flight", () => {
  it("makes a lease beyond the bound wait until enough leases end, in order of arrival", async () => {
    const p = pool({ inflightBytes: 10_000 });
    const a = await p.lease(6000);
    expect(p.mustWait(4000)).toBe(false);
    expect(p.mustWait(4001)).toBe(true);
    const order: string[] = [];
    const big = p.lease(8000).then((l) => (order.push("big"), l));
    expect(p.mustWait(1000)).toBe(true); // it would fit, but someone waits already
    const small = p.lease(1000).then((l) => (order.push("small"), l)); // would fit now, but arrives after big
    await settled();
    expect(order).toEqual([]);
    expect(p.stats()).toMatchObject({ inflightBytes: 6000, waiting: 2 });
    a.end(true);
    await settled();
    expect(order).toEqual(["big", "small"]);
    expect(p.stats()).toMatchObject({ inflightBytes: 9000, waiting: 0 });
    (await big).end(true);
    (await small).end(true);
    expect(p.stats().inflightBytes).toBe(0);
  });

  it("wakes as many waiters as fit at once, counting each before the next", async () => {
    const p = pool({ inflightBytes: 3000 });
    const first = await p.lease(3000);
    const waiting = [p.lease(1000), p.lease(1000), p.lease(1000), p.lease(1000)];
    first.end(false);
    await settled();
    expect(p.stats()).toMatchObject({ inflightBytes: 3000, waiting: 1 });
    (await waiting[0]).end(true);
    await settled();
    expect(p.stats()).toMatchObject({ inflightBytes: 3000, waiting: 0 });
    for (const l of await Promise.all(waiting.slice(1))) l.end(true);
    expect(p.stats().inflightBytes).toBe(0);
  });

  it("refuses with 503 OVERLOADED when too many wait, or after waiting too long", async () => {
    const timers = manualTimers();
    const p = pool({ inflightBytes: 1000, maxWaiting: 2, setTimer: timers.setTimer });
    const held = await p.lease(1000);
    const w1 = p.lease(500);
    const w2 = p.lease(500);
    const err = await p.lease(500).catch((e) => e);
    expect(err).toBeInstanceOf(OverloadedError);
    expect(err.message).toMatch(/--batch-inflight-bytes 1000.*2 batches already wait/);
    timers.fireAll(); // both waits time out
    for (const w of [w1, w2]) expect(await w.catch((e) => e)).toBeInstanceOf(OverloadedError);
    expect(p.stats()).toMatchObject({ waiting: 0, refused: 3, inflightBytes: 1000 });
    held.end(true);
    (await p.lease(1000)).end(true); // room again
    expect(timers.count).toBe(0);
  });

  it("counts an abandoned lease, takes its bytes back and keeps its unused body", async () => {
    const p = pool({ inflightBytes: 1000 });
    const l = await p.lease(1000);
    l.abandon();
    l.abandon(); // once only
    expect(p.stats()).toMatchObject({ abandoned: 1, inflightBytes: 0, bytes: 1000 });
    expect((await p.lease(1000)).body).toBe(l.body);
  });

  it("refuses a body larger than the in-flight bound outright", async () => {
    await expect(pool({ inflightBytes: 1000 }).lease(1001)).rejects.toThrow(/exceeds the in-flight bound of 1000/);
  });
});
