import { createServer, type Server } from "node:http";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient } from "../../src/client/mod.ts";
import { localTransport } from "../../src/client/node.ts";
import type { LocalTransport } from "../../src/client/shm-consumer.ts";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

describe("batches() and its signal", () => {
  let silent: Server | undefined;
  afterEach(async () => {
    if (!silent) return;
    silent.closeAllConnections();
    await new Promise((r) => silent!.close(r));
    silent = undefined;
  });

  it("ends at once, with the signal's reason, while its first request (the dataset's description) hangs", async () => {
    silent = createServer(() => {/* never answers */});
    await new Promise<void>((r) => silent!.listen(0, "127.0.0.1", r));
    const rf = new RackfeedClient({ url: `http://127.0.0.1:${(silent.address() as { port: number }).port}`, timeoutMs: 5000, retryForMs: 10_000 });
    const ac = new AbortController();
    const it = rf.batches("d", { rank: 0, world: 1, microBatch: 1, signal: ac.signal });
    const t0 = performance.now();
    setTimeout(() => ac.abort(new Error("trainer stopped")), 100);
    const err = await it.next().then(() => undefined, (e) => e as Error);
    expect(err?.message).toBe("trainer stopped");
    expect(performance.now() - t0).toBeLessThan(4000); // not the 5 s attempt timeout, nor its retries
  });

  describe("over shm", () => {
    const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 64, seed: 9, split: "100,0,0", split_index: 0, num_samples: 400 };
    let ws: Workspace;
    let rf: RunningServer;
    beforeAll(async () => {
      ws = await makeWorkspace();
      await putSyntheticDataset(ws, "tok/d", 3000, 20, 300);
      rf = await startServer(ws, [...(await datasetFlags(ws, "d", REG)), "--shm-dir", join(ws.dir, "shm")]);
    });
    afterAll(async () => {
      await rf.close();
      await ws.remove();
    });

    it("yields nothing after a signal that aborted while the shm socket was connecting", async () => {
      const ac = new AbortController();
      const real = localTransport();
      const slowConnect: LocalTransport = {
        ...real,
        pollSlots: real.pollSlots,
        nextTurn: real.nextTurn?.bind(real),
        openRing: real.openRing.bind(real),
        async connect(path) {
          // The stream's own connection (not transport()'s probe) is aborted while it connects.
          if (new Error().stack!.includes("shmBatches")) setTimeout(() => ac.abort(new Error("caller stopped")), 0);
          await new Promise((r) => setTimeout(r, 50));
          return await real.connect(path);
        },
      };
      const c = new RackfeedClient({ url: rf.url, local: slowConnect });
      const seen: number[] = [];
      const err = await (async () => {
        for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 4, startStep: 0, endStep: 20, signal: ac.signal })) seen.push(b.step);
      })().then(() => undefined, (e) => e as Error);
      expect(ac.signal.aborted).toBe(true);
      expect(err?.message).toBe("caller stopped");
      expect(seen).toEqual([]);
    });

    it("hands out no batch after its signal aborts, though more are in the ring (shm) or arrived (HTTP, prefetched)", async () => {
      for (const local of [localTransport(), undefined]) {
        const c = new RackfeedClient({ url: rf.url, local });
        const ac = new AbortController();
        const seen: number[] = [];
        const err = await (async () => {
          for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 4, endStep: 60, prefetch: 8, signal: ac.signal })) {
            seen.push(b.step);
            if (b.step === 3) {
              // Let the server fill the ring (or the prefetched answers arrive) before the abort.
              await new Promise((r) => setTimeout(r, 200));
              ac.abort(new Error("preempted"));
            }
          }
        })().then(() => undefined, (e) => e as Error);
        expect(err?.message, local ? "shm" : "http").toBe("preempted");
        expect(seen, local ? "shm" : "http").toEqual([0, 1, 2, 3]);
        await c.close();
      }
    });
  });
});
