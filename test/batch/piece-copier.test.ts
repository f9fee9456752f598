import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient } from "../../src/client/mod.ts";
import { connectUnix, localTransport } from "../../src/client/node.ts";
import type { Config } from "../../src/config/load.ts";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
import type { Origin } from "../../src/origin/origin.ts";
import type { RegisteredDataset } from "../../src/batch/dataset-catalog.ts";
import type { ServerEnv } from "../../src/server.ts";
import { encodeFrame, FrameDecoder, SHM_PROTOCOL_VERSION } from "../../src/shm/protocol.ts";
import { assembleSamples, copyResidentRuns, stepsPerCopy, takeResident } from "../../src/batch/assemble-batch.ts";
import { blockIndex, planSamples } from "../../src/batch/block-plans.ts";
import { type PieceCopier, SLICE_BYTES } from "../../src/batch/piece-copier.ts";
import { readSample } from "../../src/dataset/mod.ts";
import { type LimitedCall, loadKoffi, RESIDENT_ASYNC_CALLS } from "../../src/runtime/koffi-node.ts";
import { loadNodeMapping } from "../../src/runtime/libc-node.ts";
import { loadNodePieceCopier, NATIVE_LIBRARY } from "../../src/runtime/native-gather-node.ts";
import { expectSameBytes, makeWorkspace, patternBytes, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";
import { countingCopier } from "../helpers/counting-copier.ts";

// Windows of 1024 uint16 tokens (2 KiB): 1100 samples make a 2.2 MiB batch, copied in slices on threads.
const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 1023, seed: 3, split: "100,0,0", split_index: 0, num_samples: 3000 };
let ws: Workspace;
let rf: RunningServer;
let copier: PieceCopier;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 1000, 20, 400);
  rf = await startServer(ws, [...(await datasetFlags(ws, "d", REG)), "--block-bytes", "8KiB"]);
  copier = loadNodePieceCopier()!;
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

describe("native gather", () => {
  it("is built and loads here (scripts/build-native.mjs, run before npm test; CI installs gcc)", () => {
    expect(copier, `${NATIVE_LIBRARY} did not load`).toBeDefined();
    expect(copier.threads).toBeGreaterThanOrEqual(1);
  });

  it("copies pieces at the addresses of views into larger buffers, on this thread and on another", async () => {
    const big = patternBytes(1 << 16, 5);
    const view = big.subarray(1000, 5000); // a view: its address must include its offset
    const pieces = new Float64Array([copier.address(view) + 10, 100, 0, copier.address(big) + 60000, 50, 100]);
    const dst = new Uint8Array(150);
    expect(copier.copy(dst, pieces, 0, 2)).toBe(150);
    expect(dst.subarray(0, 100)).toEqual(big.subarray(1010, 1110));
    expect(dst.subarray(100)).toEqual(big.subarray(60000, 60050));
    const again = new Uint8Array(150);
    expect(await copier.copyOnThread(again, pieces, 1, 2)).toBe(50);
    expect(again.subarray(100)).toEqual(big.subarray(60000, 60050));
    expect(again.subarray(0, 100).every((b) => b === 0)).toBe(true); // piece 0 was not in [1, 2)
  });

  it("runs 16 copies on koffi at once, each in a resident pool, and the rest in turn, every byte in place", async () => {
    // Past koffi's resident pools (4 by default) each call mapped and unmapped 256 KiB on the event loop.
    expect(loadKoffi().config().resident_async_pools).toBe(RESIDENT_ASYNC_CALLS);
    const count = 3 * RESIDENT_ASYNC_CALLS;
    const src = patternBytes(count * 4096, 9);
    const pieces = new Float64Array(3 * count);
    for (let i = 0; i < count; i++) pieces.set([copier.address(src) + i * 4096, 4096, (count - 1 - i) * 4096], 3 * i);
    const dst = new Uint8Array(count * 4096);
    const copies = Array.from({ length: count }, (_, i) => copier.copyOnThread(dst, pieces, i, i + 1));
    const limited = copier.copyOnThread as LimitedCall<unknown[], number>;
    expect([limited.running, limited.waiting]).toEqual([RESIDENT_ASYNC_CALLS, count - RESIDENT_ASYNC_CALLS]);
    const copied = await Promise.all(copies);
    expect([limited.running, limited.waiting]).toEqual([0, 0]);
    expect(copied.reduce((a, b) => a + b, 0)).toBe(dst.length);
    for (let i = 0; i < count; i++) expectSameBytes(dst.subarray((count - 1 - i) * 4096, (count - i) * 4096), src.subarray(i * 4096, (i + 1) * 4096), `piece ${i}`);
  });

  it("assembles small and threaded batches byte for byte as the JavaScript copy, across block boundaries", async () => {
    const reg = await rf.server.datasets.get("d");
    const bin = new Uint8Array(await (await fetch(`${rf.url}/v1/objects/data/tok/d.bin`)).arrayBuffer());
    const w = reg.dataset.windowLength;
    for (const [first, count] of [[40, 3], [7, 1100]] as const) {
      const bytes = count * w * 2;
      const plan = planSamples(reg, first, count, rf.server.cache.blockBytes);
      expect(plan.segmentCount).toBeGreaterThan(count); // documents and 8 KiB blocks cut the windows
      const inScript = await assembleSamples(rf.server.cache, reg, first, count, 2 ** 30);
      // Four threads whatever this machine has, so that the batch is cut in four slices.
      const counting = countingCopier(copier);
      const native = await assembleSamples(rf.server.cache, reg, first, count, 2 ** 30, { copier: counting });
      expect(counting.calls.onThreads).toBe(bytes >= 4 * SLICE_BYTES ? 4 : 0);
      expect(Buffer.from(native.body).equals(Buffer.from(inScript.body)), `samples ${first}+${count}`).toBe(true);
      const want = new Uint16Array(w);
      const got = new Uint16Array(native.body.buffer, native.body.byteOffset, count * w);
      for (let i = 0; i < count; i += 97) {
        readSample(reg.dataset, [bin], first + i, want);
        expect(got.subarray(i * w, (i + 1) * w)).toEqual(want);
      }
    }
  });

  it("keeps at most 128 slices in flight: a burst of large batches beyond that is copied on the event loop", async () => {
    const reg = await rf.server.datasets.get("d");
    const held: (() => void)[] = [];
    let inFlight = 0;
    let most = 0;
    let onLoop = 0;
    const holding: PieceCopier = {
      ...copier,
      threads: 4,
      copy: (...a) => (onLoop++, copier.copy(...a)),
      // Slices finish only when released below, as if the threads were all busy.
      copyOnThread: (...a) => {
        most = Math.max(most, ++inFlight);
        return new Promise((resolve) => held.push(() => (inFlight--, resolve(copier.copy(...a)))));
      },
    };
    // 40 batches of 600 windows (1.2 MiB, four slices each): 160 slices asked for at once.
    const batches = Array.from({ length: 40 }, (_, i) => assembleSamples(rf.server.cache, reg, i * 50, 600, 2 ** 30, { copier: holding }));
    await new Promise((r) => setTimeout(r, 50));
    expect(most).toBe(128);
    expect(onLoop).toBe(8); // the 8 batches past the bound, one call each
    for (const release of held.splice(0)) release();
    const done = await Promise.all(batches);
    const want = (await assembleSamples(rf.server.cache, reg, 39 * 50, 600, 2 ** 30)).body;
    expect(Buffer.from(done[39].body).equals(Buffer.from(want))).toBe(true);
    // Once they have settled, large batches go to the threads again.
    const again = assembleSamples(rf.server.cache, reg, 0, 600, 2 ** 30, { copier: holding });
    await new Promise((r) => setTimeout(r, 10));
    expect(held.length).toBe(4);
    for (const release of held.splice(0)) release();
    await again;
  });

  it("assembles into a given buffer (a ring slot) and leaves the bytes past the batch alone", async () => {
    const reg = await rf.server.datasets.get("d");
    const w = reg.dataset.windowLength;
    const slot = new Uint8Array(8 * w * 2 + 64).fill(0xee);
    const batch = await assembleSamples(rf.server.cache, reg, 100, 8, 2 ** 30, { into: slot, copier });
    expect(batch.body.buffer).toBe(slot.buffer);
    const inScript = (await assembleSamples(rf.server.cache, reg, 100, 8, 2 ** 30)).body;
    expect(Buffer.from(slot.subarray(0, inScript.length)).equals(Buffer.from(inScript))).toBe(true);
    expect(slot.subarray(inScript.length).every((b) => b === 0xee)).toBe(true);
  });
});

/**
 * Runs `fn` against a server with a shared-memory path over its own synthetic dataset (8 KiB
 * blocks), its ring mapped (as `serve` maps it) unless `mapped` is false; removes it all after.
 */
async function withShmServer(
  o: { documents?: number; mapped?: boolean; args?: string[]; env: Partial<ServerEnv> },
  fn: (server: RunningServer, reg: RegisteredDataset, shmDir: string) => Promise<void>,
): Promise<void> {
  const shmWs = await makeWorkspace();
  try {
    await putSyntheticDataset(shmWs, "tok/d", o.documents ?? 1000, 20, 400);
    const map = loadNodeMapping()!;
    const shmDir = join(shmWs.dir, "shm");
    const server = await startServer(shmWs, [...(await datasetFlags(shmWs, "d", REG)), "--block-bytes", "8KiB", "--shm-dir", shmDir, ...(o.args ?? [])], {
      ...(o.mapped === false ? {} : { mapFile: (path: string, bytes: number) => map(path, bytes, true) }),
      ...o.env,
    });
    try {
      await fn(server, await server.server.datasets.get("d"), shmDir);
    } finally {
      await server.close();
    }
  } finally {
    await shmWs.remove();
  }
}

/** Reads steps `[startStep, endStep)` of `microBatch` samples over shm, each byte for byte as the JavaScript copy; returns how many came. */
async function readStepsOverShm(server: RunningServer, reg: RegisteredDataset, startStep: number, endStep: number, microBatch = 600): Promise<number> {
  const c = new RackfeedClient({ url: server.url, local: localTransport(), shm: true });
  let steps = 0;
  try {
    for await (const b of c.batches("d", { rank: 0, world: 1, microBatch, startStep, endStep })) {
      expect(b.transport).toBe("shm");
      const want = (await assembleSamples(server.server.cache, reg, b.step * microBatch, microBatch, 2 ** 30)).body;
      const got = new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength);
      expect(Buffer.from(got).equals(Buffer.from(want)), `step ${b.step}`).toBe(true);
      steps++;
    }
  } finally {
    await c.close(); // its report in flight, else the server's close waits for it
  }
  return steps;
}

/**
 * A consumer on a raw control connection (rank 0 of 1, from step 0): `hello` and `open` sent;
 * reads the server's messages one at a time.
 */
async function openRawConsumer(server: RunningServer, shmDir: string, microBatch: number, endStep: number) {
  const socket = await connectUnix(join(shmDir, `rackfeed-${new URL(server.url).port}.sock`));
  socket.write(encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION }));
  socket.write(encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch, startStep: 0, endStep }));
  const dec = new FrameDecoder();
  const pending: Record<string, unknown>[] = [];
  /** The next message; null once the server has closed the connection. */
  const next = async (): Promise<Record<string, unknown> | null> => {
    while (pending.length === 0) {
      const chunk = await socket.read();
      if (chunk === null) return null;
      pending.push(...dec.push(chunk));
    }
    return pending.shift()!;
  };
  /** The messages up to the first error frame (or the close). */
  const untilError = async (): Promise<Record<string, unknown>[]> => {
    const got: Record<string, unknown>[] = [];
    for (let m = await next(); m !== null; m = await next()) {
      got.push(m);
      if (m.t === "error") break;
    }
    return got;
  };
  return { socket, next, untilError };
}

describe("native gather into shared-memory rings", () => {
  it("fills mapped ring slots with threaded copies byte for byte as the JavaScript copy, a refused slice copied inline", async () => {
    // 600 windows of 2 KiB: 1.2 MiB batches, copied in four slices on the copier's threads,
    // straight into the mapped ring. Every third slice is refused, as koffi refuses calls past
    // its limit: that slice is copied on the event loop while the others run on threads.
    const threaded: PieceCopier = { ...copier, threads: 4 };
    let onThreads = 0;
    let refused = 0;
    let inFlight = 0;
    let most = 0;
    const counting: PieceCopier = {
      ...threaded,
      copyOnThread: (...a) => {
        if (++onThreads % 3 === 0) {
          refused++;
          return Promise.reject(new Error("Too many asynchronous calls are running"));
        }
        most = Math.max(most, ++inFlight);
        return threaded.copyOnThread(...a).finally(() => inFlight--);
      },
    };
    await withShmServer({ env: { copier: counting } }, async (server, reg) => {
      expect(await readStepsOverShm(server, reg, 0, 5)).toBe(5);
      expect(onThreads).toBe(4 * 5);
      expect(refused).toBe(6);
      // Two steps filled at once: the next step's slices went out while this one's were copied.
      expect(most).toBeGreaterThan(4);
    });
  });

  it("keeps a ring mapped until the copies in flight have finished when its client leaves mid-stream", async () => {
    // Slices that land late, each 15 ms after the one before: the next step's land after this
    // one's. A ring unmapped under them would crash this process (SIGSEGV).
    let calls = 0;
    let late = 0;
    const slow: PieceCopier = {
      ...copier,
      threads: 4,
      copyOnThread: (dst, pieces, first, end) =>
        new Promise((resolve) => setTimeout(() => (late++, resolve(copier.copy(dst, pieces, first, end))), 20 + 15 * calls++)),
    };
    await withShmServer({ env: { copier: slow } }, async (server, reg) => {
      const c = new RackfeedClient({ url: server.url, local: localTransport(), shm: true });
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 600, startStep: 0, endStep: 5 })) {
        expect(b.transport).toBe("shm");
        break; // leaves while the next steps are being copied
      }
      await waitFor(() => late === calls, "the slices in flight to land");
      expect(late).toBeGreaterThan(8); // slices of two steps after the first landed after it left
      // The server goes on: another consumer reads the same steps, byte for byte.
      expect(await readStepsOverShm(server, reg, 1, 4)).toBe(3);
    });
  });

  it("fills an unmapped ring (pwrite) one step at a time: its slots share one scratch buffer", async () => {
    const counting = countingCopier(copier);
    await withShmServer({ mapped: false, env: { copier: counting } }, async (server, reg) => {
      expect(await readStepsOverShm(server, reg, 0, 5)).toBe(5);
      expect(counting.calls.mostInFlight).toBe(4); // one step's slices at a time
    });
  });

  it("reports a step that failed at once, while the step filled alongside it still waits on its origin", async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    // Reads of step 0's own blocks fail; reads of step 1's own blocks wait for the gate.
    let failing = new Set<number>();
    let stalling = new Set<number>();
    let stalled = 0;
    const bb = 8192;
    const makeOrigin = (spec: Config["origins"][number]): Origin => {
      const fs = new FsOrigin({ name: spec.name, root: (spec as { root: string }).root });
      return new Proxy(fs, {
        get(target, prop, receiver) {
          const v = Reflect.get(target, prop, receiver);
          if (prop !== "read" || typeof v !== "function") return typeof v === "function" ? v.bind(target) : v;
          return async (key: string, info: unknown, offset: number, dest: Uint8Array, signal?: AbortSignal) => {
            if (key.endsWith(".bin")) {
              const blocks = Array.from({ length: Math.ceil(dest.length / bb) }, (_, i) => Math.floor(offset / bb) + i);
              if (blocks.some((b) => failing.has(b))) throw new Error("injected: step 0's block is unreadable");
              if (blocks.some((b) => stalling.has(b))) {
                stalled++;
                await gate;
              }
            }
            return (v as (...x: unknown[]) => Promise<void>).call(target, key, info, offset, dest, signal);
          };
        },
      });
    };
    try {
      // Large enough (~40 MB) that steps 0 and 1 have blocks of their own.
      const o = { documents: 100_000, args: ["--read-ahead-seconds", "0"], env: { copier: { ...copier, threads: 4 }, makeOrigin } };
      await withShmServer(o, async (server, reg, shmDir) => {
        try {
          const step0 = new Set(planSamples(reg, 0, 600, bb).blocks.map(blockIndex));
          const step1 = new Set(planSamples(reg, 600, 600, bb).blocks.map(blockIndex));
          failing = new Set([...step0].filter((b) => !step1.has(b)));
          stalling = new Set([...step1].filter((b) => !step0.has(b)));
          expect(failing.size).toBeGreaterThan(0);
          expect(stalling.size).toBeGreaterThan(0);
          const c = await openRawConsumer(server, shmDir, 600, 5);
          try {
            const got = await c.untilError();
            expect(got.map((m) => m.t)).toEqual(["welcome", "ring", "error"]);
            // Step 1, filled alongside, waits on the origin, and its gate is still shut: the error
            // did not wait for it (before, it came only once the other step was done).
            await waitFor(() => stalled > 0, "step 1's read to wait on the origin");
          } finally {
            c.socket.close();
          }
        } finally {
          release(); // before the server closes: its fill waits on the gate
        }
      });
    } finally {
      release();
    }
  });
});

describe("small batches copied a group of steps at a time", () => {
  // Windows of 1024 uint16 tokens, 8 to a batch: 16 KiB batches, 64 to a ring, 32 copied together.
  const MB = 8;

  it("takes a run's blocks only when all are in memory, counting the hits only then", async () => {
    await withShmServer({ env: {} }, async (server, reg) => {
      const cache = server.server.cache;
      const hits = () => cache.stats().memoryHits;
      const start = hits();
      expect(takeResident(cache, reg, 0, MB, 2 ** 30)).toBeUndefined(); // no block of the .bin read yet
      expect(hits()).toBe(start);
      await assembleSamples(cache, reg, 0, MB, 2 ** 30); // fills the blocks
      const before = hits();
      const run = takeResident(cache, reg, 0, MB, 2 ** 30)!;
      expect(run.got.length).toBe(planSamples(reg, 0, MB, cache.blockBytes).blocks.length);
      expect(hits() - before).toBe(run.got.length);
      expect(() => takeResident(cache, reg, 0, MB, 1000)).toThrow(/exceeds --max-batch-bytes/);
    });
  });

  it("copies runs into views of one buffer, each byte for byte as the JavaScript copy, the bytes between them left alone", async () => {
    const reg = await rf.server.datasets.get("d");
    const cache = rf.server.cache;
    const bytes = MB * reg.dataset.windowLength * 2;
    const runs = [];
    for (const first of [0, 80, 16]) {
      await assembleSamples(cache, reg, first, MB, 2 ** 30);
      runs.push(takeResident(cache, reg, first, MB, 2 ** 30)!);
    }
    const buffer = new Uint8Array(4 * bytes + 300).fill(0xee);
    const into = [buffer.subarray(100, 100 + bytes), buffer.subarray(3 * bytes + 300), buffer.subarray(bytes + 200, 2 * bytes + 200)];
    const counting = countingCopier(copier);
    const batches = await copyResidentRuns(counting, reg, runs, into);
    expect(counting.calls.onThreads).toBe(1); // three runs, one call on a thread
    for (let i = 0; i < runs.length; i++) {
      const want = (await assembleSamples(cache, reg, runs[i].first, MB, 2 ** 30)).body;
      expect(batches[i].body.buffer).toBe(buffer.buffer);
      expect(Buffer.from(batches[i].body).equals(Buffer.from(want)), `run ${i}`).toBe(true);
      expect(batches[i].fromMemory).toBe(runs[i].got.length);
    }
    for (const [from, to] of [[0, 100], [100 + bytes, bytes + 200], [2 * bytes + 200, 3 * bytes + 300]]) {
      expect(buffer.subarray(from, to).every((b) => b === 0xee), `bytes ${from}-${to}`).toBe(true);
    }
    await expect(copyResidentRuns(counting, reg, runs, [into[0], new Uint8Array(bytes), into[2]])).rejects.toThrow(/views of one buffer/);
    await expect(copyResidentRuns(counting, reg, runs, [into[0], buffer.subarray(0, 10), into[2]])).rejects.toThrow(/cannot hold a batch/);
  });

  it("groups steps only where a copy thread is to spare beside the event loop and a batch is not cut for the threads by itself", async () => {
    const reg = await rf.server.datasets.get("d");
    expect(stepsPerCopy({ ...copier, threads: 4 }, reg, MB, 32)).toBe(32); // 16 KiB batches: 1 MiB is 64, at most 32
    expect(stepsPerCopy({ ...copier, threads: 4 }, reg, MB, 8)).toBe(8);
    expect(stepsPerCopy({ ...copier, threads: 2 }, reg, MB, 32)).toBe(1); // 2 cores: the event loop, the client and a copy thread would share them
    expect(stepsPerCopy({ ...copier, threads: 4 }, reg, 600, 32)).toBe(1); // 1.2 MiB: cut in four by itself
    expect(stepsPerCopy(undefined, reg, MB, 32)).toBe(1);
  });

  it("fills a mapped ring a group of steps per copy on a thread, byte for byte as the JavaScript copy; steps with blocks to fetch alone", async () => {
    const counting = countingCopier(copier);
    const calls = counting.calls;
    await withShmServer({ env: { copier: counting } }, async (server, reg) => {
      const steps = Math.floor(reg.dataset.numSamples / MB);
      // A cold cache: the first steps fetch blocks and are filled one at a time; once the blocks
      // are in memory, 32 steps go in one call.
      expect(await readStepsOverShm(server, reg, 0, steps, MB)).toBe(steps);
      expect(calls.onThreads).toBeGreaterThan(0);
      expect(calls.onThreads + calls.onLoop).toBeLessThan(steps / 4);
      // A second consumer, every block in memory: whole groups (the ring's releases come 16 at a
      // time, so a group is 16 to 32 steps), and resumed at a step that is not a group's first.
      calls.onThreads = 0;
      calls.onLoop = 0;
      expect(await readStepsOverShm(server, reg, 5, steps, MB)).toBe(steps - 5);
      expect(calls.onLoop).toBeLessThanOrEqual(1);
      expect(calls.onThreads).toBeLessThanOrEqual(Math.ceil((steps - 5) / 16));
    });
  });

  it("takes its threads from --native-gather-threads: 4 groups small batches on a 2-thread copier, 1 keeps large ones on the event loop", async () => {
    for (const [threads, own, microBatch, steps] of [["4", 2, MB, 120], ["1", 4, 600, 4]] as const) {
      const counting = countingCopier(copier, own);
      await withShmServer({ args: ["--native-gather-threads", threads], env: { copier: counting } }, async (server, reg) => {
        expect(await readStepsOverShm(server, reg, 0, steps, microBatch)).toBe(steps);
        if (threads === "4") expect(counting.calls.onThreads).toBeGreaterThan(0);
        else expect(counting.calls.onThreads).toBe(0);
      });
    }
  });

  it.each([
    ["removed (--shm-spare-rings 0): unmapped", ["--shm-spare-rings", "0"]],
    ["kept for the next consumer: its slots reset", []],
  ])("keeps a ring as it is until every group's copy has landed when its client leaves mid-stream, then %s", async (_, args) => {
    // Group 1's copy lands 60 ms in, group 2's (started while group 1 copies) 250 ms in; the
    // client leaves 20 ms in. The fill loop sees the connection closed once group 1 lands: the
    // ring must stay mapped until group 2 has landed too. A copy into an unmapped ring would
    // crash this process, so the stand-in copier checks first and records it instead.
    const map = loadNodeMapping()!;
    let unmappedAt = -1;
    const events: string[] = [];
    let calls = 0;
    const slow: PieceCopier = {
      ...copier,
      threads: 4,
      copyOnThread: (dst, pieces, first, end) => {
        const k = calls++;
        return new Promise((resolve) =>
          setTimeout(() => {
            if (unmappedAt >= 0) {
              events.push(`group ${k + 1} after unmap`);
              return resolve(0);
            }
            events.push(`group ${k + 1} landed`);
            resolve(copier.copy(dst, pieces, first, end));
          }, k === 0 ? 60 : 250)
        );
      },
    };
    const mapFile = (path: string, bytes: number) => {
      const m = map(path, bytes, true);
      return { ...m, unmap: () => (unmappedAt = events.push("unmap"), m.unmap()) };
    };
    await withShmServer({ env: { copier: slow, mapFile }, args }, async (server, reg, shmDir) => {
      const steps = Math.floor(reg.dataset.numSamples / MB);
      for (let s = 0; s < steps; s++) await assembleSamples(server.server.cache, reg, s * MB, MB, 2 ** 30); // every block in memory
      const c = await openRawConsumer(server, shmDir, MB, steps);
      await new Promise((r) => setTimeout(r, 20));
      c.socket.close();
      if (args.length > 0) {
        await waitFor(() => unmappedAt >= 0, "the ring to be unmapped");
        await new Promise((r) => setTimeout(r, 300)); // any copy still to land has done so
        expect(events).toEqual(["group 1 landed", "group 2 landed", "unmap"]);
      } else {
        // Its slots are reset, and it may be given to another consumer, only once both have landed.
        await waitFor(async () => (await server.metric("rackfeed_shm_spare_rings")) === 1, "the ring to be kept");
        expect(events).toEqual(["group 1 landed", "group 2 landed"]);
      }
    });
  });

  it("never writes a slot the client still holds: a group stops at the first held slot", async () => {
    // A slow trainer: it holds every slot it was told of and gives them back one or two at a
    // time. Each slot's bytes must stay as they were when it was told of them until it releases
    // them, and be that step's batch.
    const map = loadNodeMapping()!;
    await withShmServer({ env: { copier: { ...copier, threads: 4 } } }, async (server, reg, shmDir) => {
      const cache = server.server.cache;
      const steps = 200;
      for (let s = 0; s < steps; s++) await assembleSamples(cache, reg, s * MB, MB, 2 ** 30); // every block in memory
      const c = await openRawConsumer(server, shmDir, MB, steps);
      const next = async () => {
        const m = await c.next();
        if (m === null) throw new Error("the server closed the connection");
        return m;
      };
      try {
        expect((await next()).t).toBe("welcome");
        const ring = await next();
        expect(ring.t).toBe("ring");
        const m = map(String(ring.path), Number(ring.fileBytes), false);
        const slotBytes = Number(ring.slotBytes);
        const at = (slot: number) => Number(ring.dataOffset) + slot * slotBytes;
        const held: { slot: number; generation: number; step: number; copy: Uint8Array }[] = [];
        let seen = 0;
        let turn = 0;
        try {
          while (seen < steps) {
            const n = await next();
            if (n.t === "end") break;
            expect(n.t).toBe("batch");
            expect(n.step).toBe(seen++);
            const slot = Number(n.slot);
            const copy = m.bytes.slice(at(slot), at(slot) + Number(n.length));
            const want = (await assembleSamples(cache, reg, Number(n.step) * MB, MB, 2 ** 30)).body;
            expect(Buffer.from(copy).equals(Buffer.from(want)), `step ${String(n.step)}`).toBe(true);
            held.push({ slot, generation: Number(n.generation), step: Number(n.step), copy });
            if (held.length < Number(ring.slots)) continue; // the ring is full: give back one or two
            for (const h of held.splice(0, 1 + (turn++ % 2))) {
              const now = m.bytes.subarray(at(h.slot), at(h.slot) + h.copy.length);
              expect(Buffer.from(now).equals(Buffer.from(h.copy)), `slot ${h.slot} (step ${h.step}) changed while held`).toBe(true);
              c.socket.write(encodeFrame({ t: "release", slot: h.slot, generation: h.generation }));
            }
          }
          expect(seen).toBe(steps);
          for (const h of held) {
            const now = m.bytes.subarray(at(h.slot), at(h.slot) + h.copy.length);
            expect(Buffer.from(now).equals(Buffer.from(h.copy)), `slot ${h.slot} (step ${h.step}) changed while held`).toBe(true);
          }
        } finally {
          m.unmap();
        }
      } finally {
        c.socket.close();
      }
    });
  });

  it("fails the consumer with an error frame when a group's copy fails, and fills the next consumer", async () => {
    let broken = true;
    const failing: PieceCopier = {
      ...copier,
      threads: 4,
      copy: (...a) => {
        if (broken) throw new Error("injected: the copy failed");
        return copier.copy(...a);
      },
      copyOnThread: (...a) => (broken ? Promise.reject(new Error("injected: no thread")) : copier.copyOnThread(...a)),
    };
    await withShmServer({ env: { copier: failing } }, async (server, reg, shmDir) => {
      const steps = Math.floor(reg.dataset.numSamples / MB);
      for (let s = 0; s < steps; s++) await assembleSamples(server.server.cache, reg, s * MB, MB, 2 ** 30); // every block in memory
      const c = await openRawConsumer(server, shmDir, MB, steps);
      try {
        const got = await c.untilError();
        expect(got.map((m) => m.t)).toEqual(["welcome", "ring", "error"]);
        expect(got[2]).toMatchObject({ code: "INTERNAL", status: 500 });
      } finally {
        c.socket.close();
      }
      broken = false;
      expect(await readStepsOverShm(server, reg, 0, 70, MB)).toBe(70);
    });
  });
});
