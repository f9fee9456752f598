/** The bound on cached blocks that object responses are sending (`HeldBlocks`). */
import { describe, expect, it } from "vitest";
import { OverloadedError } from "../../src/errors.ts";
import { HeldBlocks, ResponseBlockHold } from "../../src/http/held-blocks.ts";

/** A timer the test fires by hand. */
function manualTimers() {
  const pending: { fn: () => void; cleared: boolean }[] = [];
  return {
    setTimer(fn: () => void) {
      const t = { fn, cleared: false };
      pending.push(t);
      return { clear: () => void (t.cleared = true) };
    },
    fireAll() {
      for (const t of pending.splice(0)) if (!t.cleared) t.fn();
    },
  };
}

const block = (bytes: number) => new ArrayBuffer(bytes);

describe("HeldBlocks", () => {
  it("counts a block once however many responses hold it, until its last release", () => {
    const holds = new HeldBlocks({ maxBytes: 100, maxWaiting: 4, waitMs: 1000 });
    const a = block(60);
    expect(holds.hold(a)).toBeUndefined();
    expect(holds.hold(a)).toBeUndefined();
    expect(holds.hold(a)).toBeUndefined();
    expect(holds.stats()).toEqual({ bytes: 60, blocks: 1, waiting: 0, refused: 0 });
    holds.release(a);
    holds.release(a);
    expect(holds.stats().bytes).toBe(60);
    holds.release(a);
    expect(holds.stats()).toEqual({ bytes: 0, blocks: 0, waiting: 0, refused: 0 });
  });

  it("makes a block past the bound wait until another is released, in order of arrival", async () => {
    const holds = new HeldBlocks({ maxBytes: 100, maxWaiting: 4, waitMs: 60_000 });
    const a = block(60), b = block(60), c = block(30);
    holds.hold(a);
    const order: string[] = [];
    const wb = holds.hold(b)!.then(() => order.push("b"));
    // c alone would fit (60 + 30), but it does not pass b, which waits before it.
    const wc = holds.hold(c)!.then(() => order.push("c"));
    expect(holds.stats().waiting).toBe(2);
    await Promise.resolve();
    expect(order).toEqual([]);
    holds.release(a);
    await Promise.all([wb, wc]);
    expect(order).toEqual(["b", "c"]);
    expect(holds.stats()).toEqual({ bytes: 90, blocks: 2, waiting: 0, refused: 0 });
  });

  it("lets a response hold a block at once when another response holds it already", () => {
    const holds = new HeldBlocks({ maxBytes: 100, maxWaiting: 4, waitMs: 60_000 });
    const a = block(60), b = block(60);
    holds.hold(a);
    void holds.hold(b)!.catch(() => {});
    expect(holds.hold(a)).toBeUndefined(); // no new bytes: it does not queue behind b
    expect(holds.stats()).toEqual({ bytes: 60, blocks: 1, waiting: 1, refused: 0 });
  });

  it("wakes a waiter whose block another response took meanwhile without counting it twice", async () => {
    const holds = new HeldBlocks({ maxBytes: 100, maxWaiting: 4, waitMs: 60_000 });
    const a = block(60), b = block(50), c = block(60);
    holds.hold(a);
    const wc = holds.hold(c)!;
    const wb = holds.hold(b)!; // waits behind c
    holds.release(a); // c fits now; b (50) does not beside c (60)
    await wc;
    expect(holds.stats()).toEqual({ bytes: 60, blocks: 1, waiting: 1, refused: 0 });
    holds.release(c);
    await wb;
    expect(holds.stats()).toEqual({ bytes: 50, blocks: 1, waiting: 0, refused: 0 });
  });

  it("refuses with a 503 that names the flag once the wait times out", async () => {
    const timers = manualTimers();
    const holds = new HeldBlocks({ maxBytes: 100, maxWaiting: 4, waitMs: 30_000, setTimer: timers.setTimer });
    holds.hold(block(80));
    const w = holds.hold(block(80))!;
    timers.fireAll();
    const e = await w.then(() => undefined, (err: unknown) => err);
    expect(e).toBeInstanceOf(OverloadedError);
    expect((e as OverloadedError).code).toBe("OVERLOADED"); // 503 with Retry-After
    expect((e as OverloadedError).headers["retry-after"]).toBe("1");
    expect((e as Error).message).toMatch(/--object-inflight-bytes 100: 80 bytes in 1 blocks\) and waited 30000 ms; retry/);
    expect(holds.stats()).toEqual({ bytes: 80, blocks: 1, waiting: 0, refused: 1 });
  });

  it("refuses at once when the wait queue is full", async () => {
    const holds = new HeldBlocks({ maxBytes: 100, maxWaiting: 1, waitMs: 60_000 });
    holds.hold(block(80));
    void holds.hold(block(80))!.catch(() => {});
    const e = await holds.hold(block(80))!.then(() => undefined, (err: unknown) => err);
    expect(e).toBeInstanceOf(OverloadedError);
    expect((e as Error).message).toMatch(/1 responses already wait for it/);
    expect(holds.stats().refused).toBe(1);
  });

  it("holds a block larger than the bound alone (an NVMe block is its file, header included), and refuses a release of a block not held", async () => {
    const holds = new HeldBlocks({ maxBytes: 100, maxWaiting: 4, waitMs: 60_000 });
    const big = block(101), small = block(10);
    expect(holds.hold(big)).toBeUndefined(); // nothing else held
    const w = holds.hold(small)!; // waits: nothing fits beside it
    expect(holds.stats()).toEqual({ bytes: 101, blocks: 1, waiting: 1, refused: 0 });
    const w2 = holds.hold(block(101))!; // waits for the count to be 0 again
    holds.release(big);
    await w;
    expect(holds.stats()).toEqual({ bytes: 10, blocks: 1, waiting: 1, refused: 0 });
    holds.release(small);
    await w2;
    expect(holds.stats().bytes).toBe(101);
    expect(() => holds.release(block(10))).toThrow(/not held/);
    expect(() => new HeldBlocks({ maxBytes: 0, maxWaiting: 1, waitMs: 1 })).toThrow(/maxBytes must be a positive integer: received 0/);
    expect(() => new HeldBlocks({ maxBytes: 1.5, maxWaiting: 1, waitMs: 1 })).toThrow(/maxBytes must be a positive integer: received 1.5/);
    expect(() => new HeldBlocks({ maxBytes: 10, maxWaiting: -1, waitMs: 1 })).toThrow(/maxWaiting must be a non-negative integer: received -1/);
  });
});

describe("ResponseBlockHold", () => {
  it("holds one block at a time, giving the last back before it takes the next", () => {
    const holds = new HeldBlocks({ maxBytes: 100, maxWaiting: 4, waitMs: 60_000 });
    const r = new ResponseBlockHold(holds);
    const a = block(60), b = block(60);
    expect(r.take(a)).toBeUndefined();
    expect(r.take(a)).toBeUndefined(); // the same block again: still one hold
    expect(holds.stats()).toEqual({ bytes: 60, blocks: 1, waiting: 0, refused: 0 });
    expect(r.take(b)).toBeUndefined(); // fits only because a went back first
    expect(holds.stats()).toEqual({ bytes: 60, blocks: 1, waiting: 0, refused: 0 });
    r.end();
    r.end();
    expect(holds.stats().bytes).toBe(0);
    expect(r.take(a)).toBeUndefined(); // over: takes nothing
    expect(holds.stats().bytes).toBe(0);
  });

  it("gives back a block granted after the response ended while it waited", async () => {
    const holds = new HeldBlocks({ maxBytes: 100, maxWaiting: 4, waitMs: 60_000 });
    const other = block(80);
    holds.hold(other);
    const r = new ResponseBlockHold(holds);
    const w = r.take(block(80))!;
    r.end(); // its client left while it waited
    holds.release(other);
    await w;
    expect(holds.stats()).toEqual({ bytes: 0, blocks: 0, waiting: 0, refused: 0 });
  });
});
