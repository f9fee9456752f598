/**
 * @module Benchmark 1 of issue 4: warm batches/s and p50/p99 latency over HTTP/1.1, micro_batch 8 ×
 * seq_length 4096, uint16 and int32, rackfeed on Deno and on Node, beside a numpy memmap gather of
 * exactly the same windows from the local files (/usr/bin/python3 + Debian python3-numpy).
 *
 * Run from the repo root:   node --import tsx bench/datasets/warm-batches.ts
 * Knobs (environment): BENCH_STEPS=1500 (steps per pass = batches), BENCH_PASSES=2 (timed passes
 *   per measurement), BENCH_REPS=3 (interleaved repetitions), BENCH_CONCURRENCY=4 (second load level),
 *   BENCH_EXTRA_FLAGS="" (more serve flags for both servers, e.g. "--read-ahead-seconds 0"),
 *   BENCH_PYTHON=/usr/bin/python3 (the python with numpy that runs the baseline), BENCH_HTTP=0 (no
 *   HTTP rows: the shm rows of the aim alone, e.g. with many passes; every body is still checked).
 *
 * Per dataset: the plan (`(byteOffset, tokens)` pieces of every sample, from buildTokenDataset on
 * the same .idx and registration the server gets) is written for numpy. An untimed warm pass
 * fetches every batch once (filling rackfeed's memory tier; the memory budget is 2 GiB, larger
 * than both .bin files) and checks each body's sha256 against numpy's batch: any difference
 * aborts. Timed passes then request the same steps in order over keep-alive HTTP/1.1 (node:http,
 * 1 or BENCH_CONCURRENCY requests in flight); every timed answer must say x-rackfeed-cache: hit.
 * Latency = request written → last body byte read, at the client. Over shm (bench/shm/client.ts,
 * the SDK with prefetch 3, which the server deepens to a 4 MiB ring for these 64 KiB batches;
 * Deno and Node clients both map the ring and poll its slot headers), latency is t_wait: how
 * long the trainer's `next()` blocked; every batch's sha256 is checked against numpy's.
 * A second line beside the baseline, "one copy alone", is the limit of rackfeed's design here:
 * the same pieces copied once each, memory to memory, in this process (see `copyRun`); the shm
 * path pays that copy plus planning and its transport; "one copy alone, memcpy" is the same copy
 * through the native gather the servers use by default (one call per batch). "One copy on N threads" spreads that copy
 * over worker threads fed step by step by a dispatcher (bench/datasets/parallel-copy.ts): how far
 * a server whose gather runs on several threads could go.
 */

import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { Agent } from "node:http";
import { availableParallelism } from "node:os";
import { join } from "node:path";
import { buildTokenDataset, parseDatasetConfig, parseIndex, PIECE_STRIDE } from "../../src/dataset/mod.ts";
import { type ChildServer, DENO, NODE, NODE_TS, startChild } from "../../test/helpers/spawn.ts";
import { runShmClient } from "../shm/run-client.ts";
import { parallelCopyRun } from "./parallel-copy.ts";
import { loadNodePieceCopier } from "../../src/runtime/native-gather-node.ts";
import {
  type BenchDataset,
  DATASETS,
  ensureDataset,
  fmt,
  httpGet,
  MICRO_BATCH,
  OUT,
  pct,
  registration,
  ROOT,
  SEQ_LENGTH,
  sortedCopy,
  table,
} from "./common.ts";

// Node servers started here run with libuv's pool as `npm start` sizes it (the native gather's threads).
process.env.UV_THREADPOOL_SIZE ??= "64";
const STEPS = Number(process.env.BENCH_STEPS ?? 1500);
const PASSES = Number(process.env.BENCH_PASSES ?? 2);
const WITH_HTTP = process.env.BENCH_HTTP !== "0";
const REPS = Number(process.env.BENCH_REPS ?? 3);
const CONC = Number(process.env.BENCH_CONCURRENCY ?? 4);
/** Threads of the "one copy on N threads" rows: 2, 4 and 8, those the machine has cores for. */
const COPY_THREADS = [2, 4, 8].filter((n) => n <= Math.max(2, availableParallelism() - 1));
const ADMIN = "bench-admin";
const DATA = join(OUT, "data");
const DEADLINE = Date.now() + 20 * 60_000; // every loop below is bounded by count; this bounds the whole run

interface Result {
  batchesPerS: number;
  lat: Float64Array; // seconds, sorted
  misses: number;
  /** CPU time of the server's main thread (its event loop) per batch served, µs; the bound of a host whose other cores are free. */
  serverUs?: number;
}

/** CPU time so far of a process's main thread (its event loop), in ns: /proc's schedstat, exact to the ns. */
function mainThreadNs(pid: number): number {
  return Number(readFileSync(`/proc/${pid}/task/${pid}/schedstat`, "utf8").split(" ")[0]);
}

/** Runs `fn`, adding to its result the server's event-loop CPU per batch (`served`: batches the server sent meanwhile). */
async function withServerCpu(server: ChildServer, served: (r: Result) => number, fn: () => Promise<Result> | Result): Promise<Result> {
  const pid = server.proc.pid!;
  const before = mainThreadNs(pid);
  const r = await fn();
  return { ...r, serverUs: (mainThreadNs(pid) - before) / 1000 / served(r) };
}

function writePlan(ds: BenchDataset, prefix: string): { plan: string; window: number } {
  const idx = readFileSync(`${prefix}.idx`);
  const index = parseIndex(idx, { path: `${prefix}.idx`, binSize: statSync(`${prefix}.bin`).size });
  const config = parseDatasetConfig(registration("bench", ds.name, STEPS * MICRO_BATCH));
  const dataset = buildTokenDataset(config, [index]);
  const pieces = new Float64Array(PIECE_STRIDE * dataset.maxPiecesPerSample);
  const out: number[] = [];
  for (let i = 0; i < STEPS * MICRO_BATCH; i++) {
    const n = dataset.planSample(i, pieces);
    out.push(n);
    for (let p = 0; p < n; p++) out.push(pieces[PIECE_STRIDE * p + 1], pieces[PIECE_STRIDE * p + 2]);
  }
  const plan = join(OUT, `${ds.name}.plan`);
  writeFileSync(plan, new Uint8Array(Float64Array.from(out).buffer));
  return { plan, window: dataset.windowLength };
}

function numpyRun(ds: BenchDataset, prefix: string, plan: string, window: number): { r: Result; hashes: string[]; version: string } {
  const out = join(OUT, `${ds.name}.numpy.json`);
  const p = spawnSync(process.env.BENCH_PYTHON ?? "/usr/bin/python3", [
    join(ROOT, "bench/datasets/numpy_gather.py"),
    `${prefix}.bin`,
    ds.numpyDtype,
    plan,
    String(STEPS),
    String(MICRO_BATCH),
    String(window),
    String(PASSES),
    out,
  ], { stdio: "inherit", timeout: 300_000 });
  if (p.status !== 0) throw new Error(`numpy_gather.py failed (${p.status ?? p.signal}); is python3-numpy installed?`);
  const j = JSON.parse(readFileSync(out, "utf8"));
  return { r: { batchesPerS: j.batches / j.seconds, lat: sortedCopy(j.latencies), misses: 0 }, hashes: j.hashes, version: j.numpy };
}

/**
 * The copy of the one-copy design alone, in JavaScript: the batches' pieces (the same plan numpy
 * gathers) copied, one `TypedArray.set` each, from the `.bin` held in this process's memory
 * (anonymous pages, as rackfeed's memory tier holds blocks) into a ring of 64 batch-sized slots
 * (as the shm server writes). No planning, no bookkeeping, no transport: what is left is the memory
 * system's cost of the copy every transport must make.
 */
function copyRun(ds: BenchDataset, prefix: string, plan: string, window: number): Result {
  return timeCopies(ds, prefix, plan, window, ({ bin, raw, ring, bodyBytes }) => (s, k) => {
    let at = (s % 64) * bodyBytes;
    for (let j = 0; j < MICRO_BATCH; j++) {
      const n = raw[k++];
      for (let p = 0; p < n; p++) {
        const from = raw[k++], len = raw[k++] * ds.itemSize;
        ring.set(bin.subarray(from, from + len), at);
        at += len;
      }
    }
    if (at !== (s % 64) * bodyBytes + bodyBytes) throw new Error(`copy alone: step ${s} gathered ${at - (s % 64) * bodyBytes} bytes, expected ${bodyBytes}`);
    return k;
  });
}

/** What a copy-alone run copies: the `.bin` in this process's memory, the plan's numbers, a ring of 64 batch-sized slots. */
interface CopyInput {
  readonly bin: Buffer;
  readonly raw: Float64Array;
  readonly ring: Uint8Array;
  readonly bodyBytes: number;
}

/**
 * Times a copy-alone run: the step copier `makeStep` returns copies step `s`, whose samples'
 * pieces start at `raw[k]`, into its slot and returns the index after them. One untimed pass
 * (pages of the copy in memory, code optimised), then PASSES timed ones.
 */
function timeCopies(ds: BenchDataset, prefix: string, plan: string, window: number, makeStep: (input: CopyInput) => (s: number, k: number) => number): Result {
  const bodyBytes = MICRO_BATCH * window * ds.itemSize;
  const input = { bin: readFileSync(`${prefix}.bin`), raw: new Float64Array(readFileSync(plan).buffer.slice(0)), ring: new Uint8Array(64 * bodyBytes), bodyBytes };
  const copyStep = makeStep(input);
  const lat = new Float64Array(STEPS * PASSES);
  const pass = (timed: number) => {
    for (let s = 0, k = 0; s < STEPS; s++) {
      const t0 = performance.now();
      k = copyStep(s, k);
      if (timed >= 0) lat[timed * STEPS + s] = (performance.now() - t0) / 1000;
    }
  };
  pass(-1);
  const t0 = performance.now();
  for (let p = 0; p < PASSES; p++) pass(p);
  const seconds = (performance.now() - t0) / 1000;
  return { batchesPerS: (STEPS * PASSES) / seconds, lat: lat.sort(), misses: 0 };
}

function batchUrl(base: string, name: string, step: number): URL {
  return new URL(`${base}/v1/datasets/${name}/batches/${step}?rank=0&world=1&micro_batch=${MICRO_BATCH}`);
}

async function warmAndCheck(base: string, name: string, hashes: string[], bodyBytes: number): Promise<void> {
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  try {
    for (let s = 0; s < STEPS; s++) {
      const r = await httpGet(agent, batchUrl(base, name, s));
      if (r.status !== 200 || r.body.length !== bodyBytes) throw new Error(`${base} ${name} step ${s}: HTTP ${r.status}, ${r.body.length} bytes`);
      const h = createHash("sha256").update(r.body).digest("hex");
      if (h !== hashes[s]) throw new Error(`${base} ${name} step ${s}: body differs from numpy's gather (sha256 ${h} vs ${hashes[s]})`);
    }
  } finally {
    agent.destroy();
  }
}

async function httpRun(base: string, name: string, conc: number, bodyBytes: number): Promise<Result> {
  const agent = new Agent({ keepAlive: true, maxSockets: conc });
  const lat: number[] = [];
  let misses = 0;
  const total = STEPS * PASSES;
  let next = 0;
  const t0 = performance.now();
  const worker = async () => {
    while (next < total && Date.now() < DEADLINE) {
      const s = next++ % STEPS;
      const a = performance.now();
      const r = await httpGet(agent, batchUrl(base, name, s));
      lat.push((performance.now() - a) / 1000);
      if (r.status !== 200 || r.body.length !== bodyBytes) throw new Error(`${name} step ${s}: HTTP ${r.status}, ${r.body.length} bytes`);
      if (r.cache !== "hit") misses++;
    }
  };
  await Promise.all(Array.from({ length: conc }, worker));
  const secs = (performance.now() - t0) / 1000;
  agent.destroy();
  return { batchesPerS: lat.length / secs, lat: sortedCopy(lat), misses };
}

/** The same steps over the shared-memory path, with a Deno (mapped ring) or Node (pread) SDK client; checks every batch's sha256 against numpy's. */
function shmRun(client: "deno" | "node", base: string, name: string, hashes: string[], serverPid: number): Result {
  const j = runShmClient(client, [base, name, String(MICRO_BATCH), String(STEPS), String(PASSES), "--hash", `--server-pid=${serverPid}`]);
  for (let s = 0; s < STEPS; s++) {
    if (j.hashes![s] !== hashes[s]) throw new Error(`${base} ${name} step ${s} over shm (${client} client) differs from numpy's gather`);
  }
  // The server's event loop over the timed passes alone (measured by the client, on this host).
  return { batchesPerS: j.batches / j.seconds, lat: sortedCopy(j.lat!), misses: 0, serverUs: j.serverNs! / 1000 / j.batches };
}

async function startServer(rt: "deno" | "node"): Promise<ChildServer> {
  const cache = join(OUT, `cache-${rt}`);
  rmSync(cache, { recursive: true, force: true });
  const flags = [
    "serve",
    "--listen",
    "127.0.0.1:0",
    "--origin",
    `bench=${DATA}`,
    "--cache-dir",
    cache,
    "--admin-token",
    ADMIN,
    "--memory-bytes",
    "2GiB",
    "--disk-bytes",
    "4GiB",
    ...(process.env.BENCH_EXTRA_FLAGS ?? "").split(" ").filter((f) => f !== ""),
  ];
  return rt === "deno"
    ? await startChild(DENO, ["run", "-A", join(ROOT, "src/main.ts"), ...flags])
    : await startChild(NODE, [...NODE_TS, join(ROOT, "src/main.node.ts"), ...flags]);
}

async function register(base: string, ds: BenchDataset): Promise<void> {
  const res = await fetch(`${base}/v1/datasets/${ds.name}`, {
    method: "PUT",
    headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
    body: JSON.stringify(registration("bench", ds.name, STEPS * MICRO_BATCH)),
  });
  if (res.status !== 201) throw new Error(`register ${ds.name}: HTTP ${res.status} ${await res.text()}`);
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor((s.length - 1) / 2)];
}

/**
 * "One copy alone" with the native gather (`native/gather.c`, as the servers copy by default): the
 * same pieces, listed per step as the server lists them (address, bytes, offset) and copied by one
 * memcpy call per batch on this thread. Undefined where the library is not built.
 */
function nativeCopyRun(ds: BenchDataset, prefix: string, plan: string, window: number): Result | undefined {
  const copier = loadNodePieceCopier();
  if (!copier) return undefined;
  const pieces = new Float64Array(3 * 4096);
  return timeCopies(ds, prefix, plan, window, ({ bin, raw, ring, bodyBytes }) => {
    const base = copier.address(bin);
    return (s, k) => {
      let n = 0;
      let at = 0;
      for (let j = 0; j < MICRO_BATCH; j++) {
        const count = raw[k++];
        for (let p = 0; p < count; p++, n++) {
          const len = raw[k + 1] * ds.itemSize;
          pieces[3 * n] = base + raw[k];
          pieces[3 * n + 1] = len;
          pieces[3 * n + 2] = at;
          at += len;
          k += 2;
        }
      }
      const slot = ring.subarray((s % 64) * bodyBytes, (s % 64 + 1) * bodyBytes);
      if (at !== bodyBytes || copier.copy(slot, pieces, 0, n) !== bodyBytes) throw new Error(`native copy alone: step ${s} gathered a wrong number of bytes`);
      return k;
    };
  });
}

async function main(): Promise<void> {
  mkdirSync(OUT, { recursive: true });
  const prefixes = new Map<string, string>();
  const plans = new Map<string, { plan: string; window: number }>();
  for (const ds of DATASETS) {
    const prefix = ensureDataset(DATA, ds);
    prefixes.set(ds.name, prefix);
    plans.set(ds.name, writePlan(ds, prefix));
  }
  const servers = { deno: await startServer("deno"), node: await startServer("node") };
  const results = new Map<string, Result[]>(); // key: dataset/target
  const push = (k: string, r: Result) => (results.get(k) ?? results.set(k, []).get(k)!).push(r);
  let numpyVersion = "";
  try {
    for (const [, s] of Object.entries(servers)) for (const ds of DATASETS) await register(s.url, ds);
    for (let rep = 0; rep < REPS && Date.now() < DEADLINE; rep++) {
      for (const ds of DATASETS) {
        const prefix = prefixes.get(ds.name)!;
        const { plan, window } = plans.get(ds.name)!;
        const bodyBytes = MICRO_BATCH * window * ds.itemSize;
        const np = numpyRun(ds, prefix, plan, window);
        numpyVersion = np.version;
        push(`${ds.name}/numpy`, np.r);
        push(`${ds.name}/copy`, copyRun(ds, prefix, plan, window));
        const native = nativeCopyRun(ds, prefix, plan, window);
        if (native) push(`${ds.name}/copy native`, native);
        const raw = new Float64Array(readFileSync(plan).buffer.slice(0));
        for (const threads of COPY_THREADS) {
          const rate = await parallelCopyRun(`${prefix}.bin`, raw, { steps: STEPS, passes: PASSES, microBatch: MICRO_BATCH, bodyBytes, itemSize: ds.itemSize, threads });
          push(`${ds.name}/copy ${threads}`, { batchesPerS: rate, lat: new Float64Array([NaN]), misses: 0 });
        }
        for (const rt of ["deno", "node"] as const) {
          const base = servers[rt].url;
          if (rep === 0) await warmAndCheck(base, ds.name, np.hashes, bodyBytes);
          // The HTTP runs ask for STEPS × PASSES batches (an shm client measures its timed passes itself).
          const http = (r: Result) => r.lat.length;
          if (WITH_HTTP) {
            push(`${ds.name}/${rt} c=1`, await withServerCpu(servers[rt], http, () => httpRun(base, ds.name, 1, bodyBytes)));
            push(`${ds.name}/${rt} c=${CONC}`, await withServerCpu(servers[rt], http, () => httpRun(base, ds.name, CONC, bodyBytes)));
          }
          for (const client of ["deno", "node"] as const) {
            push(`${ds.name}/${rt} shm ${client}`, shmRun(client, base, ds.name, np.hashes, servers[rt].proc.pid!));
          }
        }
        process.stderr.write(`rep ${rep} ${ds.name} done\n`);
      }
    }
    for (const rt of ["deno", "node"] as const) {
      process.stderr.write(`${rt} server RSS after the run: ${(servers[rt].rss() / 2 ** 20).toFixed(0)} MiB\n`);
    }
  } finally {
    await servers.deno.stop();
    await servers.node.stop();
  }

  const rows: string[][] = [];
  for (const ds of DATASETS) {
    const base = results.get(`${ds.name}/numpy`)!;
    const baseRate = median(base.map((r) => r.batchesPerS));
    for (const target of ["numpy", "copy", "copy native", ...COPY_THREADS.map((n) => `copy ${n}`), "deno c=1", "node c=1", `deno c=${CONC}`, `node c=${CONC}`, "deno shm deno", "deno shm node", "node shm deno", "node shm node"]) {
      const rs = results.get(`${ds.name}/${target}`);
      if (!rs) continue; // the native copy where the library is not built
      const rates = rs.map((r) => r.batchesPerS);
      const rate = median(rates);
      const mbps = (rate * MICRO_BATCH * (SEQ_LENGTH + 1) * ds.itemSize) / 1e6;
      rows.push([
        ds.name === "u16" ? "uint16" : "int32",
        target === "numpy"
          ? "numpy memmap gather (baseline)"
          : target === "copy"
          ? "one copy alone (JavaScript `set` per piece): the pieces, memory to memory, in process"
          : target === "copy native"
          ? "one copy alone, memcpy through the native gather (native/gather.c), one call per batch"
          : target.startsWith("copy ")
          ? `one copy (JavaScript) on ${target.slice(5)} threads, a dispatcher handing out steps (bench/datasets/parallel-copy.ts)`
          : target.includes("shm") ? `rackfeed ${target.replace(/ shm (\w+)/, " server, shm, $1 client")}` : `rackfeed ${target}`,
        `${fmt(rate, 0)} (${fmt(Math.min(...rates), 0)}–${fmt(Math.max(...rates), 0)})`,
        fmt(mbps, 0),
        fmt(median(rs.map((r) => pct(r.lat, 50) * 1000)), 3),
        fmt(median(rs.map((r) => pct(r.lat, 99) * 1000)), 3),
        target === "numpy" ? "1.00" : fmt(rate / baseRate, 2),
        String(rs.reduce((a, r) => a + r.misses, 0)),
        rs[0].serverUs === undefined ? "–" : fmt(median(rs.map((r) => r.serverUs!)), 1),
        rs[0].serverUs === undefined ? "–" : fmt(1e6 / median(rs.map((r) => r.serverUs!)) / baseRate, 2),
      ]);
    }
  }
  console.log(
    `warm batches: micro_batch ${MICRO_BATCH} × window ${SEQ_LENGTH + 1} tokens, ${STEPS} steps × ${PASSES} passes per measurement, ` +
      `median of ${REPS} reps (min–max); numpy ${numpyVersion}; bodies sha256-equal to numpy's for all ${STEPS} steps on both runtimes`,
  );
  console.log(
    table(["dtype", "target", "batches/s", "MB/s", "p50 ms", "p99 ms", "× numpy", "non-hit answers", "server event loop µs/batch", "its bound × numpy"], rows),
  );
  console.log(
    "server event loop µs/batch: CPU time of the server's main thread per batch it served (/proc schedstat), whatever else ran on the other cores " +
      "(shm rows: over the timed passes alone, read by the client; until session 23 the client's untimed, hashing pass and its start were counted too); " +
      "its bound × numpy: the rate that time allows (1 / it), over numpy's: what the server could reach where the client, the copy threads and numpy's own core do not share its core",
  );
}

await main();
process.exit(0);
