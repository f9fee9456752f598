import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { describe, expect, it } from "vitest";
import { limitInFlight } from "../../src/runtime/koffi-node.ts";
import { makeWorkspace } from "../helpers/rackfeed.ts";
import { NODE, NODE_TS, ROOT, runToExit } from "../helpers/spawn.ts";

/** A call that settles when told to, recording how many run at once and in which order they started. */
function gatedCalls() {
  let running = 0;
  let most = 0;
  const started: number[] = [];
  const open = new Map<number, { ok: (v: number) => void; fail: (e: Error) => void }>();
  const call = (id: number) =>
    new Promise<number>((ok, fail) => {
      running++;
      most = Math.max(most, running);
      started.push(id);
      open.set(id, {
        ok: (v) => (running--, ok(v)),
        fail: (e) => (running--, fail(e)),
      });
    });
  return { call, open, started, most: () => most };
}

const turn = () => new Promise((r) => setTimeout(r, 0));

describe("limitInFlight", () => {
  it("runs at most max calls at once and starts the waiting ones first come, first served", async () => {
    const g = gatedCalls();
    const limited = limitInFlight(g.call, 3);
    const results = Array.from({ length: 8 }, (_, i) => limited(i));
    await turn();
    expect(g.started).toEqual([0, 1, 2]);
    g.open.get(1)!.ok(10);
    await turn();
    expect(g.started).toEqual([0, 1, 2, 3]);
    for (let i = 0; i < 8; i++) {
      if (i === 1) continue;
      while (!g.open.has(i)) await turn(); // bounded by the test's timeout if a call never starts
      g.open.get(i)!.ok(i * 10);
    }
    expect(await Promise.all(results)).toEqual([0, 10, 20, 30, 40, 50, 60, 70]);
    expect(g.started).toEqual([0, 1, 2, 3, 4, 5, 6, 7]);
    expect(g.most()).toBe(3);
  });

  it("gives a failed call's place to the next and passes its error to its caller", async () => {
    const g = gatedCalls();
    const limited = limitInFlight(g.call, 1);
    const first = limited(0);
    const second = limited(1);
    await turn();
    expect(g.started).toEqual([0]);
    g.open.get(0)!.fail(new Error("refused"));
    await expect(first).rejects.toThrow("refused");
    await turn();
    expect(g.started).toEqual([0, 1]);
    g.open.get(1)!.ok(5);
    expect(await second).toBe(5);
  });

  it("treats a call that throws instead of rejecting as a failed call", async () => {
    let calls = 0;
    const limited = limitInFlight((fail: boolean) => {
      calls++;
      if (fail) throw new Error("thrown");
      return Promise.resolve(1);
    }, 1);
    await expect(limited(true)).rejects.toThrow("thrown");
    expect(await limited(false)).toBe(1);
    expect(calls).toBe(2);
  });

  it("refuses a limit that is not a positive integer", () => {
    for (const bad of [0, -1, 1.5, Number.NaN]) expect(() => limitInFlight(() => Promise.resolve(0), bad)).toThrow(/positive integer/);
  });
});

describe("loadKoffi", () => {
  it("still maps rings and copies batches where koffi was loaded before it and refuses the setting", async () => {
    // A user's code in the SDK's process may load koffi first: the setting is then refused.
    const ws = await makeWorkspace();
    try {
      const script = join(ws.dir, "koffi-first.mts");
      const root = pathToFileURL(ROOT).href;
      await writeFile(script, `
        import { createRequire } from "node:module";
        import { writeFileSync } from "node:fs";
        createRequire("${root}package.json")("koffi").load("libc.so.6");
        const { loadKoffi } = await import("${root}src/runtime/koffi-node.ts");
        const { loadNodeMapping } = await import("${root}src/runtime/libc-node.ts");
        const { loadNodePieceCopier } = await import("${root}src/runtime/native-gather-node.ts");
        const pools = loadKoffi().config().resident_async_pools;
        writeFileSync("${ws.dir}/ring", new Uint8Array(1 << 16));
        const ring = loadNodeMapping()("${ws.dir}/ring", 1 << 16, true).bytes;
        const copier = loadNodePieceCopier();
        const src = new Uint8Array(1 << 16).map((_, i) => (i * 7) & 255);
        const pieces = new Float64Array(3 * 16);
        for (let i = 0; i < 16; i++) pieces.set([copier.address(src) + i * 4096, 4096, (15 - i) * 4096], 3 * i);
        const copied = await Promise.all(Array.from({ length: 16 }, (_, i) => copier.copyOnThread(ring, pieces, i, i + 1)));
        let same = true;
        for (let i = 0; i < 16; i++) for (let b = 0; b < 4096; b++) same &&= ring[(15 - i) * 4096 + b] === src[i * 4096 + b];
        console.log(JSON.stringify({ pools, copied: copied.reduce((a, b) => a + b, 0), same }));
      `);
      const { code, out } = await runToExit(NODE, [...NODE_TS, script]);
      expect(code, out).toBe(0);
      expect(JSON.parse(out.trim().split("\n").pop()!)).toEqual({ pools: 4, copied: 1 << 16, same: true });
    } finally {
      await ws.remove();
    }
  });
});
