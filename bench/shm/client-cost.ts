/**
 * @module The SDK's own CPU cost per batch on the shared-memory path, with a server that is never
 * behind: what a trainer's process pays per `next()` when its batches are already in the ring.
 * On a host where the server has cores of its own, this is the client's bound in batches/s.
 *
 * The server side is played in this process: a ring in memory laid out as `src/shm/protocol.ts`
 * says, every slot published before the client asks, and each released slot published again at
 * once with the step one lap later. The client is the real SDK: `shmBatches` (the ring protocol
 * alone) and `RackfeedClient.batches` (what trainers call: t_wait, timings queued and reported
 * every 32 steps: on the consumer's socket, as rackfeed's server offers, or, as to a server that
 * does not, to a `fetch` that answers in this process or to a real server).
 *
 * Baseline, same run: the floor of any shm consumer, a loop doing only what a batch needs (read
 * its slot's generation, view its tokens, touch each page, publish the slot again), and, when
 * `bench/datasets/warm-batches.ts` has written its uint16 dataset and plan, numpy's memmap gather
 * of the same 64 KiB batches (bench/datasets/numpy_gather.py): the loader rackfeed is to beat 3×.
 *
 * Run: node --import tsx bench/shm/client-cost.ts   or   deno run -A bench/shm/client-cost.ts
 * Knobs (environment): BENCH_BATCHES=200000 (per measurement), BENCH_REPS=3 (interleaved).
 */

import { existsSync, readFileSync, mkdtempSync, rmSync } from "node:fs";
import { spawn, spawnSync } from "node:child_process";
import { setImmediate } from "node:timers";
import { tmpdir } from "node:os";
import { join } from "node:path";
import process from "node:process";
import { RackfeedClient } from "../../src/client/client.ts";
import type { LocalSocket, LocalTransport } from "../../src/client/shm-consumer.ts";
import { shmBatches } from "../../src/client/shm-consumer.ts";
import {
  type ClientMessage,
  decodeTimings,
  encodeFrame,
  encodeRingHeader,
  FrameDecoder,
  MAX_RING_SLOTS,
  MIN_RING_BYTES,
  ringLayout,
  type RingLayout,
  slotHeaderOffset,
  slotOfStep,
  writeSlotHeader,
} from "../../src/shm/protocol.ts";

const BATCHES = Number(process.env.BENCH_BATCHES ?? 200_000);
const REPS = Number(process.env.BENCH_REPS ?? 3);
const ROWS = 8;
const COLS = 4097;
const BATCH_BYTES = ROWS * COLS * 2;
/** The ring the server gives a consumer of these batches that asks for 4 slots (prefetch 3): deepened to 4 MiB, as `shm-server.ts` does. */
const SLOTS = Math.max(4, Math.min(MAX_RING_SLOTS, Math.floor(MIN_RING_BYTES / BATCH_BYTES)));
/** The demo's token dataset: the server refuses reports for datasets it does not know. */
const DATASET = "demo";
const DEADLINE = Date.now() + 10 * 60_000;

/** A server that publishes every slot before it is asked for: the client never waits. */
class EagerRing {
  readonly layout: RingLayout;
  readonly bytes: Uint8Array;
  readonly #view: DataView;
  #startStep = 0;
  #endStep = 0;
  /** `wait` messages seen: a client that found a slot unpublished (never, if the bench is right). */
  waits = 0;
  /** Steps whose timings came in `timings` messages. */
  timed = 0;
  /** ms this stand-in spent decoding the client's messages and publishing: the server's work, taken off the client's figures. */
  serverMs = 0;

  constructor(slots: number) {
    this.layout = ringLayout(slots, BATCH_BYTES);
    this.bytes = new Uint8Array(this.layout.fileBytes);
    this.bytes.set(encodeRingHeader(this.layout), 0);
    for (let i = this.layout.dataOffset; i < this.bytes.length; i += 4096) this.bytes[i] = i & 0xff;
    this.#view = new DataView(this.bytes.buffer);
  }

  open(startStep: number, endStep: number): void {
    this.#startStep = startStep;
    this.#endStep = endStep;
    for (let s = startStep; s < Math.min(endStep, startStep + this.layout.slots); s++) this.publish(s);
  }

  publish(step: number): void {
    const { slot, generation } = slotOfStep(step, this.#startStep, this.layout.slots);
    writeSlotHeader(this.#view, slotHeaderOffset(slot), { generation, length: BATCH_BYTES, step, firstSample: step * ROWS, cache: "hit" });
  }

  /** The client released a slot: fill it with the step one lap on, at once. */
  release(generation: number): void {
    const next = this.#startStep + generation - 1 + this.layout.slots;
    if (next < this.#endStep) this.publish(next);
  }
}

/** The SDK's local transport over an `EagerRing`, speaking the real framing on an in-process "socket". */
function eagerTransport(ring: EagerRing, timings = false): LocalTransport {
  return {
    pollSlots: true,
    nextTurn: () => new Promise((r) => setImmediate(r)),
    openRing: () => ({ mapped: ring.bytes, read: (offset, into) => into.set(ring.bytes.subarray(offset, offset + into.length)), close: () => {} }),
    connect: (): Promise<LocalSocket> => {
      const decoder = new FrameDecoder();
      const out: Uint8Array[] = [];
      let wake: (() => void) | undefined;
      let closed = false;
      const reply = (m: Parameters<typeof encodeFrame>[0]) => {
        out.push(encodeFrame(m));
        wake?.();
      };
      return Promise.resolve({
        write(bytes) {
          const t0 = performance.now();
          for (const m of decoder.push(bytes) as unknown as ClientMessage[]) {
            if (m.t === "hello") reply({ t: "welcome", version: m.version, instance: "bench", ...(timings ? { timings: true } : {}) });
            else if (m.t === "open") {
              const end = m.endStep ?? Infinity;
              ring.open(m.startStep, end);
              const l = ring.layout;
              reply({ t: "ring", path: "/bench", slots: l.slots, slotBytes: l.slotBytes, dataOffset: l.dataOffset, fileBytes: l.fileBytes, dtype: "uint16", rows: ROWS, cols: COLS, endStep: end });
              // Every step before `end` is published before the client could ask for more.
              reply({ t: "end", step: end });
            } else if (m.t === "release") ring.release(m.generation);
            else if (m.t === "wait") ring.waits++;
            else if (m.t === "timings") ring.timed += decodeTimings(m as unknown as Record<string, unknown>).count;
          }
          ring.serverMs += performance.now() - t0;
        },
        async read() {
          while (out.length === 0 && !closed) await new Promise<void>((r) => (wake = r));
          return out.shift() ?? null;
        },
        close() {
          closed = true;
          wake?.();
        },
      });
    },
  };
}

/** What a trainer does with each batch here: touch one byte per page, as bench/shm/client.ts does. */
function touch(tokens: ArrayBufferView): number {
  const v = new Uint8Array(tokens.buffer, tokens.byteOffset, tokens.byteLength);
  let x = 0;
  for (let i = 0; i < v.length; i += 4096) x ^= v[i];
  return x;
}

/** What a run did: batches read, and ms the in-process server spent on them (not the client's cost). */
interface Run {
  batches: number;
  serverMs: number;
}

/** µs of this process's CPU (user + system) and of the wall clock per batch of `run`, the stand-in server's time taken off. */
async function measure(run: () => Promise<Run>): Promise<{ cpuUs: number; wallUs: number; serverUs: number }> {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  const r = await run();
  const wallMs = performance.now() - t0;
  const c = process.cpuUsage(c0);
  const perBatch = (ms: number) => (ms * 1000) / r.batches;
  return { cpuUs: perBatch((c.user + c.system) / 1000 - r.serverMs), wallUs: perBatch(wallMs - r.serverMs), serverUs: perBatch(r.serverMs) };
}

/** The floor: per batch, its slot's generation read and checked, a view of its tokens, pages touched, the slot published again. */
async function floor(): Promise<Run> {
  const ring = new EagerRing(SLOTS);
  ring.open(0, BATCHES);
  const v = new DataView(ring.bytes.buffer);
  const l = ring.layout;
  let x = 0;
  for (let step = 0; step < BATCHES; step++) {
    const { slot, generation } = slotOfStep(step, 0, l.slots);
    if (v.getFloat64(slotHeaderOffset(slot), true) !== generation) throw new Error(`floor: slot ${slot} not published`);
    const at = l.dataOffset + slot * l.slotBytes;
    x ^= touch(new Uint16Array(ring.bytes.buffer, at, BATCH_BYTES / 2));
    ring.release(generation);
    // A trainer's loop awaits its next batch: one microtask, as the cheapest `await` costs.
    if ((step & 63) === 0) await Promise.resolve();
  }
  if (x === 256) console.log("unreachable");
  return { batches: BATCHES, serverMs: 0 };
}

async function protocolOnly(): Promise<Run> {
  const ring = new EagerRing(SLOTS);
  let n = 0;
  let x = 0;
  const it = shmBatches(eagerTransport(ring), "/bench", "bench", undefined, { dataset: "d", rank: 0, world: 1, microBatch: ROWS, startStep: 0, endStep: BATCHES, slots: SLOTS });
  for await (const b of it) {
    if (b.step !== n) throw new Error(`protocol: step ${b.step}, expected ${n}`);
    x ^= touch(b.bytes);
    n++;
  }
  if (ring.waits !== 0) throw new Error(`protocol: the client waited ${ring.waits} times on an eager ring`);
  if (x === 256) console.log("unreachable");
  return { batches: n, serverMs: ring.serverMs };
}

/**
 * The SDK as a trainer runs it. `/v1/shm` is answered in this process (it leads to the stand-in's
 * ring); the telemetry reports go to `reportsTo`, a real rackfeed server, through the runtime's
 * own fetch (what a trainer pays), or, without it, to a stand-in in this process that parses them
 * as the server would (the SDK's own cost, no network).
 */
async function wholeSdk(reportsTo: string | undefined, timingsOnSocket = false): Promise<Run> {
  const ring = new EagerRing(SLOTS);
  let reported = 0;
  let fetchMs = 0;
  const realFetch = reportsTo === undefined ? undefined : await runtimeFetch();
  const fetchHere = (async (input: RequestInfo | URL, init?: RequestInit) => {
    const path = new URL(String(input)).pathname;
    if (path === "/v1/shm") return Response.json({ socket: "/bench", instance: "bench" });
    if (path !== "/v1/telemetry") return new Response("not here", { status: 404 });
    const t0 = performance.now();
    reported += JSON.parse(String(init?.body)).steps.length;
    fetchMs += performance.now() - t0;
    return realFetch ? await realFetch(input, init) : new Response(null, { status: 204 });
  }) as typeof fetch;
  const url = reportsTo ?? "http://bench.invalid";
  const c = new RackfeedClient({ url, fetch: fetchHere, local: eagerTransport(ring, timingsOnSocket) });
  let n = 0;
  let x = 0;
  for await (const b of c.batches(DATASET, { rank: 0, world: 1, microBatch: ROWS, endStep: BATCHES, prefetch: SLOTS - 1 })) {
    if (b.step !== n || b.transport !== "shm") throw new Error(`sdk: step ${b.step} over ${b.transport}, expected ${n} over shm`);
    x ^= touch(b.tokens);
    n++;
  }
  await c.close();
  if (ring.waits !== 0) throw new Error(`sdk: the client waited ${ring.waits} times on an eager ring`);
  if (reported + ring.timed !== n) throw new Error(`sdk: ${reported} steps reported over HTTP and ${ring.timed} on the socket, of ${n}`);
  if (x === 256) console.log("unreachable");
  // The parse of a report here is the bench's count (or the stand-in server's work), not the client's.
  return { batches: n, serverMs: ring.serverMs + fetchMs };
}

/** The fetch a trainer's SDK uses on this runtime (`createClient`'s default): undici on Node, Deno's own. */
async function runtimeFetch(): Promise<typeof fetch> {
  if ("Deno" in globalThis) return globalThis.fetch.bind(globalThis);
  const { http2Fetch } = await import("../../src/client/node.ts");
  return http2Fetch();
}

/** Starts the embedded demo server (its token dataset takes the reports) on a free port; its URL and a stop function. */
async function startDemoServer(): Promise<{ url: string; stop: () => void }> {
  const root = join(import.meta.dirname ?? ".", "../..");
  const dir = mkdtempSync(join(tmpdir(), "client-cost-demo-"));
  const child = spawn(process.execPath, [...("Deno" in globalThis ? ["run", "-A", "src/main.ts"] : ["--import", "tsx", "src/main.node.ts"]), "demo", "--listen", "127.0.0.1:0", "--shm-dir", "off", "--cache-dir", join(dir, "cache")], {
    cwd: root,
    stdio: ["ignore", "pipe", "inherit"],
  });
  const stop = () => {
    child.kill();
    rmSync(dir, { recursive: true, force: true });
  };
  // Its output is read to the end (a pipe left unread would fail its later writes with EPIPE).
  let out = "";
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on("data", (chunk) => {
      if (out.length > 100_000) return;
      out += String(chunk);
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) resolve(m[1]);
    });
    child.on("exit", (code) => reject(new Error(`The demo server exited (${code}) before it listened: ${out}`)));
  }).catch((e) => {
    stop();
    throw e;
  });
  return { url, stop };
}

/** numpy's µs per batch over the uint16 dataset of warm-batches.ts, or undefined without it. */
function numpyUs(): number | undefined {
  const out = join(import.meta.dirname ?? ".", "../.out/datasets");
  const bin = join(out, "data/u16.bin");
  const plan = join(out, "u16.plan");
  if (!existsSync(bin) || !existsSync(plan)) return undefined;
  const dir = mkdtempSync(join(tmpdir(), "client-cost-"));
  try {
    const json = join(dir, "numpy.json");
    const p = spawnSync("/usr/bin/python3", [join(import.meta.dirname ?? ".", "../datasets/numpy_gather.py"), bin, "uint16", plan, "1500", String(ROWS), String(COLS), "2", json], { stdio: "ignore", timeout: 120_000 });
    if (p.status !== 0) return undefined;
    const j = JSON.parse(readFileSync(json, "utf8"));
    return (j.seconds * 1e6) / j.batches;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

const runtime = "Deno" in globalThis ? "deno" : "node";
console.log(`client-cost: ${runtime}, ${BATCHES} batches of ${ROWS}×${COLS} uint16 per row, ring of ${SLOTS}, ${REPS} reps, ${new Date().toISOString()}`);
const demo = await startDemoServer();
const rows: [string, () => Promise<Run>][] = [
  ["floor (generation, view, touch, publish)", floor],
  ["shmBatches (the ring protocol)", protocolOnly],
  ["SDK batches(), timings on the shm socket (what rackfeed's server offers)", () => wholeSdk(undefined, true)],
  ["SDK batches(), reports parsed in-process", () => wholeSdk(undefined)],
  ["SDK batches(), reports to a real server", () => wholeSdk(demo.url)],
];
for (const [, run] of rows) await run(); // JIT warm-up, untimed
for (let rep = 0; rep < REPS && Date.now() < DEADLINE; rep++) {
  const np = numpyUs();
  if (np !== undefined) console.log(`numpy memmap gather (baseline)            ${np.toFixed(2).padStart(7)} µs/batch`);
  for (const [name, run] of rows) {
    const m = await measure(run);
    const vsNumpy = np === undefined ? "" : `   bound ${(np / m.cpuUs).toFixed(1)}× numpy`;
    console.log(`${name.padEnd(42)}${m.cpuUs.toFixed(2).padStart(7)} µs CPU/batch  ${m.wallUs.toFixed(2).padStart(6)} µs wall/batch${vsNumpy}   (stand-in server ${m.serverUs.toFixed(2)} µs, taken off)`);
  }
}
demo.stop();
