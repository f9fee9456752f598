/** The line of responses waiting for room under a byte bound (`RoomQueue`). */
import { describe, expect, it } from "vitest";
import { RoomQueue } from "../../src/http/room-queue.ts";

function line(max: number, opts: { maxWaiting?: number } = {}) {
  let used = 0;
  const timers: (() => void)[] = [];
  const q = new RoomQueue<number>({
    maxWaiting: opts.maxWaiting ?? 8,
    waitMs: 1000,
    setTimer: (fn) => {
      timers.push(fn);
      return { clear: () => void timers.splice(timers.indexOf(fn), 1) };
    },
    noun: "things",
    refuse: (why) => new Error(`full and ${why}`),
    fits: (n) => used + n <= max,
    take: (n) => void (used += n),
  });
  return { q, used: () => used, give: (n: number) => ((used -= n), q.wake()), timeOutFirst: () => timers.shift()?.() };
}

describe("RoomQueue", () => {
  it("lets waiters in from the head while they fit, each counted before the next is asked", async () => {
    const l = line(10);
    const order: number[] = [];
    const a = l.q.wait(6).then(() => order.push(6));
    const b = l.q.wait(4).then(() => order.push(4));
    const c = l.q.wait(3).then(() => order.push(3));
    l.q.wake();
    await Promise.all([a, b]);
    expect(order).toEqual([6, 4]);
    expect(l.used()).toBe(10);
    expect(l.q.length).toBe(1);
    l.give(6);
    await c;
    expect(order).toEqual([6, 4, 3]);
    expect(l.used()).toBe(7);
  });

  it("never lets a small waiter pass the head", async () => {
    const l = line(10);
    l.q.wake(); // nothing waits
    const big = l.q.wait(11);
    const small = l.q.wait(1);
    let smallIn = false;
    void small.then(() => (smallIn = true));
    l.q.wake();
    await Promise.resolve();
    expect(smallIn).toBe(false);
    expect(l.q.length).toBe(2);
    l.timeOutFirst(); // the head gives up: the next one goes
    await expect(big).rejects.toThrow(/full and waited 1000 ms/);
    await small;
    expect(l.q.refused).toBe(1);
  });

  it("refuses at once when the line is full, naming how many wait", async () => {
    const l = line(0, { maxWaiting: 1 });
    void l.q.wait(1).catch(() => {});
    await expect(l.q.wait(1)).rejects.toThrow(/full and 1 things already wait for it/);
    expect(l.q.refused).toBe(1);
    expect(() => line(0, { maxWaiting: -1 })).toThrow(/maxWaiting must be a non-negative integer: received -1/);
  });
});
