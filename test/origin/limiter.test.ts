import { getEventListeners } from "node:events";
import { describe, expect, it } from "vitest";
import { OverloadedError } from "../../src/errors.ts";
import { ConcurrencyLimiter } from "../../src/origin/limiter.ts";

function gate() {
  let open!: () => void;
  const p = new Promise<void>((r) => (open = r));
  return { p, open };
}

describe("ConcurrencyLimiter", () => {
  it("drops a queued operation whose signal aborts: it never runs, and the next one gets the slot", async () => {
    const l = new ConcurrencyLimiter({ concurrency: 1, maxQueue: 4, what: "test" });
    const g = gate();
    const ran: string[] = [];
    const first = l.run(async () => {
      ran.push("first");
      await g.p;
    });
    const ctl = new AbortController();
    const dropped = l.run(() => Promise.resolve(void ran.push("dropped")), { signal: ctl.signal });
    const third = l.run(() => Promise.resolve(void ran.push("third")));
    expect(l.stats().queued).toBe(2);
    ctl.abort(new Error("not needed any more"));
    await expect(dropped).rejects.toThrow("not needed any more");
    expect(l.stats().queued).toBe(1);
    g.open();
    await Promise.all([first, third]);
    expect(ran).toEqual(["first", "third"]);
    expect(l.stats()).toMatchObject({ active: 0, queued: 0 });
    // Already aborted: refused before it takes a slot.
    await expect(l.run(() => Promise.resolve(void ran.push("late")), { signal: ctl.signal })).rejects.toThrow("not needed any more");
    expect(ran).toEqual(["first", "third"]);
  });

  it("never runs more than its concurrency and refuses beyond its queue", async () => {
    const l = new ConcurrencyLimiter({ concurrency: 2, maxQueue: 1, what: "test" });
    const g = gate();
    let running = 0;
    let peak = 0;
    const job = () => l.run(async () => {
      running++;
      peak = Math.max(peak, running);
      await g.p;
      running--;
    });
    const a = [job(), job(), job()];
    await expect(job()).rejects.toBeInstanceOf(OverloadedError);
    g.open();
    await Promise.all(a);
    expect(peak).toBe(2);
  });

  it("keeps a quarter of the slots for foreground work and lets foreground overtake queued background work", async () => {
    const l = new ConcurrencyLimiter({ concurrency: 4, maxQueue: 100, what: "test" });
    const g = gate();
    const order: string[] = [];
    const bg = Array.from({ length: 6 }, (_, i) => l.run(async () => {
      order.push(`bg${i}`);
      await g.p;
    }, { background: true }));
    await new Promise((r) => setTimeout(r, 0));
    expect(l.stats()).toMatchObject({ active: 3, queuedBackground: 3 }); // one slot kept free
    const fg = [l.run(() => Promise.resolve(void order.push("fg0"))), l.run(async () => {
      order.push("fg1");
      await g.p;
    })];
    await new Promise((r) => setTimeout(r, 0));
    expect(order).toContain("fg0"); // took the reserved slot at once
    g.open();
    await Promise.all([...bg, ...fg]);
    // fg1 waited behind the busy slots but still ran before the queued background jobs.
    expect(order.indexOf("fg1")).toBeLessThan(order.indexOf("bg3"));
  });

  it("never refuses foreground work for background waiters: at a full queue the newest background waiter gives way", async () => {
    const l = new ConcurrencyLimiter({ concurrency: 2, maxQueue: 3, what: "test" });
    const g = gate();
    const ran: string[] = [];
    const op = (name: string, background: boolean) => l.run(async () => {
      ran.push(name);
      await g.p;
    }, { background });
    const fgBusy = [op("fg-a", false), op("fg-b", false)]; // both slots
    const bg = [op("bg0", true), op("bg1", true), op("bg2", true)]; // the queue is full of background work
    bg.forEach((p) => p.catch(() => {}));
    await expect(op("bg3", true)).rejects.toBeInstanceOf(OverloadedError); // background at a full queue: refused
    const fg = op("fg-c", false); // foreground at a full queue: bg2 gives way
    await expect(bg[2]).rejects.toThrow(/a background read gave way to a foreground one/);
    expect(l.stats()).toMatchObject({ queued: 3, queuedBackground: 2 });
    // Foreground at a queue full of foreground work is refused as before.
    const fg2 = op("fg-d", false);
    const fg3 = op("fg-e", false);
    await expect(op("fg-f", false)).rejects.toBeInstanceOf(OverloadedError);
    await expect(bg[1]).rejects.toBeInstanceOf(OverloadedError);
    await expect(bg[0]).rejects.toBeInstanceOf(OverloadedError);
    g.open();
    await Promise.all([...fgBusy, fg, fg2, fg3]);
    expect(ran.sort()).toEqual(["fg-a", "fg-b", "fg-c", "fg-d", "fg-e"]);
  });
});

describe("ConcurrencyLimiter.setConcurrency", () => {
  it("lowers the limit for new work without cutting work in flight, and raises it to start waiters", async () => {
    const l = new ConcurrencyLimiter({ concurrency: 4, maxQueue: 100, what: "test" });
    const gates: (() => void)[] = [];
    const op = () => new Promise<void>((r) => gates.push(r));
    const runs = Array.from({ length: 8 }, () => l.run(op));
    await Promise.resolve();
    expect(l.stats()).toMatchObject({ active: 4, queued: 4 });
    l.setConcurrency(2);
    gates.splice(0, 3).forEach((g) => g()); // three finish: only one may start (2 - 1 still running)
    await new Promise((r) => setTimeout(r, 0));
    expect(l.stats().active).toBe(2);
    l.setConcurrency(6);
    await new Promise((r) => setTimeout(r, 0));
    expect(l.stats()).toMatchObject({ active: 5, queued: 0 });
    while (gates.length) gates.shift()!();
    await Promise.all(runs);
    expect(() => l.setConcurrency(0)).toThrow(/integer >= 1/);
  });
});

describe("ConcurrencyLimiter promotion", () => {
  it("moves a queued background operation to the foreground queue when its promote signal aborts: later foreground work no longer overtakes it", async () => {
    const l = new ConcurrencyLimiter({ concurrency: 1, maxQueue: 100, what: "test" });
    const g = gate();
    const order: string[] = [];
    const first = l.run(async () => {
      order.push("fg-running");
      await g.p;
    });
    const promote = new AbortController();
    const promoted = l.run(() => Promise.resolve(void order.push("bg-promoted")), { background: true, promote: promote.signal });
    const stays = l.run(() => Promise.resolve(void order.push("bg-not-promoted")), { background: true, promote: new AbortController().signal });
    const before = l.run(() => Promise.resolve(void order.push("fg-queued-before")));
    expect(l.stats()).toMatchObject({ queued: 3, queuedBackground: 2 });
    promote.abort();
    expect(l.stats()).toMatchObject({ queued: 3, queuedBackground: 1 });
    const after = l.run(() => Promise.resolve(void order.push("fg-queued-after")));
    g.open();
    await Promise.all([first, promoted, stays, before, after]);
    // Promoted: in foreground order, behind what queued before it and ahead of what came after.
    expect(order).toEqual(["fg-running", "fg-queued-before", "bg-promoted", "fg-queued-after", "bg-not-promoted"]);
  });

  it("lets a promoted operation take the slot kept for foreground work, whether promoted while queued or before it arrives", async () => {
    const l = new ConcurrencyLimiter({ concurrency: 4, maxQueue: 100, what: "test" });
    const ran: string[] = [];
    for (const when of ["while queued", "before arriving"]) {
      const g = gate();
      const bg = Array.from({ length: 3 }, () => l.run(() => g.p, { background: true }));
      const promote = new AbortController();
      if (when === "before arriving") promote.abort();
      const op = l.run(async () => {
        ran.push(when);
        await g.p;
      }, { background: true, promote: promote.signal });
      if (when === "while queued") {
        expect(l.stats()).toMatchObject({ active: 3, queuedBackground: 1 }); // the fourth slot is kept for foreground work
        promote.abort();
      }
      await new Promise((r) => setTimeout(r, 0));
      expect(l.stats(), when).toMatchObject({ active: 4, queued: 0 });
      expect(ran, when).toContain(when);
      g.open();
      await Promise.all([...bg, op]);
    }
  });
});

describe("ConcurrencyLimiter gate", () => {
  it("empties the queue when the gate aborts, and leaves no listener on a long-lived gate", async () => {
    const limiter = new ConcurrencyLimiter({ concurrency: 1, maxQueue: 1000, what: "test" });
    const gate = new AbortController();
    // Many operations queue and run one by one: every listener they put on the gate goes again.
    await Promise.all(Array.from({ length: 200 }, () => limiter.run(() => new Promise((r) => setTimeout(r, 0)), { gate: gate.signal })));
    expect(getEventListeners(gate.signal, "abort")).toHaveLength(0);
    // Then one runs and three wait: aborting the gate sends the three away with its reason.
    let release!: () => void;
    const running = limiter.run(() => new Promise<void>((r) => (release = r)), { gate: gate.signal });
    const waiting = [1, 2, 3].map(() => limiter.run(() => Promise.resolve("ran"), { gate: gate.signal }).catch((e) => (e as Error).message));
    gate.abort(new Error("origin down"));
    expect(await Promise.all(waiting)).toEqual(["origin down", "origin down", "origin down"]);
    release();
    await running;
    expect(limiter.stats()).toMatchObject({ active: 0, queued: 0 });
  });
});
