import { existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ringLayout } from "../../src/shm/protocol.ts";
import { RingFile } from "../../src/shm/ring-file.ts";
import { RingPool, type RingPoolOptions } from "../../src/shm/ring-pool.ts";

let dir: string;
let clock: number;
let logged: string[];
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "rackfeed-ring-pool-"));
  clock = 0;
  logged = [];
});
afterEach(() => rmSync(dir, { recursive: true, force: true }));

function pool(opts: Partial<RingPoolOptions> = {}): RingPool {
  return new RingPool({
    dir,
    pid: 4242,
    instance: "test",
    budgetBytes: 2 ** 30,
    spareRings: 2,
    spareRingMs: 10_000,
    now: () => clock,
    log: (m) => logged.push(m),
    ...opts,
  });
}

const SMALL = ringLayout(4, 64 * 1024);
const LARGE = ringLayout(8, 64 * 1024);

/** A ring made the way a connection makes one: its bytes reserved, then its file written. */
async function newRing(p: RingPool, layout = SMALL): Promise<RingFile> {
  const path = p.reserve(layout.fileBytes);
  if (path === undefined) throw new Error("budget full");
  return await RingFile.create(path, layout, undefined);
}

/** Ends a ring's consumer as a connection does: retired at once, kept once its fill has stopped. */
function endConsumer(p: RingPool, ring: RingFile, reusable: boolean): void {
  p.retire(ring, reusable);
  p.keep(ring);
}

const files = () => readdirSync(dir).sort();

describe("RingPool", () => {
  it("gives an ended consumer's ring to the next consumer of the same layout, under a new ring name", async () => {
    const p = pool();
    const ring = await newRing(p);
    const firstName = ring.path;
    endConsumer(p, ring, true);
    expect(p.spareCount).toBe(1);
    expect(files()).toEqual([expect.stringMatching(/^rackfeed-ring-4242-test-\d+\.spare$/)]);
    expect(p.take(LARGE)).toBeUndefined(); // another slot count: not this one
    const again = p.take(SMALL);
    expect(again).toBe(ring);
    expect(again!.path).not.toBe(firstName);
    expect(files()).toEqual([expect.stringMatching(/\.ring$/)]);
    expect(p.bytes).toBe(SMALL.fileBytes); // its budget stayed reserved throughout
    again!.close();
  });

  it("removes the ring of a consumer that did not end cleanly, and gives its bytes back", async () => {
    const p = pool();
    const ring = await newRing(p);
    endConsumer(p, ring, false);
    expect(p.spareCount).toBe(0);
    expect(files()).toEqual([]);
    expect(p.bytes).toBe(0);
  });

  it("keeps no spare ring with spareRings 0", async () => {
    const p = pool({ spareRings: 0 });
    endConsumer(p, await newRing(p), true);
    expect(p.spareCount).toBe(0);
    expect(files()).toEqual([]);
    expect(p.bytes).toBe(0);
  });

  it("keeps at most spareRings rings, dropping the oldest first", async () => {
    const p = pool({ spareRings: 2 });
    const rings = [await newRing(p), await newRing(p), await newRing(p)];
    for (const r of rings) endConsumer(p, r, true);
    expect(p.spareCount).toBe(2);
    expect(files()).toHaveLength(2);
    expect(p.bytes).toBe(2 * SMALL.fileBytes);
    // The two kept are the newest: the first ring ended was dropped.
    expect(p.take(SMALL)).toBe(rings[1]);
    expect(p.take(SMALL)).toBe(rings[2]);
    for (const r of rings.slice(1)) r.close();
  });

  it("removes a spare ring unused for spareRingMs", async () => {
    const p = pool({ spareRingMs: 50 });
    endConsumer(p, await newRing(p), true);
    expect(p.spareCount).toBe(1);
    clock = 50; // the expiry timer reads this clock when it fires
    await new Promise((r) => setTimeout(r, 120));
    expect(p.spareCount).toBe(0);
    expect(files()).toEqual([]);
    expect(p.bytes).toBe(0);
  });

  it("drops spare rings to make room for a new ring, but only when that makes the room", async () => {
    const p = pool({ budgetBytes: 2 * SMALL.fileBytes });
    const a = await newRing(p);
    const b = await newRing(p);
    endConsumer(p, a, true);
    // b still runs and a is spare: a larger ring than the budget minus b does not fit even
    // without a, so a is not dropped for nothing.
    expect(p.reserve(SMALL.fileBytes + 4096)).toBeUndefined();
    expect(p.spareCount).toBe(1);
    // One of a's size fits once a goes.
    const path = p.reserve(SMALL.fileBytes);
    expect(path).toMatch(/\.ring$/);
    expect(p.spareCount).toBe(0);
    expect(existsSync(a.path)).toBe(false);
    expect(p.bytes).toBe(2 * SMALL.fileBytes);
    p.release(SMALL.fileBytes);
    b.close();
  });

  it("keeps nothing once closed: spares go, and a ring retired before keeps no name", async () => {
    const p = pool();
    endConsumer(p, await newRing(p), true);
    const stillFilling = await newRing(p);
    p.retire(stillFilling, true); // its fill still runs: renamed .spare, not yet kept
    expect(files()).toHaveLength(2);
    p.close();
    expect(files()).toEqual([]);
    expect(p.spareCount).toBe(0);
    p.keep(stillFilling); // its fill stopped after shutdown: removed, bytes given back
    expect(p.spareCount).toBe(0);
    expect(p.bytes).toBe(0);
    // A consumer ending after shutdown leaves nothing either.
    const late = await RingFile.create(join(dir, "late.ring"), SMALL, undefined);
    p.retire(late, true);
    expect(files()).toEqual([]);
    late.close();
  });
});
