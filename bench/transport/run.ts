// bench/transport: warm 1 MiB and 8 MiB bodies over HTTP/1.1 and HTTP/2 (h2c) from rackfeed on
// Deno and Node, and over the shared-memory ring, beside ceilings measured in the same run:
// single-thread memcpy of the batch size, cache-hot (the physical limit of a copy) and from
// memory (pieces of a region far larger than the caches: the bandwidth a copy out of a large
// memory tier meets), and rackfeed's own batch assembly in this process with no transport (the
// gather every transport pays); the cost of a new ring's first write to each page (paid once per
// ring); and p50/p99 latency of a token batch (micro_batch 8 × 4097 uint16
// tokens) per transport. Each shm row's throughput is one consumer iterating the whole timed run
// (STEPS × PASSES batches), as a trainer does; the cost of starting a consumer (its ring made and
// mapped, its first batch filled) is its own column. Rings live in a fresh directory under /dev/shm (tmpfs), as deployed.
// Client: node:http (keep-alive) and node:http2, 4 requests in flight, bounded by time.
//
// Run: bash bench/transport/run.sh (installs wrk, h2load) or node --import tsx bench/transport/run.ts
// Knobs: BENCH_SECONDS=3, BENCH_PASSES=8, BENCH_ARGS (extra serve flags for both servers),
// BENCH_TLS=1 (also HTTP/1.1 and HTTP/2 over TLS, ALPN; no latency column for those rows)

import * as http from "node:http";
import * as http2 from "node:http2";
import { mkdtempSync, rmSync, truncateSync, unlinkSync, writeFileSync } from "node:fs";
import { loadNodeMapping } from "../../src/runtime/libc-node.ts";
import { execFileSync } from "node:child_process";
import { makeWorkspace } from "../../test/helpers/rackfeed.ts";
import { assemblyGBs } from "../shm/assembly-ceiling.ts";
import { runShmClient } from "../shm/run-client.ts";
import { writeTransportDataset } from "../shm/transport-dataset.ts";
import { DENO, NODE, NODE_TS, ROOT, startChild } from "../../test/helpers/spawn.ts";

// Node servers started here run with libuv's pool as `npm start` sizes it (the native gather's threads).
process.env.UV_THREADPOOL_SIZE ??= "64";
const SECONDS = Number(process.env.BENCH_SECONDS ?? 3);
const INFLIGHT = 4;
const PASSES = Number(process.env.BENCH_PASSES ?? 8);
/** Micro-batches of the 1 MiB and 8 MiB rows, and how many distinct steps each cycles over. */
const SIZES = [{ mb: 128, steps: 150 }, { mb: 1024, steps: 18 }] as const;
const LAT_MB = 8;
/** Extra `serve` flags for both servers, e.g. BENCH_ARGS="--batch-pool-bytes 0" for an A/B run. */
const EXTRA_ARGS = (process.env.BENCH_ARGS ?? "").split(/\s+/).filter(Boolean);

/** GB/s of wrk (HTTP/1.1, 4 connections) over the given paths. */
function wrkGBs(url: string, paths: string[], dir: string): number {
  const lua = `${dir}/paths.lua`;
  writeFileSync(lua, `local paths = {${paths.map((p) => JSON.stringify(p)).join(",")}}\nlocal i = 0\nrequest = function()\n  i = i % #paths + 1\n  return wrk.format("GET", paths[i])\nend\n`);
  const out = execFileSync("wrk", ["-t1", "-c4", `-d${SECONDS}s`, "-s", lua, url], { encoding: "utf8" });
  return parseWrkBytes(out);
}

/** GB/s of h2load (h2c prior knowledge, 1 connection, 4 streams) over the given paths. */
function h2loadGBs(url: string, paths: string[], dir: string): number {
  return h2load(url, paths, dir, []);
}

/**
 * The same, from a client that allows DATA frames of up to 1 MiB (SETTINGS_MAX_FRAME_SIZE; h2load,
 * curl, Deno's fetch and undici allow 16 KiB, the protocol's default). Deno's server sends frames
 * as large as the client allows; Node's sends 16 KiB frames whatever it allows.
 */
function h2loadBigFramesGBs(url: string, paths: string[], dir: string): number {
  return h2load(url, paths, dir, ["-f", String(2 ** 20)]);
}

function h2load(url: string, paths: string[], dir: string, extra: string[]): number {
  const list = `${dir}/paths.txt`;
  writeFileSync(list, paths.map((p) => `${url}${p}`).join("\n") + "\n");
  const out = execFileSync("h2load", ["-c1", "-m4", "-D", String(SECONDS), ...extra, "-i", list], { encoding: "utf8" });
  const m = /finished in [\d.]+m?s, [\d.]+ req\/s, ([\d.]+)([KMG]?B)\/s/.exec(out);
  const r = /(\d+) succeeded, (\d+) failed, (\d+) errored/.exec(out);
  if (!m || !r || r[2] !== "0" || r[3] !== "0" || r[1] === "0") throw new Error(`h2load failed or errored:\n${out}`);
  return gigabytes(m[1], m[2]);
}

/** GB (1e9) in a load generator's "12.3MB" (binary units). */
function gigabytes(value: string, unit: string): number {
  return (Number(value) * { B: 1, KB: 1024, MB: 1024 ** 2, GB: 1024 ** 3 }[unit as "B"]) / 1e9;
}

function parseWrkBytes(out: string): number {
  const m = /Transfer\/sec:\s+([\d.]+)([KMG]?B)/.exec(out);
  if (!m || /Non-2xx|Socket errors/.test(out)) throw new Error(`wrk failed or saw errors:\n${out}`);
  return gigabytes(m[1], m[2]);
}

/**
 * GB/s of copying `bytes`-sized pieces that are not in any cache: consecutive pieces of a 512 MiB
 * region (far beyond the last-level cache) into one reused destination, for a second. The memory
 * bandwidth a copy of batch bytes from a large memory tier meets, beside the cache-hot figure.
 */
function memcpyFromMemoryGBs(bytes: number): number {
  const region = Buffer.alloc(512 * 2 ** 20, 1);
  const dst = Buffer.alloc(bytes);
  const pieces = Math.floor(region.length / bytes);
  let n = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < 1000) {
    const at = (n++ % pieces) * bytes;
    region.copy(dst, 0, at, at + bytes);
  }
  return (n * bytes) / ((performance.now() - t0) / 1000) / 1e9;
}

function memcpyGBs(bytes: number): number {
  const a = Buffer.alloc(bytes, 1);
  const b = Buffer.alloc(bytes);
  let n = 0;
  const t0 = performance.now();
  while (performance.now() - t0 < 1000) {
    a.copy(b);
    n++;
  }
  return (n * bytes) / ((performance.now() - t0) / 1000) / 1e9;
}

/**
 * GB/s of the first write to every page of a new 32 MiB ring file in `dir` (tmpfs), mapped as the
 * server maps rings: what each new ring costs once (page allocation and zeroing), against which
 * the later writes to the same pages are free. Median of 3 rings.
 */
function firstTouchGBs(dir: string): number {
  const map = loadNodeMapping();
  if (!map) return NaN;
  const bytes = 32 * 2 ** 20;
  const runs: number[] = [];
  for (let r = 0; r < 3; r++) {
    const path = `${dir}/first-touch-${r}`;
    writeFileSync(path, "");
    truncateSync(path, bytes);
    const m = map(path, bytes, true);
    try {
      const t0 = performance.now();
      for (let i = 0; i < bytes; i += 4096) m.bytes[i] = 1;
      runs.push(bytes / ((performance.now() - t0) / 1000) / 1e9);
    } finally {
      m.unmap();
      unlinkSync(path);
    }
  }
  return runs.sort((a, b) => a - b)[1];
}

type Get = (path: string) => Promise<number>;

function h1Getter(url: string): { get: Get; close: () => void } {
  const agent = new http.Agent({ keepAlive: true, maxSockets: INFLIGHT });
  const u = new URL(url);
  const get: Get = (path) =>
    new Promise((resolve, reject) => {
      http.get({ host: u.hostname, port: u.port, path, agent }, (res) => {
        let n = 0;
        res.on("data", (d: Buffer) => (n += d.length));
        res.on("end", () => resolve(n));
        res.on("error", reject);
      }).on("error", reject);
    });
  return { get, close: () => agent.destroy() };
}

function h2Getter(url: string): { get: Get; close: () => void } {
  const session = http2.connect(url, { settings: { initialWindowSize: 16 * 2 ** 20 } });
  session.on("error", () => {}); // surfaced by the requests
  session.once("connect", () => session.setLocalWindowSize(64 * 2 ** 20));
  const get: Get = (path) =>
    new Promise((resolve, reject) => {
      const req = session.request({ ":path": path });
      let n = 0;
      req.on("data", (d: Buffer) => (n += d.length));
      req.on("end", () => resolve(n));
      req.on("error", reject);
      req.end();
    });
  return { get, close: () => session.close() };
}

async function latency(get: Get, path: (i: number) => string): Promise<[number, number]> {
  const lat: number[] = [];
  const t0 = performance.now();
  for (let i = 0; performance.now() - t0 < SECONDS * 1000 && i < 5000; i++) {
    const t = performance.now();
    await get(path(i % 200));
    lat.push(performance.now() - t);
  }
  lat.sort((a, b) => a - b);
  return [lat[Math.floor(lat.length / 2)], lat[Math.floor(lat.length * 0.99)]];
}

const ws = await makeWorkspace();
/** BENCH_TLS=1: also HTTP/1.1 and HTTP/2 over TLS (a self-signed certificate made here). */
const TLS = process.env.BENCH_TLS === "1"
  ? (() => {
    const cert = `${ws.dir}/cert.pem`;
    const key = `${ws.dir}/key.pem`;
    execFileSync("openssl", ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert, "-days", "1", "-subj", "/CN=127.0.0.1",
      "-addext", "subjectAltName=IP:127.0.0.1", "-addext", "basicConstraints=critical,CA:FALSE"], { stdio: "ignore" });
    return { cert, key };
  })()
  : undefined;
// Rings live where a deployment keeps them (tmpfs, the default /dev/shm), not in the workspace,
// which may sit on a disk-backed /tmp.
const shmRoot = mkdtempSync("/dev/shm/rackfeed-bench-");
try {
  await writeTransportDataset(ws);
  const memcpy1 = memcpyGBs(128 * 4097 * 2);
  const memcpy8 = memcpyGBs(1024 * 4097 * 2);
  console.log(`memcpy (one thread, this process): 1 MiB ${memcpy1.toFixed(2)} GB/s, 8 MiB ${memcpy8.toFixed(2)} GB/s`);
  const fromMemory1 = memcpyFromMemoryGBs(128 * 4097 * 2);
  const fromMemory8 = memcpyFromMemoryGBs(1024 * 4097 * 2);
  console.log(`memcpy from memory (one thread; pieces of a 512 MiB region, not in any cache): 1 MiB ${fromMemory1.toFixed(2)} GB/s, 8 MiB ${fromMemory8.toFixed(2)} GB/s`);
  console.log(`first write to the pages of a new 32 MiB ring file (tmpfs, once per ring): ${firstTouchGBs(shmRoot).toFixed(2)} GB/s`);
  const serveFlags = (dir: string) => ["--origin", `data=${ws.origin}`, "--cache-dir", dir, "--dataset", `d=${ws.dir}/d.json`, "--read-ahead-seconds", "0"];
  // The ceiling of every transport below: the same batches assembled in this process, no transport.
  const asm: number[] = [];
  for (const { mb, steps } of SIZES) asm.push(await assemblyGBs([...serveFlags(`${ws.dir}/c-asm`), ...EXTRA_ARGS], "d", mb, steps, 2));
  const [asm1, asm8] = asm;
  console.log(`batch assembly alone (plan + gather copy from memory-tier blocks into a reused buffer, one thread, this process): 1 MiB ${asm1.toFixed(2)} GB/s, 8 MiB ${asm8.toFixed(2)} GB/s`);
  console.log(`\n| server | transport | 1 MiB batches GB/s | vs memcpy | vs memcpy from memory | vs assembly | 8 MiB batches GB/s | vs memcpy | vs memcpy from memory | vs assembly | batch 8×4097 u16 p50 ms | p99 ms | new consumer's first batch ms, 1 / 8 MiB |`);
  console.log(`|---|---|---|---|---|---|---|---|---|---|---|---|---|`);
  const ratio = (a: number, b: number) => `${(a / b).toFixed(2)}×`;
  const opt = (x: number | undefined, digits: number) => (x === undefined || Number.isNaN(x) ? "–" : x.toFixed(digits));
  const row = (name: string, t: string, g1: number, g8: number, p50: number, p99: number, first?: [number, number]) =>
    console.log(`| ${name} | ${t} | ${g1.toFixed(2)} | ${ratio(g1, memcpy1)} | ${ratio(g1, fromMemory1)} | ${ratio(g1, asm1)} | ${g8.toFixed(2)} | ${ratio(g8, memcpy8)} | ${ratio(g8, fromMemory8)} | ${ratio(g8, asm8)} | ${opt(p50, 3)} | ${opt(p99, 3)} | ${first ? `${opt(first[0], 1)} / ${opt(first[1], 1)}` : "–"} |`);
  for (const [name, cmd, pre] of [
    ["deno", DENO, ["run", "-A", `${ROOT}src/main.ts`]],
    ["node", NODE, [...NODE_TS, `${ROOT}src/main.node.ts`]],
  ] as const) {
    const server = await startChild(cmd, [...pre, "serve", "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`,
      "--cache-dir", `${ws.dir}/c-${name}`, "--dataset", `d=${ws.dir}/d.json`, "--read-ahead-seconds", "0",
      "--shm-dir", shmRoot, ...EXTRA_ARGS]);
    try {
      const batchPath = (mb: number, steps: number) => (i: number) => `/v1/datasets/d/batches/${i % steps}?rank=0&world=1&micro_batch=${mb}`;
      for (const [tname, make] of [["HTTP/1.1", h1Getter], ["HTTP/2 (h2c)", h2Getter]] as const) {
        const warm = make(server.url);
        try {
          // Warm: every batch's blocks in the memory tier before measuring.
          for (const { mb, steps } of SIZES) for (let i = 0; i < steps; i++) await warm.get(batchPath(mb, steps)(i));
          for (let i = 0; i < 200; i++) await warm.get(batchPath(LAT_MB, 200)(i));
        } finally {
          warm.close();
        }
        const paths = SIZES.map(({ mb, steps }) => Array.from({ length: steps }, (_, i) => batchPath(mb, steps)(i)));
        const measure = tname === "HTTP/1.1" ? wrkGBs : h2loadGBs;
        const [g1, g8] = paths.map((p) => measure(server.url, p, ws.dir));
        // A fresh client after the load run: an idle keep-alive socket may have been closed by the server meanwhile.
        const c = make(server.url);
        try {
          const [p50, p99] = await latency(c.get, batchPath(LAT_MB, 200));
          row(name, tname, g1, g8, p50, p99);
        } finally {
          c.close();
        }
        if (tname !== "HTTP/1.1") {
          const [b1, b8] = paths.map((p) => h2loadBigFramesGBs(server.url, p, ws.dir));
          row(name, `${tname}, client allows 1 MiB frames`, b1, b8, NaN, NaN);
        }
      }
      if (TLS) {
        // TLS rows: a second server of this runtime with --tls-cert/--tls-key; wrk speaks
        // HTTP/1.1 over TLS, h2load negotiates h2 by ALPN. A first pass warms the blocks.
        const secure = await startChild(cmd, [...pre, "serve", "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`,
          "--cache-dir", `${ws.dir}/c-${name}-tls`, "--dataset", `d=${ws.dir}/d.json`, "--read-ahead-seconds", "0",
          "--shm-dir", "off", "--tls-cert", TLS.cert, "--tls-key", TLS.key, ...EXTRA_ARGS]);
        try {
          const paths = SIZES.map(({ mb, steps }) => Array.from({ length: steps }, (_, i) => `/v1/datasets/d/batches/${i}?rank=0&world=1&micro_batch=${mb}`));
          for (const [tname, measure] of [["HTTP/1.1 over TLS", wrkGBs], ["HTTP/2 over TLS (ALPN h2)", h2loadGBs], ["HTTP/2 over TLS, client allows 1 MiB frames", h2loadBigFramesGBs]] as const) {
            for (const p of paths) measure(secure.url, p, ws.dir); // warm-up, not counted
            const [g1, g8] = paths.map((p) => measure(secure.url, p, ws.dir));
            row(name, tname, g1, g8, NaN, NaN);
          }
        } finally {
          await secure.stop();
        }
      }
      for (const client of ["deno", "node"] as const) {
        // One consumer iterates the whole timed run, as a trainer does (a new ring costs once per
        // consumer: its first batch's wait, shown on its own).
        const runs = SIZES.map(({ mb, steps }) => runShmClient(client, [server.url, "d", String(mb), String(steps), String(PASSES), "--continuous"]));
        const lat = runShmClient(client, [server.url, "d", String(LAT_MB), "200", "3"]);
        const [g1, g8] = runs.map((f) => f.bytes / f.seconds / 1e9);
        row(name, `shm, ${client} client (mapped); latency = t_wait`, g1, g8, lat.p50 * 1000, lat.p99 * 1000, runs.map((f) => (f.firstWait ?? NaN) * 1000) as [number, number]);
      }
    } catch (e) {
      console.error(`${name} server output:\n${server.output().slice(-3000)}`);
      throw e;
    } finally {
      await server.stop();
    }
  }
} finally {
  await ws.remove();
  rmSync(shmRoot, { recursive: true, force: true });
}
