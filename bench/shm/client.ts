/**
 * @module A trainer-like shm consumer for the benchmarks: iterates one rank's batches over the
 * shared-memory path with the SDK and prints one JSON line of figures. On Deno the ring is mapped
 * (zero copies); on Node it is read with pread into a reused buffer.
 *
 * Run: deno run -A bench/shm/client.ts URL DATASET MICRO_BATCH STEPS PASSES [--hash] [--continuous] [--prefetch=N] [--server-pid=PID]
 *  or: node --import tsx bench/shm/client.ts ...
 * Output: {"runtime", "transport", "batches", "seconds", "bytes", "p50", "p99", "firstWait",
 * "hashes"?, "lat"?} (latencies = t_wait: how long each `next()` blocked; the first pass is
 * untimed, and with --hash it returns the sha256 of every batch, for comparison with another
 * path). Each timed pass is a new consumer (a new ring) over steps 0..STEPS-1; with
 * --continuous the untimed pass and the timed one are each one consumer over steps
 * 0..STEPS×PASSES-1, as a trainer iterates, and `firstWait` is its first batch's t_wait: the cost of a new consumer (its ring
 * made and mapped, the first batch filled). With --server-pid (a server on this host), also
 * "serverNs": the CPU time of that process's main thread (its event loop) over the timed passes
 * alone, from /proc (the untimed pass, this process's start and its hashing left out).
 */

import { readFileSync } from "node:fs";
import { RackfeedClient } from "../../src/client/mod.ts";
import type { LocalTransport } from "../../src/client/shm-consumer.ts";

const isDeno = "Deno" in globalThis;
const args = isDeno ? (globalThis as unknown as { Deno: { args: string[] } }).Deno.args : process.argv.slice(2);
const [url, dataset, mbText, stepsText, passesText] = args;
const hash = args.includes("--hash");
const microBatch = Number(mbText);
const steps = Number(stepsText);
const passes = Number(passesText);
const deadline = Date.now() + 5 * 60_000;
// Batches the SDK keeps filled ahead (its ring has one slot more): --prefetch=N, default 3.
const prefetch = Number(args.find((a) => a.startsWith("--prefetch="))?.slice("--prefetch=".length) ?? 3);

// A computed specifier: the Deno transport uses FFI types that Node's type check does not know.
const mod = isDeno ? "../../src/client/deno.ts" : "../../src/client/node.ts";
const { localTransport } = (await import(mod)) as { localTransport: (o?: { map?: boolean }) => LocalTransport };
const c = new RackfeedClient({ url, local: localTransport(args.includes("--pread") ? { map: false } : {}), reportEvery: 1_000_000 });
const transport = await c.transport();
if (transport !== "shm") throw new Error(`${url} is not reachable over shm from here`);

const continuous = args.includes("--continuous");
const endStep = continuous ? steps * passes : steps;
const hashes: string[] = [];
// The untimed pass covers the steps the timed one reads: the server then holds their plans, as it
// does for the HTTP rows' steps (a run on fresh steps would pay planning that a run after it
// does not).
for await (const b of c.batches(dataset, { rank: 0, world: 1, microBatch, endStep, prefetch })) {
  if (hash) {
    const d = await crypto.subtle.digest("SHA-256", new Uint8Array(b.tokens.buffer as ArrayBuffer, b.tokens.byteOffset, b.tokens.byteLength));
    hashes.push([...new Uint8Array(d)].map((x) => x.toString(16).padStart(2, "0")).join(""));
  }
}
const serverPid = args.find((a) => a.startsWith("--server-pid="))?.slice("--server-pid=".length);
/** CPU time so far of the server's main thread, in ns (/proc's schedstat). */
const serverMainNs = () => (serverPid ? Number(readFileSync(`/proc/${serverPid}/task/${serverPid}/schedstat`, "utf8").split(" ")[0]) : NaN);
const lat: number[] = [];
let firstWait = NaN;
let bytes = 0;
const server0 = serverMainNs();
const t0 = performance.now();
for (let p = 0; p < (continuous ? 1 : passes) && Date.now() < deadline; p++) {
  for await (const b of c.batches(dataset, { rank: 0, world: 1, microBatch, endStep, prefetch })) {
    if (lat.length === 0) firstWait = b.waitSeconds;
    lat.push(b.waitSeconds);
    bytes += b.tokens.byteLength;
    // A trainer reads its batch: touch one byte per page, so a lazily mapped slot is really read.
    const v = new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength);
    let x = 0;
    for (let i = 0; i < v.length; i += 4096) x ^= v[i];
    if (x === 256) console.log("unreachable");
  }
}
const seconds = (performance.now() - t0) / 1000;
const serverNs = serverMainNs() - server0;
lat.sort((a, b) => a - b);
console.log(JSON.stringify({
  runtime: isDeno ? "deno" : "node",
  transport,
  batches: lat.length,
  seconds,
  bytes,
  p50: lat[Math.floor(lat.length / 2)],
  p99: lat[Math.floor(lat.length * 0.99)],
  firstWait,
  ...(serverPid ? { serverNs } : {}),
  ...(hash ? { hashes, lat: lat.map((x) => Math.round(x * 1e7) / 1e7) } : {}),
}));
