import { Worker } from "node:worker_threads";
import { describe, expect, it } from "vitest";
import { PLAN_EXCHANGE_BYTES, PLAN_QUEUE, PLAN_SLOT_NUMBERS, PLAN_SLOTS, PlanExchange } from "../../src/batch/plan-exchange.ts";
import { writerPlan } from "../helpers/plan-exchange-writer.ts";

const NODE_BOOT = new URL("../../src/runtime/worker-boot-node.mjs", import.meta.url);
const WRITER = new URL("../helpers/plan-exchange-writer.ts", import.meta.url);

const plan = (segments: number[], blocks: number[]) => ({ segments, segmentCount: segments.length / 4, blocks });
const exchange = () => new PlanExchange(new SharedArrayBuffer(PLAN_EXCHANGE_BYTES));

describe("PlanExchange", () => {
  it("hands requests to the planning end in order, and its plans back whole", () => {
    const ex = exchange();
    const other = new PlanExchange(ex.buffer); // the planning thread's end: the same memory
    expect(ex.request(3, 16, 8, 4096)).toBe(true);
    expect(ex.request(3, 24, 8, 4096)).toBe(true);
    const key = new Float64Array(4);
    expect(other.nextRequest(key)).toBe(true);
    expect([...key]).toEqual([3, 16, 8, 4096]);
    expect(other.publish(key, plan([0, 0, 10, 20, 0, 1, 0, 5], [7, 2 ** 32 + 9]))).toBe(true);
    expect(other.nextRequest(key)).toBe(true);
    expect([...key]).toEqual([3, 24, 8, 4096]);
    expect(other.nextRequest(key)).toBe(false);

    expect(ex.take(3, 16, 8, 4096)).toEqual(plan([0, 0, 10, 20, 0, 1, 0, 5], [7, 2 ** 32 + 9]));
    // Another version, run or block size finds nothing: the key is compared whole.
    expect(ex.take(4, 16, 8, 4096)).toBeUndefined();
    expect(ex.take(3, 16, 9, 4096)).toBeUndefined();
    expect(ex.take(3, 16, 8, 8192)).toBeUndefined();
    expect(ex.take(3, 24, 8, 4096)).toBeUndefined(); // asked, not made yet
  });

  it("drops requests beyond its queue rather than growing, and takes more once some are taken", () => {
    const ex = exchange();
    for (let i = 0; i < PLAN_QUEUE; i++) expect(ex.request(1, i, 1, 4096)).toBe(true);
    expect(ex.request(1, PLAN_QUEUE, 1, 4096)).toBe(false);
    const key = new Float64Array(4);
    expect(ex.nextRequest(key)).toBe(true);
    expect(key[1]).toBe(0);
    expect(ex.request(1, PLAN_QUEUE, 1, 4096)).toBe(true);
  });

  it("keeps counting across the 32-bit wrap of its queue's ends", () => {
    const ex = exchange();
    const ctrl = new Int32Array(ex.buffer, 0, 2);
    ctrl[0] = ctrl[1] = 2 ** 31 - 2; // head and tail just below the wrap
    const key = new Float64Array(4);
    for (let i = 0; i < 5; i++) expect(ex.request(1, i, 1, 4096)).toBe(true);
    for (let i = 0; i < 5; i++) {
      expect(ex.nextRequest(key)).toBe(true);
      expect(key[1]).toBe(i);
    }
    expect(ex.nextRequest(key)).toBe(false);
    expect(ctrl[0]).toBeLessThan(0); // wrapped
  });

  it("refuses a slot whose numbers do not add up to its checksum (a load reordered past the sequence check)", () => {
    const ex = exchange();
    expect(ex.publish(new Float64Array([2, 64, 8, 4096]), plan([0, 0, 123456789, 123456800], [5]))).toBe(true);
    expect(ex.take(2, 64, 8, 4096)).toEqual(plan([0, 0, 123456789, 123456800], [5]));
    // The slot table is the end of the buffer: find the plan's number there and change it, as a
    // reader whose load of it came from another plan would see it.
    const slots = new Float64Array(ex.buffer, PLAN_EXCHANGE_BYTES - 8 * PLAN_SLOTS * PLAN_SLOT_NUMBERS);
    const at = slots.indexOf(123456789);
    expect(at).toBeGreaterThan(0);
    slots[at] = 123456790;
    expect(ex.take(2, 64, 8, 4096)).toBeUndefined();
  });

  it("does not publish a plan larger than a slot (it is made on the event loop)", () => {
    const ex = exchange();
    const big = plan(new Array(PLAN_SLOT_NUMBERS).fill(1), [1]);
    expect(ex.publish(new Float64Array([1, 0, 8, 4096]), big)).toBe(false);
    expect(ex.take(1, 0, 8, 4096)).toBeUndefined();
  });

  it("wakes a waiting planning end when requests are flushed", async () => {
    const ex = exchange();
    let woken = false;
    const waiting = ex.waitForRequests().then(() => (woken = true));
    await new Promise((r) => setTimeout(r, 20));
    expect(woken).toBe(false);
    ex.request(1, 0, 8, 4096);
    ex.flush();
    await waiting;
    expect(woken).toBe(true);
    // With requests waiting, it resolves at once.
    await ex.waitForRequests();
  });

  it("never hands out a torn plan while another thread rewrites the slots", async () => {
    const ex = exchange();
    const stop = new SharedArrayBuffer(4);
    const keys = 64;
    const worker = new Worker(NODE_BOOT, { workerData: { entry: WRITER.href, buffer: ex.buffer, stop, keys } });
    const next = () =>
      new Promise<{ published?: number }>((resolve, reject) => {
        worker.once("message", resolve);
        worker.once("error", reject);
      });
    await next(); // ready: it publishes from now on
    const done = next();
    let whole = 0;
    let checked = 0;
    const until = performance.now() + 400;
    while (performance.now() < until && checked < 2_000_000) {
      for (let k = 0; k < keys; k++, checked++) {
        const got = ex.take(1, k * 8, 8, 4096);
        if (got === undefined) continue;
        // A whole plan is the writer's plan of one round: its first number names the round.
        const round = (got.segments[0] - k * 8 * 1000) / 7;
        expect(Number.isInteger(round) && round > 0).toBe(true);
        expect(got).toEqual(writerPlan(k * 8, round));
        whole++;
      }
    }
    Atomics.store(new Int32Array(stop), 0, 1);
    const published = (await done).published!;
    await worker.terminate();
    expect(published).toBeGreaterThan(keys);
    expect(whole).toBeGreaterThan(100);
  });
});
