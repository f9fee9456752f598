import { execFile, execFileSync, spawn } from "node:child_process";
import { unpack } from "msgpackr";
import { promisify } from "node:util";
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, renameSync, rmSync, statfsSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import * as net from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient, RackfeedError } from "../../src/client/mod.ts";
import { SHM_RECHECK_MS } from "../../src/client/client.ts";
import { connectUnix, localTransport } from "../../src/client/node.ts";
import { nodeFileLock } from "../../src/runtime/node.ts";
import type { Config } from "../../src/config/load.ts";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
import { loadNodeMapping, loadNodePeerCredentials } from "../../src/runtime/libc-node.ts";
import { loadNodePieceCopier } from "../../src/runtime/native-gather-node.ts";
import { withFd } from "../../src/runtime/socket-fd.ts";
import type { Origin } from "../../src/origin/origin.ts";
import {
  decodeRingHeader,
  decodeSlotHeader,
  encodeFrame,
  FrameDecoder,
  FrameOutbox,
  MAX_RING_SLOTS,
  RING_HEADER_BYTES,
  ringLayout,
  SHM_PROTOCOL_VERSION,
  slotHeaderOffset,
} from "../../src/shm/protocol.ts";
import { ShmStartupError } from "../../src/server.ts";
import { expectSameBytes, freePort, makeWorkspace, type RunningServer, startServer, waitFor, within, type Workspace } from "../helpers/rackfeed.ts";
import { DENO, NODE, NODE_TS, ROOT, startChild } from "../helpers/spawn.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";
import { countingCopier } from "../helpers/counting-copier.ts";
import { type GreetedControl, greetedControl } from "../helpers/shm-control.ts";

const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 64, seed: 9, split: "100,0,0", split_index: 0, num_samples: 5000 };
let ws: Workspace;
let rf: RunningServer;
let args: string[];
let shmDir: string;
/** The serve flags that register dataset `d`. */
let dataset: string[];

/** A filesystem origin (the one a spec names) whose every read first awaits `beforeRead()`. */
function originWithSlowReads(spec: Config["origins"][number], beforeRead: () => Promise<void>): Origin {
  const fs = new FsOrigin({ name: spec.name, root: (spec as { root: string }).root });
  return new Proxy(fs, {
    get(target, prop, receiver) {
      const v = Reflect.get(target, prop, receiver);
      if (prop !== "read" || typeof v !== "function") return typeof v === "function" ? v.bind(target) : v;
      return async (...a: unknown[]) => {
        await beforeRead();
        return (v as (...x: unknown[]) => unknown).apply(target, a);
      };
    },
  });
}

/** A filesystem origin whose reads take a random 0-3 ms: the producer's speed varies. */
const jitteryOrigin = (spec: Config["origins"][number]) => originWithSlowReads(spec, () => sleep(Math.random() * 3));

/** Runs `fn` with a fresh tmpfs of `size` mounted at `dir`, unmounted afterwards. */
async function withTmpfs(dir: string, size: string, fn: () => Promise<void>): Promise<void> {
  mkdirSync(dir);
  execFileSync("mount", ["-t", "tmpfs", "-o", `size=${size}`, "tmpfs", dir]);
  try {
    await fn();
  } finally {
    execFileSync("umount", [dir]);
  }
}

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 3000, 20, 300);
  dataset = await datasetFlags(ws, "d", REG);
  shmDir = join(ws.dir, "shm");
  // Small blocks and memory: batches keep missing the cache, so fills (and their jitter) happen throughout.
  args = [...dataset, "--block-bytes", "4KiB", "--memory-bytes", "1MiB", "--shm-dir", shmDir];
  rf = await startServer(ws, args, { makeOrigin: jitteryOrigin });
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

const rings = () => (existsSync(shmDir) ? readdirSync(shmDir).filter((n) => n.endsWith(".ring")) : []);
const spares = () => (existsSync(shmDir) ? readdirSync(shmDir).filter((n) => n.endsWith(".spare")) : []);

async function httpSamples(url: string, start: number, count: number): Promise<Uint8Array> {
  const res = await fetch(`${url}/v1/datasets/d/samples?start=${start}&count=${count}`);
  expect(res.status).toBe(200);
  return new Uint8Array(await res.arrayBuffer());
}

describe("shared-memory fast path", () => {
  it("tells co-located clients where its socket is, and the SDK picks shm by itself", async () => {
    const info = await (await fetch(`${rf.url}/v1/shm`)).json();
    expect(info.socket).toBe(join(shmDir, `rackfeed-${new URL(rf.url).port}.sock`));
    expect(info.protocol).toBe(SHM_PROTOCOL_VERSION);
    expect(await new RackfeedClient({ url: rf.url, local: localTransport() }).transport()).toBe("shm");
    expect(await new RackfeedClient({ url: rf.url }).transport()).toBe("http");
    expect(await new RackfeedClient({ url: rf.url, local: localTransport(), shm: false }).transport()).toBe("http");
  });

  it.each([
    ["mapped client polling slot headers (notify wait), pwrite server", { poll: true, map: true, mappedServer: false }],
    ["pread client told of every batch (notify all), pwrite server", { poll: false, map: false, mappedServer: false }],
    ["mapped client polling, mapped server (koffi)", { poll: true, map: true, mappedServer: true }],
    ["mapped client polling, mapped server copying groups of steps on a thread", { poll: true, map: true, mappedServer: true, groups: true }],
  ])("delivers thousands of batches under randomized producer and consumer speeds, each byte-identical to its HTTP body: %s", async (_, mode: { poll: boolean; map: boolean; mappedServer: boolean; groups?: boolean }) => {
    const mapFile = loadNodeMapping();
    expect(mapFile, "koffi maps files on this machine").toBeDefined();
    const dir = mode.mappedServer ? join(ws.dir, "shm-mapped") : shmDir;
    // Four threads whatever this machine has: steps whose blocks are all in memory are copied in groups.
    const grouping = countingCopier(loadNodePieceCopier()!);
    const server = mode.mappedServer
      ? await startServer(ws, [...args.filter((a) => a !== shmDir), dir], {
        makeOrigin: jitteryOrigin,
        mapFile: (path, bytes) => mapFile!(path, bytes, true),
        ...(mode.groups ? { copier: grouping } : {}),
      })
      : rf;
    const ringsIn = () => readdirSync(dir).filter((n) => n.endsWith(".ring"));
    try {
      const steps = 2500;
      const want = await httpSamples(server.url, 0, steps); // world 1, micro-batch 1: step s is sample s
      const sampleBytes = want.length / steps;
      const c = new RackfeedClient({ url: server.url, local: { ...localTransport({ map: mode.map }), pollSlots: mode.poll } });
      const before = await server.metric("rackfeed_served_bytes_total", { transport: "shm" });
      let expectStep = 0;
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 1, endStep: steps, prefetch: 1 + Math.floor(Math.random() * 3) })) {
        expect(b.transport).toBe("shm");
        expect(b.step).toBe(expectStep++);
        expect(b.shape).toEqual([1, 65]);
        expectSameBytes(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength), want.subarray(b.step * sampleBytes, (b.step + 1) * sampleBytes), `step ${b.step}`);
        if (Math.random() < 0.05) await sleep(Math.random() * 4); // a consumer that sometimes stalls
      }
      expect(expectStep).toBe(steps);
      if (mode.groups) expect(grouping.calls.onThreads).toBeGreaterThan(0);
      expect(await server.metric("rackfeed_served_bytes_total", { transport: "shm" })).toBe(before + want.length);
      await waitFor(async () => ringsIn().length === 0 && (await server.metric("rackfeed_shm_rings")) === 0, "the ring to be removed after the iteration");
    } finally {
      if (server !== rf) await server.close();
    }
  });

  it("resumes from any step, and serves ranks of a world without overlap", async () => {
    const c = new RackfeedClient({ url: rf.url, local: localTransport() });
    for (const rank of [0, 3]) {
      const seen: number[] = [];
      for await (const b of c.batches("d", { rank, world: 4, microBatch: 2, startStep: 100, endStep: 110 })) {
        seen.push(b.step);
        expect(b.firstSample).toBe((b.step * 4 + rank) * 2);
        expectSameBytes(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength), await httpSamples(rf.url, b.firstSample, 2), `rank ${rank} step ${b.step}`);
      }
      expect(seen).toEqual([100, 101, 102, 103, 104, 105, 106, 107, 108, 109]);
    }
  });

  it("reads batches by socket path alone (no URL), the same bytes as HTTP, reporting its timings on the socket", async () => {
    const { socket } = (await (await fetch(`${rf.url}/v1/shm`)).json()) as { socket: string };
    const waits = () => rf.metric("rackfeed_t_wait_seconds_count", { dataset: "d" });
    const before = await waits();
    const c = new RackfeedClient({ socket, local: localTransport() });
    const seen: number[] = [];
    for await (const b of c.batches("d", { rank: 1, world: 2, microBatch: 3, startStep: 7, endStep: 107 })) {
      seen.push(b.step);
      expect(b.transport).toBe("shm");
      expectSameBytes(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength), await httpSamples(rf.url, b.firstSample, 3), `step ${b.step}`);
      c.reportStep(b.step, { t_h2d: 0.001, t_compute: 0.01 });
    }
    expect(seen).toEqual(Array.from({ length: 100 }, (_, i) => 7 + i));
    await c.close();
    // Every step's timings went on the consumer's socket (there is no /v1/telemetry without a URL).
    expect(await waits()).toBe(before + 100);
    expect(c.queuedSteps).toBe(0);
    // Once its socket has closed a socket-only client keeps nothing: timings given now are not queued.
    c.reportStep(106, { t_compute: 0.5 }, { dataset: "d", rank: 1, world: 2, microBatch: 3 });
    expect(c.queuedSteps).toBe(0);
  });

  it("gives a slow consumer backpressure: the server fills no more slots than the ring holds, and drops nothing", async () => {
    const c = new RackfeedClient({ url: rf.url, local: localTransport() });
    const before = await rf.metric("rackfeed_served_bytes_total", { transport: "shm" });
    const it = c.batches("d", { rank: 0, world: 1, microBatch: 4, endStep: 200, prefetch: 2 });
    const first = await it.next();
    const batchBytes = first.value!.tokens.byteLength;
    // The server may make the ring of these small batches deeper than asked: read its size.
    expect(rings().length).toBe(1);
    const { slots } = decodeRingHeader(readFileSync(join(shmDir, rings()[0])).subarray(0, RING_HEADER_BYTES));
    expect(slots).toBeGreaterThanOrEqual(3);
    expect(slots).toBeLessThan(200);
    // The consumer holds step 0: the server fills the other slots (however long a loaded
    // machine takes), then must wait; nothing more is written while the consumer holds on.
    const full = before + slots * batchBytes;
    const served = () => rf.metric("rackfeed_served_bytes_total", { transport: "shm" });
    await waitFor(async () => (await served()) >= full, "the server to fill every slot of the ring");
    await sleep(300);
    expect(await served()).toBe(full);
    let n = 1;
    for await (const b of { [Symbol.asyncIterator]: () => it }) expect(b.step).toBe(n++);
    expect(n).toBe(200);
  });

  it("frees the ring of a client killed with -9 mid-stream", async () => {
    const script = join(ws.dir, "consumer.mts"); // .mts: an ES module (top-level await) outside any package.json
    writeFileSync(script, `
      import { RackfeedClient } from ${JSON.stringify(join(ROOT, "src/client/mod.ts"))};
      import { localTransport } from ${JSON.stringify(join(ROOT, "src/client/node.ts"))};
      const c = new RackfeedClient({ url: ${JSON.stringify(rf.url)}, local: localTransport() });
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 1, prefetch: 3 })) {
        if (b.step === 5) console.log("holding step 5 over " + b.transport);
        if (b.step >= 5) await new Promise((r) => setTimeout(r, 1000));
      }
    `);
    const child = spawn(NODE, [...NODE_TS, script], { cwd: ROOT, stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d) => (out += d));
    child.stderr.on("data", (d) => (out += d));
    await waitFor(() => out.includes("holding step 5"), "the child to hold a batch", 20_000).catch((e) => {
      throw new Error(`${e.message}; the child printed: ${out}`);
    });
    expect(out).toContain("over shm");
    expect(rings().length).toBe(1);
    expect(await rf.metric("rackfeed_shm_rings")).toBe(1);
    child.kill("SIGKILL");
    // It died holding batches (step 5, and those filled ahead): its ring is removed, not kept
    // for another consumer.
    await waitFor(
      async () => rings().length === 0 && (await rf.metric("rackfeed_shm_rings")) === 0 && (await rf.metric("rackfeed_shm_ring_bytes")) === 0,
      "the killed client's ring to be removed and its bytes given back",
    );
    expect(spares()).toEqual([]);
  });

  it("keeps an ended consumer's ring for the next consumer of the same size, every slot unpublished, and removes it when unused", async () => {
    const dir = join(ws.dir, "shm-spares");
    const ringsIn = (kind: string) => (existsSync(dir) ? readdirSync(dir).filter((n) => n.endsWith(kind)) : []);
    let slow = false;
    const server = await startServer(ws, [...args.filter((a) => a !== shmDir), dir, "--cache-dir", join(ws.dir, "c-spares")], {
      shmSpareRingMs: 1500,
      makeOrigin: (spec) => originWithSlowReads(spec, () => (slow ? sleep(400) : Promise.resolve())),
    });
    const socket = join(dir, `rackfeed-${new URL(server.url).port}.sock`);
    try {
      // A first consumer reads 3 steps: slots 0-2 hold generations 1-3 (steps 0-2).
      const c = new RackfeedClient({ url: server.url, local: localTransport() });
      let n = 0;
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 1, endStep: 3 })) {
        expect(b.transport).toBe("shm");
        n++;
      }
      expect(n).toBe(3);
      await c.close();
      await waitFor(() => ringsIn(".spare").length === 1 && ringsIn(".ring").length === 0, "the ring kept as a spare");
      const inode = statSync(join(dir, ringsIn(".spare")[0])).ino;
      // The next consumer starts at step 4000, whose blocks come from an origin that now takes
      // 400 ms a read: its slots 0-2 (generations 1-3 again) are not filled for a while, and a
      // header left from the first consumer would be taken for one of them.
      slow = true;
      const { s, next } = await greetedControl(socket);
      try {
        s.write(encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 1, startStep: 4000, endStep: 4003, notify: "wait" }));
        const ring = await next();
        expect(ring.t).toBe("ring");
        expect(ringsIn(".spare")).toEqual([]);
        expect(statSync(String(ring.path)).ino).toBe(inode); // the same pages, under a new ring name
        const file = readFileSync(String(ring.path));
        const view = new DataView(file.buffer, file.byteOffset, file.byteLength);
        for (let i = 0; i < 3; i++) expect(decodeSlotHeader(view, slotHeaderOffset(i)).generation, `slot ${i}`).toBe(0);
        slow = false;
        // Its batches, once filled, are its own.
        const want = await httpSamples(server.url, 4000, 3);
        const per = want.length / 3;
        for (const step of [4000, 4001, 4002]) {
          s.write(encodeFrame({ t: "wait", step }));
          let notice = await next();
          while (notice.t === "end") notice = await next(); // told once its last step is filled
          expect(notice).toMatchObject({ t: "batch", step });
          const bytes = readFileSync(String(ring.path)).subarray(Number(ring.dataOffset) + Number(notice.slot) * Number(ring.slotBytes));
          expect(new Uint8Array(bytes.subarray(0, per))).toEqual(want.subarray((step - 4000) * per, (step - 3999) * per));
          s.write(encodeFrame({ t: "release", slot: notice.slot as number, generation: notice.generation as number }));
        }
      } finally {
        s.close();
      }
      await waitFor(async () => ringsIn(".spare").length === 1 && (await server.metric("rackfeed_shm_spare_rings")) === 1, "kept again");
      expect(await server.metric("rackfeed_shm_ring_bytes")).toBeGreaterThan(0);
      // Unused for its time: removed, its bytes given back.
      await waitFor(async () => ringsIn(".spare").length === 0 && (await server.metric("rackfeed_shm_ring_bytes")) === 0, "the spare removed", 10_000);
      // And a spare left at shutdown is removed with the rest.
      for await (const _ of c.batches("d", { rank: 0, world: 1, microBatch: 1, endStep: 2 })) { /* read */ }
      await c.close();
      await waitFor(() => ringsIn(".spare").length === 1, "kept once more");
    } finally {
      await server.close();
    }
    expect(ringsIn(".spare")).toEqual([]);
    expect(ringsIn(".ring")).toEqual([]);
  });

  it("keeps the ring of an SDK consumer that stops early (a break) for the next consumer, whose batches are its own", async () => {
    const dir = join(ws.dir, "shm-break-spare");
    const ringsIn = (kind: string) => (existsSync(dir) ? readdirSync(dir).filter((n) => n.endsWith(kind)) : []);
    const server = await startServer(ws, [...dataset, "--shm-dir", dir, "--cache-dir", join(ws.dir, "c-break-spare")]);
    try {
      const want = await httpSamples(server.url, 0, 200);
      const per = want.length / 200;
      const c = new RackfeedClient({ url: server.url, local: localTransport() });
      // Steps 0-4 of 100: the server has filled the slots after them when the loop leaves.
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 1, endStep: 100 })) {
        expect(b.transport).toBe("shm");
        if (b.step === 4) break;
      }
      await waitFor(async () => ringsIn(".spare").length === 1 && (await server.metric("rackfeed_shm_spare_rings")) === 1, "the ring kept as a spare");
      const inode = statSync(join(dir, ringsIn(".spare")[0])).ino;
      // The next consumer gets it, and reads its own steps (none of the first one's).
      let n = 0;
      let path = "";
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 1, startStep: 120, endStep: 160 })) {
        if (n++ === 0) {
          path = join(dir, ringsIn(".ring")[0]);
          expect(statSync(path).ino).toBe(inode);
        }
        expectSameBytes(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength), want.subarray(b.step * per, (b.step + 1) * per), `step ${b.step}`);
      }
      expect(n).toBe(40);
      expect(path).not.toBe("");
      await c.close();
    } finally {
      await server.close();
    }
  });

  it("never gives another consumer a ring its client may still read: cut off by the server, or closed holding a batch", async () => {
    const dir = join(ws.dir, "shm-unsafe-reuse");
    const server = await startServer(ws, [...dataset, "--shm-dir", dir]);
    const socket = join(dir, `rackfeed-${new URL(server.url).port}.sock`);
    const open = { t: "open", dataset: "d", world: 2, microBatch: 1, startStep: 0, endStep: 200, notify: "wait" } as const;
    try {
      // Cut off by the server (a bad release here; a failed fill does the same) while it holds step 0.
      const a = await greetedControl(socket);
      a.s.write(encodeFrame({ ...open, rank: 0 }));
      expect((await a.next()).t).toBe("ring");
      a.s.write(encodeFrame({ t: "wait", step: 0 }));
      expect(await a.next()).toMatchObject({ t: "batch", step: 0 });
      a.s.write(encodeFrame({ t: "release", slot: 7, generation: 99 }));
      let m = await a.next();
      while (m.t === "end") m = await a.next();
      expect(m).toMatchObject({ t: "error", status: 400 });
      // Closed by its client while it holds step 0 (an abort in the middle of a step).
      const b = await greetedControl(socket);
      b.s.write(encodeFrame({ ...open, rank: 1 }));
      expect((await b.next()).t).toBe("ring");
      b.s.write(encodeFrame({ t: "wait", step: 0 }));
      expect(await b.next()).toMatchObject({ t: "batch", step: 0 });
      b.s.close();
      a.s.close();
      await waitFor(async () => (await server.metric("rackfeed_shm_rings")) === 0, "both connections ended");
      await sleep(200); // their fills stopped
      // Neither ring is kept: both are removed, their bytes given back.
      expect(await server.metric("rackfeed_shm_spare_rings")).toBe(0);
      expect(await server.metric("rackfeed_shm_ring_bytes")).toBe(0);
      expect(readdirSync(dir).filter((n) => n.endsWith(".spare"))).toEqual([]);
    } finally {
      await server.close();
    }
  });

  it("keeps the batch an SDK caller holds when it aborts, while another consumer of the same ring size starts", async () => {
    const dir = join(ws.dir, "shm-abort-held");
    const server = await startServer(ws, [...dataset, "--shm-dir", dir], { mapFile: (path, bytes) => loadNodeMapping()!(path, bytes, true) });
    try {
      const want = await httpSamples(server.url, 0, 200);
      const per = want.length / 200;
      const a = new RackfeedClient({ url: server.url, local: localTransport({ map: true }) });
      const ac = new AbortController();
      for await (const b of a.batches("d", { rank: 0, world: 1, microBatch: 1, endStep: 100, signal: ac.signal })) {
        const view = new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength);
        ac.abort(new Error("stop after this step"));
        await waitFor(async () => (await server.metric("rackfeed_shm_rings")) === 0, "its connection closed");
        // Another consumer starts (another rank, a validation loop) and is filled meanwhile.
        const other = new RackfeedClient({ url: server.url, local: localTransport({ map: true }) });
        for await (const _ of other.batches("d", { rank: 0, world: 1, microBatch: 1, startStep: 100, endStep: 150 })) { /* read */ }
        await other.close();
        expect(view).toEqual(want.subarray(b.step * per, (b.step + 1) * per));
        break;
      }
      await a.close();
    } finally {
      await server.close();
    }
  });

  it("removes a retired ring at shutdown while its fill still waits on a stalled origin", async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let stalling = false;
    const dir = join(ws.dir, "shm-stall-close");
    const stuck = await startServer(ws, [...dataset, "--shm-dir", dir, "--cache-dir", join(ws.dir, "c-stall-close")], {
      makeOrigin: (spec) => originWithSlowReads(spec, async () => {
        if (stalling) await gate;
      }),
    });
    stalling = true;
    const kept = () => readdirSync(dir).filter((n) => n.endsWith(".ring") || n.endsWith(".spare"));
    try {
      const s = await greetedControl(join(dir, `rackfeed-${new URL(stuck.url).port}.sock`));
      s.s.write(encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 4, startStep: 0 }));
      expect((await s.next()).t).toBe("ring");
      s.s.close(); // holding nothing: its ring is retired to be kept, once its fill stops
      await waitFor(() => kept().some((n) => n.endsWith(".spare")), "the ring retired");
      await stuck.close();
      expect(kept()).toEqual([]);
    } finally {
      release();
      await stuck.close();
    }
  });

  it("keeps no ring with --shm-spare-rings 0: its file and bytes go with its consumer", async () => {
    const dir = join(ws.dir, "shm-no-spares");
    const server = await startServer(ws, [...args.filter((a) => a !== shmDir), dir, "--shm-spare-rings", "0"]);
    try {
      const c = new RackfeedClient({ url: server.url, local: localTransport() });
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 1, endStep: 3 })) expect(b.transport).toBe("shm");
      await c.close();
      await waitFor(async () => (await server.metric("rackfeed_shm_ring_bytes")) === 0, "the ring's bytes given back");
      expect(readdirSync(dir).filter((n) => n.endsWith(".ring") || n.endsWith(".spare"))).toEqual([]);
      expect(await server.metric("rackfeed_shm_spare_rings")).toBe(0);
    } finally {
      await server.close();
    }
  });

  it("fills slots in a fixed round, and tells a polling client of a batch only when it waits for it", async () => {
    const { s, next } = await greeted();
    try {
      s.write(encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 20, startStep: 10, endStep: 150, slots: 2, notify: "wait" }));
      const ring = await next();
      expect(ring, JSON.stringify(ring)).toMatchObject({ t: "ring", endStep: 150 });
      const slots = Number(ring.slots);
      expect(slots).toBe(MAX_RING_SLOTS); // asked for 2: the server deepens a ring of small batches
      // No notice without a wait: each next frame is the answer to the wait before it.
      for (const step of [10, 11, 12]) {
        s.write(encodeFrame({ t: "wait", step }));
        const notice = await next();
        expect(notice).toMatchObject({ t: "batch", step, slot: (step - 10) % slots, generation: step - 10 + 1, firstSample: step * 20 });
        const file = readFileSync(String(ring.path));
        const h = decodeSlotHeader(new DataView(file.buffer, file.byteOffset, file.byteLength), slotHeaderOffset(Number(notice.slot)));
        expect(h).toMatchObject({ generation: step - 9, step, firstSample: step * 20, length: 20 * 65 * 2 });
        expect(["hit", "filling", "miss"]).toContain(h.cache);
        s.write(encodeFrame({ t: "release", slot: notice.slot as number, generation: notice.generation as number }));
      }
      s.write(encodeFrame({ t: "wait", step: 2 }));
      expect(String((await next()).message)).toMatch(/Wait for step 2, which the ring no longer holds/);
    } finally {
      s.close();
    }
  });

  it("answers each of several waits outstanding at once, one for the same step included (another language's client may send them), and refuses one beyond the ring", async () => {
    const { s, next, slots } = await filledPollingRing(150);
    try {
      s.write(encodeFrame({ t: "wait", step: slots }));
      s.write(encodeFrame({ t: "wait", step: slots })); // asked twice: answered twice, as a published step's waits are
      s.write(encodeFrame({ t: "wait", step: slots + 1 }));
      // Generations count steps from the start (step s of this round: s + 1).
      s.write(encodeFrame({ t: "release", slot: 0, generation: 1 }));
      s.write(encodeFrame({ t: "release", slot: 1, generation: 2 }));
      expect(await next()).toMatchObject({ t: "batch", step: slots, slot: 0, generation: slots + 1 });
      expect(await next()).toMatchObject({ t: "batch", step: slots, slot: 0, generation: slots + 1 });
      expect(await next()).toMatchObject({ t: "batch", step: slots + 1, slot: 1, generation: slots + 2 });
      s.write(encodeFrame({ t: "wait", step: 149 })); // below endStep, past a ring's length from the next step (slots + 2)
      const refused = await next();
      expect(refused).toMatchObject({ t: "error", status: 400 });
      expect(String(refused.message)).toMatch(/Wait for step 149: the next step published is \d+, and the ring holds \d+ steps ahead/);
    } finally {
      s.close();
    }
  });

  it("refuses more waits outstanding than twice the ring's slots (each would be answered: a flood of them would hold the server)", async () => {
    // Nothing is released: step `slots` stays unpublished.
    const { s, next, slots } = await filledPollingRing(150);
    try {
      for (let i = 0; i < 2 * slots; i++) s.write(encodeFrame({ t: "wait", step: slots }));
      s.write(encodeFrame({ t: "wait", step: slots }));
      const m = await next();
      expect(m).toMatchObject({ t: "error", status: 400 });
      expect(String(m.message)).toMatch(new RegExp(`Too many waits outstanding \\(${2 * slots}\\): at most 2 per slot of the ring \\(${slots} slots\\)`));
    } finally {
      s.close();
    }
  });

  it("answers a wait at or past endStep with end, also after end was sent", async () => {
    const { s, next } = await greeted();
    try {
      s.write(encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 20, startStep: 0, endStep: 3, notify: "wait" }));
      expect(await next()).toMatchObject({ t: "ring", endStep: 3 });
      expect(await next()).toMatchObject({ t: "end", step: 3 }); // three small steps fit the ring: all published
      s.write(encodeFrame({ t: "wait", step: 3 }));
      expect(await next()).toMatchObject({ t: "end", step: 3 });
      s.write(encodeFrame({ t: "wait", step: 1 }));
      expect(await next()).toMatchObject({ t: "batch", step: 1 });
    } finally {
      s.close();
    }
  });

  it("answers waits at or past endStep sent before the end with the one end that follows the last step, never with an error", async () => {
    const { s, next, slots } = await filledPollingRing(70);
    try {
      expect(slots).toBeLessThan(70); // the ring fills steps 0 .. slots-1, then waits for releases
      // A polling client may ask past the end before it is near (here, past a ring's length
      // from the next step published too: that was an error).
      s.write(encodeFrame({ t: "wait", step: 70 }));
      s.write(encodeFrame({ t: "wait", step: 500 }));
      for (let step = 0; step < 70 - slots; step++) s.write(encodeFrame({ t: "release", slot: step % slots, generation: step + 1 }));
      expect(await next()).toMatchObject({ t: "end", step: 70 });
      // One end for both: the next frame answers the next wait.
      s.write(encodeFrame({ t: "wait", step: 69 }));
      expect(await next()).toMatchObject({ t: "batch", step: 69 });
      s.write(encodeFrame({ t: "wait", step: 500 }));
      expect(await next()).toMatchObject({ t: "end", step: 70 });
    } finally {
      s.close();
    }
  });

  it("stops reading a peer while hundreds of its messages wait behind an open: a flood stays in its own socket", async () => {
    const dir = join(ws.dir, "shm-flood");
    const server = await startServer(ws, [...dataset, "--shm-dir", dir]);
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    // The open waits for the catalog until released: the messages behind it cannot be handled.
    const catalog = server.server.datasets;
    const get = catalog.get.bind(catalog);
    catalog.get = (name: string) => gate.then(() => get(name));
    const s = net.createConnection({ path: join(dir, `rackfeed-${new URL(server.url).port}.sock`) });
    try {
      await new Promise<void>((r, j) => s.once("connect", r).once("error", j));
      s.on("data", () => {});
      s.on("error", () => {});
      const waits = Array.from({ length: 100_000 }, (_, i) => encodeFrame({ t: "wait", step: i }));
      s.write(Buffer.concat([
        encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION }),
        encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 4, startStep: 0, notify: "wait" }),
        ...waits,
      ]));
      await sleep(300);
      // ~1.5 MB sent: the server took what 256 messages and the kernel's buffers hold, no more.
      expect(s.writableLength).toBeGreaterThan(512 * 1024);
    } finally {
      release();
      s.destroy();
      await server.close();
    }
  });

  it("reads nothing more from a peer after an error frame: what it goes on sending stays in its own socket", async () => {
    const path = join(shmDir, `rackfeed-${new URL(rf.url).port}.sock`);
    const s = net.createConnection({ path, allowHalfOpen: true });
    try {
      await new Promise<void>((r, j) => s.once("connect", r).once("error", j));
      const got = new Promise<Uint8Array>((r) => s.once("data", r));
      s.write(Uint8Array.of(0x7f)); // a frame's length, cut short: the decoder holds this byte
      await sleep(50);
      s.write(Uint8Array.of(0xff, 0xff, 0xff)); // completes a length over MAX_FRAME_BYTES
      expect(new FrameDecoder().push(await got)[0]).toMatchObject({ t: "error", status: 400 });
      const junk = new Uint8Array(1 << 20);
      for (let i = 0; i < 16; i++) s.write(junk);
      await sleep(300); // well within the server's grace before it cuts the connection
      // A server still reading would have taken it all (and, before, kept it: a decoder fed on grows).
      expect(s.writableLength).toBeGreaterThan(8 << 20);
    } finally {
      s.destroy();
    }
  });

  it("answers bad control messages with an error frame and a closed socket, never a crash", async () => {
    const cases: [Uint8Array, RegExp][] = [
      [encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 1, startStep: 0 }), /Expected "hello" first/],
      [encodeFrame({ t: "hello", version: 99 }), /version 99 is not supported/],
      [Uint8Array.of(0, 0, 0, 3, 0xc1, 0xc1, 0xc1), /not msgpack|not a map/],
      [Uint8Array.of(0x7f, 0xff, 0xff, 0xff), /exceeds/],
    ];
    for (const [frame, message] of cases) {
      const reply = await exchange([frame]);
      expect(reply.t).toBe("error");
      expect(reply.status).toBe(400);
      expect(String(reply.message)).toMatch(message);
    }
    const hello = encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION });
    const unknown = await exchange([hello, encodeFrame({ t: "open", dataset: "nope", rank: 0, world: 1, microBatch: 1, startStep: 0 })], 2);
    expect(unknown).toMatchObject({ t: "error", status: 404 });
    const badRank = await exchange([hello, encodeFrame({ t: "open", dataset: "d", rank: 4, world: 4, microBatch: 1, startStep: 0 })], 2);
    expect(badRank).toMatchObject({ t: "error", status: 400 });
    expect(String(badRank.message)).toMatch(/Invalid "rank": 4; expected an integer from 0 to 3/);
    const forged = await exchange([hello, encodeFrame({ t: "release", slot: 0, generation: 7 })], 2);
    expect(String(forged.message)).toMatch(/does not hold/);
    const badNotify = await exchange([hello, encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 1, startStep: 0, notify: "sometimes" } as never)], 2);
    expect(String(badNotify.message)).toMatch(/Invalid "notify": "sometimes"; expected "all" or "wait"/);
    const earlyWait = await exchange([hello, encodeFrame({ t: "wait", step: 0 })], 2);
    expect(String(earlyWait.message)).toMatch(/"wait" needs an open consumer with notify "wait"/);
    const earlyStop = await exchange([hello, encodeFrame({ t: "stop" })], 2);
    expect(String(earlyStop.message)).toMatch(/"stop" needs an open consumer: send "open" first/);
    // Still serving.
    expect((await fetch(`${rf.url}/healthz`)).status).toBe(200);
    expect(await rf.metric("rackfeed_shm_rings")).toBe(0);
  });

  it("closes a connection that greets and then never asks for a consumer: it holds no connection slot", async () => {
    const dir = join(ws.dir, "shm-idle");
    const idle = await startServer(ws, [...dataset, "--cache-dir", join(ws.dir, "cache-idle"), "--shm-dir", dir], { shmOpenTimeoutMs: 300 });
    try {
      const s = await connectUnix(join(dir, `rackfeed-${new URL(idle.url).port}.sock`));
      try {
        const dec = new FrameDecoder();
        const got: Record<string, unknown>[] = [];
        s.write(encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION }));
        for (let chunk = await s.read(); chunk !== null; chunk = await s.read()) got.push(...dec.push(chunk));
        expect(got[0]).toMatchObject({ t: "welcome" });
        expect(got[1]).toMatchObject({ t: "error", status: 400, message: 'No "open" within 300 ms of connecting' });
      } finally {
        s.close();
      }
      await waitFor(async () => (await idle.metric("rackfeed_shm_connections")) === 0, "the idle connection to be dropped", 5000);
    } finally {
      await idle.close();
    }
  });

  it("cuts off a peer that keeps its end open after an error frame: it holds no connection slot (nor shutdown)", async () => {
    const s = net.connect({ path: join(shmDir, `rackfeed-${new URL(rf.url).port}.sock`), allowHalfOpen: true });
    s.on("error", () => {});
    try {
      await new Promise((r) => s.once("connect", r));
      const ended = new Promise((r) => s.once("end", r)); // the server's FIN, after its error frame
      const dec = new FrameDecoder();
      const got: Record<string, unknown>[] = [];
      s.on("data", (chunk: Uint8Array) => got.push(...dec.push(chunk)));
      s.write(encodeFrame({ t: "hello", version: 99 }));
      await ended;
      expect(got[0]).toMatchObject({ t: "error", status: 400 });
      // The peer never closes its end; the server lets go of the connection anyway.
      await waitFor(async () => (await rf.metric("rackfeed_shm_connections")) === 0, "the half-open peer's connection to be dropped", 5000);
    } finally {
      s.destroy();
    }
  });

  it("says where the shm path stops on a server without it (404), and the SDK uses HTTP", async () => {
    const plain = await startServer(ws, [...dataset, "--shm-dir", "off"]);
    try {
      const res = await fetch(`${plain.url}/v1/shm`);
      expect(res.status).toBe(404);
      const c = new RackfeedClient({ url: plain.url, local: localTransport() });
      const steps = [];
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 2, endStep: 3 })) steps.push(`${b.step}:${b.transport}`);
      expect(steps).toEqual(["0:http", "1:http", "2:http"]);
    } finally {
      await plain.close();
    }
  });

  it("falls back to HTTP when the rings' byte budget is full", async () => {
    const dir = join(ws.dir, "shm-small");
    const small = await startServer(ws, [...dataset, "--shm-dir", dir, "--shm-bytes", "1MiB"]);
    try {
      let clock = 0;
      const c = new RackfeedClient({ url: small.url, local: localTransport(), now: () => clock });
      // 2000 samples × 65 tokens × 2 bytes = 260 KB a slot; 5 slots exceed 1 MiB.
      const got = [];
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 2000, endStep: 2, prefetch: 4 })) got.push(b.transport);
      expect(got).toEqual(["http", "http"]);
      const fits = [];
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 100, endStep: 2, prefetch: 1 })) fits.push(b.transport);
      expect(fits).toEqual(["http", "http"]); // the client remembers that this server had no room
      clock += SHM_RECHECK_MS; // ... for a while: then it asks again, and this ring fits
      const later = [];
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 100, endStep: 2, prefetch: 1 })) later.push(b.transport);
      expect(later).toEqual(["shm", "shm"]);
      const fresh = new RackfeedClient({ url: small.url, local: localTransport() });
      for await (const b of fresh.batches("d", { rank: 0, world: 1, microBatch: 100, endStep: 2, prefetch: 1 })) expect(b.transport).toBe("shm");
    } finally {
      await small.close();
    }
  });

  it("falls back to HTTP when the client reaches the socket but cannot open the ring (another /dev/shm, no permission)", async () => {
    const base = localTransport();
    let tried = 0;
    const local = {
      ...base,
      openRing: () => {
        tried++;
        throw new Error("EACCES: permission denied");
      },
    };
    const c = new RackfeedClient({ url: rf.url, local });
    const got: string[] = [];
    const bytes: Uint8Array[] = [];
    for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 3, endStep: 3 })) {
      got.push(b.transport);
      bytes.push(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength).slice());
    }
    expect(tried).toBe(1);
    expect(got).toEqual(["http", "http", "http"]);
    for (let s = 0; s < 3; s++) expectSameBytes(bytes[s], await httpSamples(rf.url, s * 3, 3), `step ${s}`);
    await waitFor(async () => (await rf.metric("rackfeed_shm_rings")) === 0, "the unread ring to be removed");
  });

  it("raises the server's reason to a client given only a socket when it cannot open the ring: it has no HTTP to fall back on", async () => {
    const { socket } = (await (await fetch(`${rf.url}/v1/shm`)).json()) as { socket: string };
    const local = { ...localTransport(), openRing: () => { throw new Error("EACCES: permission denied"); } };
    const c = new RackfeedClient({ socket, local });
    const err = await (async () => {
      for await (const _ of c.batches("d", { rank: 0, world: 1, microBatch: 3, endStep: 3 })) { /* none comes */ }
    })().then(() => undefined, (e) => e);
    expect(err).toBeInstanceOf(RackfeedError);
    expect(err).toMatchObject({ status: 503, code: "SHM_UNREACHABLE" });
    expect(err.message).toMatch(/Cannot open the ring .*EACCES/);
  });

  it("falls back to HTTP when the shm directory itself is full (ENOSPC), and the server lives on", async () => {
    // A 1 MiB tmpfs, as small as a container's /dev/shm can be relative to a ring: pages are
    // allocated when the ring is made, so this is ENOSPC at open, never SIGBUS mid-batch.
    const tiny = join(ws.dir, "tiny");
    await withTmpfs(tiny, "1m", async () => {
      const full = await startServer(ws, [...dataset, "--shm-dir", tiny, "--shm-bytes", "64MiB"]);
      try {
        const c = new RackfeedClient({ url: full.url, local: localTransport() });
        const got = [];
        for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 2000, endStep: 2, prefetch: 4 })) got.push(b.transport);
        expect(got).toEqual(["http", "http"]);
        expect(readdirSync(tiny).filter((n) => n.endsWith(".ring"))).toEqual([]);
        expect(await full.metric("rackfeed_shm_ring_bytes")).toBe(0);
        // The pread client (the mapped one is exercised by the tests around).
        const small = new RackfeedClient({ url: full.url, local: localTransport({ map: false }) });
        for await (const b of small.batches("d", { rank: 0, world: 1, microBatch: 10, endStep: 3 })) expect(b.transport).toBe("shm");
        // Deepened rings (64 slots of 4 KiB) fill the 1 MiB tmpfs after three consumers; a fourth
        // still gets shm, with the ring of the size it asked for (prefetch 2: 3 slots).
        const held = [];
        try {
          for (let i = 0; i < 4; i++) {
            const it = small.batches("d", { rank: 0, world: 1, microBatch: 30, endStep: 100, prefetch: 2 });
            held.push(it);
            expect((await it.next()).value!.transport, `consumer ${i}`).toBe("shm");
          }
          const sizes = readdirSync(tiny).filter((n) => n.endsWith(".ring")).map((n) => statSync(join(tiny, n)).size).sort((a, b) => a - b);
          expect(sizes).toEqual([ringLayout(3, 30 * 65 * 2).fileBytes, ...Array(3).fill(ringLayout(MAX_RING_SLOTS, 30 * 65 * 2).fileBytes)]);
        } finally {
          for (const it of held) await it.return(undefined); // rings closed, so the tmpfs can be unmounted
        }
      } finally {
        await full.close();
      }
    });
  });

  it("removes kept rings when the shm directory has no room for a new one", async () => {
    const dir = join(ws.dir, "tiny-spares");
    // Room for two rings of 64 slots of 8 KiB, not for those and a ring of 64 slots of 4 KiB.
    await withTmpfs(dir, "1200k", async () => {
      const server = await startServer(ws, [...dataset, "--shm-dir", dir, "--shm-bytes", "64MiB"]);
      const held = [];
      try {
        const c = new RackfeedClient({ url: server.url, local: localTransport({ map: false }) });
        // A ring of 64 slots of 4 KiB (~260 KiB), kept once its consumer ends.
        for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 10, endStep: 3 })) expect(b.transport).toBe("shm");
        await waitFor(async () => (await server.metric("rackfeed_shm_spare_rings")) === 1, "a kept ring");
        // Rings of 64 slots of 8 KiB (~520 KiB): the first fits beside the kept one; the second
        // does not, and the kept ring makes room (else the consumer would get a ring of the 3
        // slots it asked for).
        for (let i = 0; i < 2; i++) {
          const it = c.batches("d", { rank: 0, world: 1, microBatch: 60, endStep: 100, prefetch: 2 });
          held.push(it);
          expect((await it.next()).value!.transport, `consumer ${i}`).toBe("shm");
        }
        expect(await server.metric("rackfeed_shm_spare_rings")).toBe(0);
        const sizes = readdirSync(dir).filter((n) => n.endsWith(".ring")).map((n) => statSync(join(dir, n)).size);
        expect(sizes).toEqual(Array(2).fill(ringLayout(MAX_RING_SLOTS, 60 * 65 * 2).fileBytes));
      } finally {
        for (const it of held) await it.return(undefined);
        await server.close();
      }
    });
  });

  it("falls back to HTTP when the shm directory has no inode left for a ring", async () => {
    const dir = join(ws.dir, "no-inodes");
    await withTmpfs(dir, "16m,nr_inodes=16", async () => {
      const full = await startServer(ws, [...dataset, "--shm-dir", dir]);
      try {
        let fillers = 0;
        for (;;) {
          try {
            writeFileSync(join(dir, `filler-${fillers}`), "");
          } catch (e) {
            expect((e as NodeJS.ErrnoException).code).toBe("ENOSPC");
            break;
          }
          if (++fillers > 100) throw new Error("the tmpfs did not honour nr_inodes");
        }
        const c = new RackfeedClient({ url: full.url, local: localTransport() });
        const got: string[] = [];
        for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 10, endStep: 2 })) got.push(b.transport);
        expect(got).toEqual(["http", "http"]);
        expect(await full.metric("rackfeed_shm_ring_bytes")).toBe(0);
      } finally {
        await full.close();
      }
    });
  });

  it("gives a finished ring's memory back at once where none is kept (--shm-spare-rings 0): a mapped client's kept view then reads zeros, and the tmpfs is free", async () => {
    const tmpfs = join(ws.dir, "tmpfs-release");
    // The umount at the end also checks that nothing maps the tmpfs any more.
    await withTmpfs(tmpfs, "16m", async () => {
      const free = () => statfsSync(tmpfs).bfree;
      const before = free();
      const server = await startServer(ws, [...dataset, "--shm-dir", tmpfs, "--shm-spare-rings", "0"]);
      try {
        const c = new RackfeedClient({ url: server.url, local: localTransport() }); // mapped (koffi)
        let last: Uint16Array | undefined;
        let whileOpen = 0;
        for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 50, endStep: 20 })) {
          expect(b.transport).toBe("shm");
          last = b.tokens as Uint16Array;
          whileOpen = Math.max(whileOpen, before - free());
        }
        expect(whileOpen).toBeGreaterThan(0); // the ring took tmpfs pages while in use
        expect(last!.some((t) => t !== 0), "a kept view no longer shows the batch").toBe(false);
        await waitFor(() => free() === before, "the ring's tmpfs pages to be free");
      } finally {
        await server.close();
      }
    });
  });

  it("removes the ring file of a departed client at once, even while its fill waits on a stalled origin", async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let stalling = false;
    let stalled = 0;
    const dir = join(ws.dir, "shm-stall");
    const stuck = await startServer(ws, [...dataset, "--shm-dir", dir, "--cache-dir", join(ws.dir, "c-stall")], {
      makeOrigin: (spec) =>
        originWithSlowReads(spec, async () => {
          if (!stalling) return;
          stalled++;
          await gate; // an origin that stopped answering
        }),
    });
    stalling = true; // from now on: the dataset's index was read at start-up
    const s = await connectUnix(join(dir, `rackfeed-${new URL(stuck.url).port}.sock`));
    const ringFiles = () => (existsSync(dir) ? readdirSync(dir).filter((n) => n.endsWith(".ring")) : []);
    try {
      s.write(encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION }));
      s.write(encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 4, startStep: 0 }));
      await waitFor(() => stalled > 0 && ringFiles().length === 1, "a fill to wait on the origin");
      s.close();
      // The ring file goes now; its mapping and budget wait for the fill, which waits for the
      // origin; only then is it kept for the next consumer.
      await waitFor(async () => ringFiles().length === 0 && (await stuck.metric("rackfeed_shm_rings")) === 0, "the ring file to be removed");
      expect(await stuck.metric("rackfeed_shm_ring_bytes")).toBeGreaterThan(0);
      await new Promise((r) => setTimeout(r, 100));
      expect(await stuck.metric("rackfeed_shm_spare_rings")).toBe(0);
      release();
      await waitFor(async () => (await stuck.metric("rackfeed_shm_spare_rings")) === 1, "the ring kept once the fill stops");
    } finally {
      s.close();
      release();
      await stuck.close();
    }
  });

  it("bounds an SDK consumer's wait for a batch by timeoutMs: a server that stopped filling fails the iteration with a clear error, not a hang", async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let stalling = false;
    const dir = join(ws.dir, "shm-wedged");
    const stuck = await startServer(ws, [...dataset, "--shm-dir", dir, "--cache-dir", join(ws.dir, "c-wedged")], {
      makeOrigin: (spec) =>
        originWithSlowReads(spec, async () => {
          if (stalling) await gate; // a server whose fills never end: the socket stays open and silent
        }),
    });
    stalling = true;
    const c = new RackfeedClient({ url: stuck.url, local: localTransport(), timeoutMs: 400, retryForMs: 1500, backoffMs: 20, maxBackoffMs: 100 });
    try {
      expect(await c.transport()).toBe("shm");
      const t0 = performance.now();
      const err = await within((async () => {
        for await (const _ of c.batches("d", { rank: 0, world: 1, microBatch: 4, endStep: 10 })) throw new Error("a batch came from a stalled server");
      })().then(() => undefined, (e) => e), 15_000, "batches() from a server that stopped filling");
      expect(err).toBeInstanceOf(RackfeedError);
      expect(err.code).toBe("UNAVAILABLE");
      // The last attempt waited for step 0, or, on a box loaded enough to slow a ring's making, for the ring.
      expect(err.message).toMatch(/Shared-memory path failed after \d+ attempts: No answer from the shared-memory server in 400 ms while waiting for (step 0|the ring)/);
      expect(c.retried).toBeGreaterThan(0);
      expect(performance.now() - t0).toBeLessThan(10_000);
    } finally {
      release();
      await c.close();
      await stuck.close();
    }
  });

  it("requires the read token in hello when the server has one", async () => {
    const dir = join(ws.dir, "shm-token");
    const locked = await startServer(ws, [...dataset, "--shm-dir", dir, "--read-token", "s3cret-token-1"]);
    try {
      const socket = join(dir, `rackfeed-${new URL(locked.url).port}.sock`);
      const refused = await exchange([encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION })], 1, socket);
      expect(refused).toMatchObject({ t: "error", status: 401 });
      const welcome = await exchange([encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION, token: "s3cret-token-1" })], 1, socket);
      expect(welcome.t).toBe("welcome");
      const c = new RackfeedClient({ url: locked.url, token: "s3cret-token-1", local: localTransport() });
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 1, endStep: 2 })) expect(b.transport).toBe("shm");
    } finally {
      await locked.close();
    }
  });

  it("admits a peer running as the server's user by its Unix credentials (SO_PEERCRED), and asks anyone else for the token", async () => {
    expect(process.getuid?.(), "this test runs as root, to start a peer as another user").toBe(0);
    const credentials = loadNodePeerCredentials();
    expect(credentials, "koffi reads SO_PEERCRED on this machine").toBeDefined();
    const dir = join(ws.dir, "shm-peer");
    // Outside the workspace (mode 0700), so that a peer running as nobody can reach it.
    const socket = `/tmp/rackfeed-peer-${process.pid}-${Date.now()}.sock`;
    const locked = await startServer(ws, [...dataset, "--shm-dir", dir, "--shm-socket", socket, "--read-token", "s3cret-token-2"], {
      peers: { of: (s) => withFd(s, credentials!), uid: 0 },
    });
    try {
      await expectAdmittedByCredentials(socket, "s3cret-token-2");
    } finally {
      await locked.close();
    }
  });

  for (const runtime of ["node", "deno"] as const) {
    it(`admits a peer by its Unix credentials on a ${runtime} server started from its entry file (the runtime's own SO_PEERCRED), and asks another user for the token`, async () => {
      expect(process.getuid?.(), "this test runs as root, to start a peer as another user").toBe(0);
      const socket = `/tmp/rackfeed-peer-${runtime}-${process.pid}-${Date.now()}.sock`;
      const flags = ["serve", "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`, "--cache-dir", join(ws.dir, `c-peer-${runtime}`), "--shm-dir", join(ws.dir, `shm-peer-${runtime}`), "--shm-socket", socket, "--read-token", "s3cret-token-3"];
      const child = runtime === "deno" ? await startChild(DENO, ["run", "-A", `${ROOT}src/main.ts`, ...flags]) : await startChild(NODE, [...NODE_TS, `${ROOT}src/main.node.ts`, ...flags]);
      try {
        await expectAdmittedByCredentials(socket, "s3cret-token-3");
      } finally {
        await child.stop();
        rmSync(socket, { force: true }); // left behind where stop() had to kill the server
      }
    }, 90_000);
  }

  it("removes rings of dead servers and a stale socket at start-up, and refuses a socket a live server holds", async () => {
    const dir = join(ws.dir, "shm-restart");
    const socket = join(dir, "rf.sock");
    const first = await startServer(ws, [...dataset, "--shm-dir", dir, "--shm-socket", socket]);
    try {
      await expect(startServer(ws, ["--shm-dir", dir, "--shm-socket", socket])).rejects.toThrow(ShmStartupError);
      await expect(startServer(ws, ["--shm-dir", dir, "--shm-socket", socket])).rejects.toThrow(/held by a running server/);
      writeFileSync(join(dir, "not-a-socket"), "keep me");
      await expect(startServer(ws, ["--shm-dir", dir, "--shm-socket", join(dir, "not-a-socket")])).rejects.toThrow(/is not a socket/);
      expect(existsSync(join(dir, "not-a-socket"))).toBe(true);
    } finally {
      await first.close();
    }
    // What a server killed with -9 leaves: its rings, and a socket file nobody listens on.
    writeFileSync(join(dir, "rackfeed-ring-4242-deadbeef-1.ring"), new Uint8Array(8192));
    writeFileSync(join(dir, "rackfeed-ring-4242-deadbeef-2.spare"), new Uint8Array(8192)); // a ring it kept for its next consumer
    writeFileSync(join(dir, "rackfeed-ring-77-cafe-1.ring"), new Uint8Array(8192)); // pid 77 is alive here
    writeFileSync(join(dir, "rackfeed-ring-77-cafe-2.spare"), new Uint8Array(8192));
    // An earlier server with the pid the next one gets (a container's pid 1 restarted): alive by
    // its pid, dead by its instance.
    writeFileSync(join(dir, "rackfeed-ring-1234-0ld1n5t4-3.ring"), new Uint8Array(8192));
    await leaveStaleSocket(socket);
    const second = await startServer(ws, [...dataset, "--shm-dir", dir, "--shm-socket", socket], {
      pid: 1234,
      isAlive: (pid) => pid !== 4242,
    });
    try {
      expect(readdirSync(dir).sort()).toEqual(["not-a-socket", "rackfeed-ring-77-cafe-1.ring", "rackfeed-ring-77-cafe-2.spare", "rf.sock"]);
      const c = new RackfeedClient({ url: second.url, local: localTransport() });
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 1, endStep: 2 })) {
        expect(b.transport).toBe("shm");
        expect(readdirSync(dir).some((n) => n.startsWith("rackfeed-ring-1234-"))).toBe(true);
      }
    } finally {
      await second.close();
    }
  });

  it("refuses to map a ring file shorter than the server announced (reading the mapping past its end would be SIGBUS)", () => {
    const path = join(ws.dir, "short.ring");
    writeFileSync(path, new Uint8Array(8192));
    expect(() => localTransport().openRing(path, 16384)).toThrow(/short\.ring has 8192 bytes, expected 16384/);
    expect(localTransport().openRing(path, 8192).mapped?.length).toBe(8192);
  });

  it("sweeps past a dead server's ring it may not remove (another user's, in a shared sticky directory, with a lock file it may not lock), naming it", async () => {
    // Outside the workspace (mode 0700), so that a sweep running as nobody can reach it.
    const dir = mkdtempSync(join(tmpdir(), "rackfeed-sticky-"));
    try {
      chmodSync(dir, 0o1777);
      writeFileSync(join(dir, "rackfeed-ring-4242-r00t-1.ring"), new Uint8Array(8192)); // root's, in a sticky directory
      writeFileSync(join(dir, "rackfeed-ring-4242-r00t.lock"), "", { mode: 0o644 }); // its lock: nobody may not open it to lock it
      // The sweep as nobody (uid 65534), in a child: it may not unlink root's file here.
      const script = `import { removeDeadRings } from ${JSON.stringify(`${ROOT}src/shm/ring-file.ts`)};
        import { nodeFileLock } from ${JSON.stringify(`${ROOT}src/runtime/node.ts`)};
        const logged = [];
        // A lock file it cannot open to lock: judged by pid instead (dead here), not kept for ever.
        const removed = await removeDeadRings(${JSON.stringify(dir)}, () => false, undefined, nodeFileLock(), (m) => logged.push(m));
        console.log(JSON.stringify({ removed, logged }));`;
      const file = join(dir, "sweep.mts");
      writeFileSync(file, script);
      chmodSync(file, 0o644);
      const { stdout } = await promisify(execFile)(NODE, [...NODE_TS, file], { uid: 65534, gid: 65534, encoding: "utf8", timeout: 30_000, cwd: dir });
      const got = JSON.parse(stdout.trim().split("\n").at(-1)!);
      expect(got.removed).toEqual([]);
      expect(got.logged.join("\n")).toMatch(/cannot remove .*rackfeed-ring-4242-r00t-1\.ring, a ring file of a server that is gone; remove it by hand/);
      expect(existsSync(join(dir, "rackfeed-ring-4242-r00t-1.ring"))).toBe(true);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("tells other servers' rings apart by their lock files (flock), not by pids it may not see: keeps a live one's, removes a dead one's", async () => {
    const lockFile = nodeFileLock();
    expect(lockFile, "koffi binds flock on this machine").toBeDefined();
    const dir = join(ws.dir, "shm-locks");
    mkdirSync(dir);
    const ring = (name: string) => writeFileSync(join(dir, name), new Uint8Array(8192));
    // A server in another pid namespace, running: its pid means nothing here, its lock is held.
    const live = await lockFile!(join(dir, "rackfeed-ring-555-l1ve-1.ring.tmp"));
    renameSync(join(dir, "rackfeed-ring-555-l1ve-1.ring.tmp"), join(dir, "rackfeed-ring-555-l1ve.lock"));
    ring("rackfeed-ring-555-l1ve-1.ring");
    // Another, running with the very pid the new server gets (each container has its pid 1).
    const twin = await lockFile!(join(dir, "twin.tmp"));
    renameSync(join(dir, "twin.tmp"), join(dir, "rackfeed-ring-1234-tw1n.lock"));
    ring("rackfeed-ring-1234-tw1n-2.ring");
    // A dead one whose pid a live process here happens to have: its lock file is free.
    writeFileSync(join(dir, "rackfeed-ring-556-d3ad.lock"), "");
    ring("rackfeed-ring-556-d3ad-1.ring");
    ring("rackfeed-ring-556-d3ad-2.ring");
    const server = await startServer(ws, [...dataset, "--shm-dir", dir, "--shm-socket", join(dir, "rf.sock")], {
      pid: 1234,
      isAlive: (pid) => pid === 556,
      lockFile,
    });
    let own = "";
    try {
      const { instance } = (await (await fetch(`${server.url}/v1/shm`)).json()) as { instance: string };
      own = `rackfeed-ring-1234-${instance}.lock`;
      expect(readdirSync(dir).sort()).toEqual([
        own,
        "rackfeed-ring-1234-tw1n-2.ring",
        "rackfeed-ring-1234-tw1n.lock",
        "rackfeed-ring-555-l1ve-1.ring",
        "rackfeed-ring-555-l1ve.lock",
        "rf.sock",
      ].sort());
    } finally {
      await server.close();
      await live!.release();
      await twin!.release();
    }
    expect(existsSync(join(dir, own))).toBe(false); // its own lock file goes with it
  });

  it("tells the SDK a control-socket write was dropped once the server ended the connection or the socket closed, so its timings go over HTTP", async () => {
    const path = join(ws.dir, "ends.sock");
    let peer: net.Socket | undefined;
    const server = net.createServer((sock) => (peer = sock));
    await new Promise<void>((r) => server.listen(path, r));
    try {
      const s = await connectUnix(path);
      await waitFor(() => peer !== undefined, "the connection");
      expect(s.write(new Uint8Array([1]))).toBe(true);
      peer!.end(); // the server's end
      expect(await s.read()).toBeNull();
      expect(s.write(new Uint8Array([2]))).toBe(false);
      s.close();
      expect(s.write(new Uint8Array([3]))).toBe(false);
    } finally {
      server.close();
    }
  });

  it("counts every step's timings of an SDK consumer whose dataset is replaced under it: those it wrote before it read the end too", async () => {
    const dir = join(ws.dir, "shm-replaced-timings");
    const ADMIN = "admin-token-for-replacement-tests";
    const server = await startServer(ws, [...dataset, "--shm-dir", dir, "--cache-dir", join(ws.dir, "rt"), "--admin-token", ADMIN]);
    try {
      const c = new RackfeedClient({ url: server.url, local: localTransport(), backoffMs: 20, maxBackoffMs: 200, reportEvery: 1, reportIntervalMs: 0 });
      const before = await server.metric("rackfeed_t_wait_seconds_count", { dataset: "d" });
      let steps = 0;
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 3, endStep: 300, prefetch: 3 })) {
        expect(b.transport).toBe("shm");
        c.reportStep(b.step, { t_h2d: 0, t_compute: 0.01 });
        steps++;
        // After the second replacement it trains at ~30 ms a step: its ring's old slots take it
        // longer than a second to read through, and it reads its socket (and the end) only then.
        if (b.step > 150 && b.step < 230) await sleep(30);
        if (b.step === 20 || b.step === 150) {
          // A client polling its ring reads on through the slots published before the end, and
          // reports them on its socket, before it reads the end: those reports were dropped unread.
          const res = await fetch(`${server.url}/v1/datasets/d`, {
            method: "PUT",
            headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
            body: JSON.stringify({ ...REG, seed: 10 + b.step }),
          });
          expect(res.status).toBe(200);
          await res.arrayBuffer();
        }
      }
      await c.close();
      expect(steps).toBe(300);
      expect(c.retried).toBeGreaterThan(0); // it reconnected
      await waitFor(async () => (await server.metric("rackfeed_t_wait_seconds_count", { dataset: "d" })) === before + 300, "every step's t_wait to be counted");
    } finally {
      await server.close();
    }
  });

  it("ends a consumer whose dataset is replaced while its ring is being made (it would be filled from the old version)", async () => {
    const dir = join(ws.dir, "shm-replaced-while-made");
    let replaceNow: (() => void) | undefined;
    const server = await startServer(ws, [...dataset, "--shm-dir", dir, "--cache-dir", join(ws.dir, "rwm")], {
      // Called as the ring file is made, after the consumer's dataset was looked up: a
      // re-registration landing then (the ring's pages take milliseconds to write).
      mapFile: (path, bytes) => {
        replaceNow?.();
        replaceNow = undefined;
        return loadNodeMapping()!(path, bytes, true);
      },
    });
    try {
      const shm = (await server.server.startShm(0))!;
      const old = await server.server.datasets.get("d");
      replaceNow = () => shm.versionReplaced(old);
      const { s, next } = await greetedControl(join(dir, `rackfeed-${new URL(server.url).port}.sock`));
      try {
        s.write(encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 1, startStep: 0, endStep: 10, notify: "wait" }));
        expect(await next()).toMatchObject({ t: "error", code: "DATASET_REPLACED", status: 503 });
      } finally {
        s.close();
      }
      await waitFor(async () => (await server.metric("rackfeed_shm_rings")) === 0 && (await server.metric("rackfeed_shm_ring_bytes")) === 0, "its ring removed");
    } finally {
      await server.close();
    }
  });

  it("ends a consumer whose dataset is replaced: the SDK resumes over shm at its next step on the new version, no gap", async () => {
    const port = await freePort();
    const dir = join(ws.dir, "shm-replaced");
    const ADMIN = "admin-token-for-replacement-tests";
    const server = await startServer(ws, [...dataset, "--listen", `127.0.0.1:${port}`, "--shm-dir", dir, "--cache-dir", join(ws.dir, "rr"), "--admin-token", ADMIN]);
    try {
      const c = new RackfeedClient({ url: server.url, local: localTransport(), backoffMs: 20, maxBackoffMs: 200 });
      const got: { step: number; bytes: Uint8Array; transport: string }[] = [];
      // More steps than a ring holds (64 slots for batches this small): what the ring held when
      // the dataset was replaced is the old version's, everything after it the new one's.
      const steps = 300;
      for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 3, endStep: steps, prefetch: 3 })) {
        got.push({ step: b.step, bytes: new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength).slice(), transport: b.transport });
        if (b.step === 5) {
          const res = await fetch(`${server.url}/v1/datasets/d`, {
            method: "PUT",
            headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
            body: JSON.stringify({ ...REG, seed: 10 }),
          });
          expect(res.status).toBe(200);
          await res.arrayBuffer();
        }
      }
      expect(got.map((g) => g.step)).toEqual(Array.from({ length: steps }, (_, i) => i));
      expect(got.every((g) => g.transport === "shm")).toBe(true);
      expect(c.retried).toBeGreaterThan(0); // it reconnected
      // The suite's server still serves the old version (seed 9); this one the new (seed 10).
      const same = (a: Uint8Array, b: Uint8Array) => a.length === b.length && a.every((v, i) => v === b[i]);
      const version: string[] = [];
      for (const g of got) {
        const old = await httpSamples(rf.url, g.step * 3, 3);
        const now = await httpSamples(server.url, g.step * 3, 3);
        version.push(same(g.bytes, now) ? "new" : same(g.bytes, old) ? "old" : "neither");
      }
      const firstNew = version.indexOf("new");
      expect(version.includes("neither")).toBe(false);
      expect(firstNew).toBeGreaterThan(5);
      expect(firstNew).toBeLessThanOrEqual(6 + 64); // at most what the ring held
      expect(version.slice(0, firstNew).every((v) => v === "old")).toBe(true);
      expect(version.slice(firstNew).every((v) => v === "new")).toBe(true);
    } finally {
      await server.close();
    }
    expect(readdirSync(dir).filter((n) => n.endsWith(".ring"))).toEqual([]);
  });

  it("survives a server restart mid-iteration over shm: resumes at the next step with no duplicate and no gap", async () => {
    const port = await freePort();
    const dir = join(ws.dir, "shm-restart-2");
    const a = [...dataset, "--listen", `127.0.0.1:${port}`, "--shm-dir", dir, "--cache-dir", join(ws.dir, "rc")];
    let server: RunningServer | undefined = await startServer(ws, a);
    const c = new RackfeedClient({ url: `http://127.0.0.1:${port}`, local: localTransport(), backoffMs: 20, maxBackoffMs: 200, retries: 50 });
    const got: { step: number; bytes: Uint8Array; transport: string }[] = [];
    let restarted: Promise<void> | undefined;
    // More steps than a ring holds (64 slots for batches this small): the client must reconnect,
    // not only read what the old server left published in its ring.
    const steps = 200;
    for await (const b of c.batches("d", { rank: 1, world: 2, microBatch: 3, endStep: steps, prefetch: 3 })) {
      got.push({ step: b.step, bytes: new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength).slice(), transport: b.transport });
      if (b.step === 7) {
        const old = server!;
        server = undefined;
        await old.close();
        restarted = sleep(300).then(async () => {
          server = await startServer(ws, a);
        });
      }
    }
    await restarted;
    try {
      expect(got.map((g) => g.step)).toEqual(Array.from({ length: steps }, (_, i) => i));
      expect(got.every((g) => g.transport === "shm")).toBe(true);
      expect(c.retried).toBeGreaterThan(0);
      for (const g of got) expectSameBytes(g.bytes, await httpSamples(server!.url, (g.step * 2 + 1) * 3, 3), `step ${g.step}`);
      expect(readdirSync(dir).filter((n) => n.endsWith(".ring"))).toEqual([]);
    } finally {
      await server?.close();
    }
  });
});


/** A peer as nobody (uid 65534): a plain node process that sends one frame and prints the first reply. */
const PEER_SCRIPT = `
  const net = require("node:net");
  const s = net.connect(process.argv[1], () => s.write(Buffer.from(process.argv[2], "hex")));
  let got = Buffer.alloc(0);
  s.on("data", (d) => { got = Buffer.concat([got, d]); if (got.length >= 4 && got.length >= 4 + got.readUInt32BE(0)) { console.log(got.toString("hex")); s.destroy(); } });
  s.on("error", (e) => { console.error(e.message); process.exit(1); });
`;

/** Sends `frame` on the socket from a process running as nobody; the first message back. Asynchronous: the server may run in this very process. */
async function asNobody(socket: string, frame: Uint8Array): Promise<Record<string, unknown>> {
  const { stdout } = await promisify(execFile)(NODE, ["-e", PEER_SCRIPT, socket, Buffer.from(frame).toString("hex")], { uid: 65534, gid: 65534, encoding: "utf8", timeout: 20_000 });
  return new FrameDecoder().push(Buffer.from(stdout.trim(), "hex"))[0];
}

/**
 * The peer check of a server (running as root) with read token `token` on shm socket `socket`:
 * a hello from this process (root) without the token is welcomed, one from nobody is refused
 * naming both uids, and nobody with the token is welcomed. Opens the socket's mode to everyone.
 */
async function expectAdmittedByCredentials(socket: string, token: string): Promise<void> {
  // Without credentials every peer would need the token: this hello would be refused.
  expect(await exchange([encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION })], 1, socket)).toMatchObject({ t: "welcome" });
  // Another user: the socket's mode would keep it out; open it up to see the server's own check.
  chmodSync(socket, 0o666);
  const refused = await asNobody(socket, encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION }));
  expect(refused).toMatchObject({ t: "error", status: 401 });
  // The server's own uid as it found it (uid 0 would be admitted by a server told any uid).
  expect(String(refused.message)).toMatch(/runs as uid 65534, not as this server's uid 0/);
  expect((await asNobody(socket, encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION, token }))).t).toBe("welcome");
}

/** Sends frames on a fresh connection and returns the `n`th message back (1-based). */
async function exchange(frames: Uint8Array[], n = 1, socket?: string): Promise<Record<string, unknown>> {
  const path = socket ?? join(shmDir, `rackfeed-${new URL(rf.url).port}.sock`);
  const s = await connectUnix(path);
  try {
    for (const f of frames) s.write(f);
    const dec = new FrameDecoder();
    const got: Record<string, unknown>[] = [];
    while (got.length < n) {
      const chunk = await s.read();
      if (chunk === null) throw new Error(`Connection closed after ${got.length} messages: ${JSON.stringify(got)}`);
      got.push(...dec.push(chunk));
    }
    return got[n - 1];
  } finally {
    s.close();
  }
}

/** A raw control connection to the test server that has said hello; `next()` reads one message. */
/**
 * A polling consumer (`notify: "wait"`, micro-batch 20 from step 0 to `endStep`) whose ring the
 * server has filled: steps 0 .. slots-1 published, none released. Closes its socket on failure.
 */
async function filledPollingRing(endStep: number): Promise<GreetedControl & { slots: number }> {
  const control = await greeted();
  const { s, next } = control;
  try {
    s.write(encodeFrame({ t: "open", dataset: "d", rank: 0, world: 1, microBatch: 20, startStep: 0, endStep, notify: "wait" }));
    const slots = Number((await next()).slots);
    s.write(encodeFrame({ t: "wait", step: slots - 1 }));
    expect(await next()).toMatchObject({ t: "batch", step: slots - 1 });
    return { ...control, slots };
  } catch (e) {
    s.close();
    throw e;
  }
}

async function greeted(): Promise<GreetedControl> {
  return await greetedControl(join(shmDir, `rackfeed-${new URL(rf.url).port}.sock`));
}

/** A socket file with no listener, as a killed process leaves it. */
async function leaveStaleSocket(path: string): Promise<void> {
  // Node removes its socket file on close(); a child killed with -9 does not.
  const child = spawn(NODE, ["-e", `require("net").createServer().listen(${JSON.stringify(path)}, () => console.log("up"))`], { stdio: ["ignore", "pipe", "inherit"] });
  await new Promise<void>((r) => child.stdout.once("data", () => r()));
  child.kill("SIGKILL");
  await new Promise((r) => child.once("exit", r));
  expect(existsSync(path)).toBe(true);
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

describe("FrameDecoder", () => {
  it("cuts frames split at every byte, or several to a chunk, into the same messages", () => {
    const msgs = [
      { t: "hello", version: SHM_PROTOCOL_VERSION, token: "x".repeat(70_000 >> 2) },
      { t: "release", slot: 3, generation: 9 },
      { t: "wait", step: 12 },
    ];
    const stream = Buffer.concat(msgs.map((m) => encodeFrame(m as never)));
    const oneByOne = new FrameDecoder();
    const got: Record<string, unknown>[] = [];
    for (let i = 0; i < stream.length; i++) got.push(...oneByOne.push(stream.subarray(i, i + 1)));
    expect(got).toEqual(msgs);
    for (const cut of [1, 3, 4, 5, 17, 1000, stream.length - 1]) {
      const d = new FrameDecoder();
      const parts = [...d.push(stream.subarray(0, cut)), ...d.push(stream.subarray(cut))];
      expect(parts, `cut at ${cut}`).toEqual(msgs);
    }
    // A reused socket buffer: the decoder must have copied what it kept.
    const reused = new Uint8Array(stream.length);
    const d = new FrameDecoder();
    reused.set(stream.subarray(0, 10));
    expect(d.push(reused.subarray(0, 10))).toEqual([]);
    reused.fill(0xee);
    reused.set(stream.subarray(10), 0);
    expect(d.push(reused.subarray(0, stream.length - 10))).toEqual(msgs);
  });
});

describe("FrameOutbox", () => {
  it("writes release frames by hand that decode to the messages encodeFrame's do, among other frames, across growth", () => {
    const msgs: Record<string, unknown>[] = [];
    const box = new FrameOutbox(16); // smaller than one frame: it must grow
    const generations = [1, 2, 255, 256, 65_536, 2 ** 32 + 5, Number.MAX_SAFE_INTEGER];
    for (const [i, generation] of generations.entries()) {
      const slot = (i * 17) % MAX_RING_SLOTS;
      box.pushRelease(slot, generation);
      msgs.push({ t: "release", slot, generation });
      if (i % 3 === 0) {
        box.push(encodeFrame({ t: "wait", step: generation }));
        msgs.push({ t: "wait", step: generation });
      }
    }
    expect(box.frames).toBe(msgs.length);
    const first = box.take();
    expect(new FrameDecoder().push(first)).toEqual(msgs);
    // Handed over: what is queued next goes to another buffer, so a socket still holding the first reads it unchanged.
    const copy = first.slice();
    box.pushRelease(0, 99);
    expect(box.frames).toBe(1);
    expect(first).toEqual(copy);
    expect(new FrameDecoder().push(box.take())).toEqual([{ t: "release", slot: 0, generation: 99 }]);
  });

  it("is read by FrameDecoder's shortcut as msgpack reads it, and a body of the same size laid out otherwise still goes to msgpack", () => {
    const box = new FrameOutbox();
    box.pushRelease(5, 2 ** 40 + 3);
    const frame = box.take();
    expect(new FrameDecoder().push(frame)).toEqual([unpack(frame.subarray(4))]);
    // One letter of a key changed: the same length, not a release; msgpack decodes what it says.
    const other = frame.slice();
    other[other.length - 10] = "m".charCodeAt(0); // "generation" -> "generatiom"
    const [m] = new FrameDecoder().push(other);
    expect(m).toEqual(unpack(other.subarray(4)));
    expect(m).not.toHaveProperty("generation");
  });
});
