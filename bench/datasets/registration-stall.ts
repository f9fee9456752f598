/**
 * @module Benchmark: what a trainer sees while an operator registers a large dataset. A trainer
 * reads warm 64 KiB batches of a small dataset back to back while `PUT /v1/datasets/big`
 * registers ~10 G tokens (5 M documents, the index-build benchmark's size; the `.bin` is a sparse
 * file, registration only reads the `.idx`). Printed per way of building: the registration's
 * seconds, batches served during it, their p50/p99/max latency, and the event loop's longest
 * delay (`monitorEventLoopDelay`). **Baseline**: the same with the build on the event loop (how
 * every dataset was built before), measured in the same run.
 *
 *   node --import tsx bench/datasets/registration-stall.ts      (BENCH_DOCS=5000000)
 */

import { mkdirSync, openSync, closeSync, ftruncateSync, writeFileSync } from "node:fs";
import { Agent } from "node:http";
import { join } from "node:path";
import { monitorEventLoopDelay } from "node:perf_hooks";
import process from "node:process";
import { loadConfig } from "../../src/config/load.ts";
import { encodeIndex } from "../../src/dataset/mod.ts";
import { workerIndexBuilder } from "../../src/runtime/index-builder.ts";
import { listenNode } from "../../src/runtime/node.ts";
import { createServer } from "../../src/server.ts";
import { ensureDataset, fmt, httpGet, OUT, pct, registration, sortedCopy, table } from "./common.ts";

const DOCS = Number(process.env.BENCH_DOCS ?? 5_000_000);
const ADMIN = "bench-admin";
const dir = join(OUT, "stall");
mkdirSync(dir, { recursive: true });

// The large dataset: 1000–3000 tokens per document, as in index-build.ts.
const lengths = new Int32Array(DOCS);
let x = 12345;
let tokens = 0;
for (let i = 0; i < DOCS; i++) {
  x = (Math.imul(x, 1103515245) + 12345) >>> 0;
  lengths[i] = 1000 + (x % 2001);
  tokens += lengths[i];
}
writeFileSync(join(dir, "big.idx"), encodeIndex({ dtypeCode: 8, lengths }));
const fd = openSync(join(dir, "big.bin"), "w");
ftruncateSync(fd, tokens * 2); // sparse: the size is all registration checks
closeSync(fd);
const bigSamples = Math.floor((tokens - 1) / 4096);
// The trainer's dataset: 8 MiB of tokens, all in memory after one pass.
ensureDataset(dir, { name: "small", dtypeCode: 8, itemSize: 2, numpyDtype: "<u2" }, 4 * 2 ** 20, 3);

async function run(way: "event loop (baseline)" | "worker thread"): Promise<string[]> {
  const config = loadConfig({
    args: ["--listen", "127.0.0.1:0", "--origin", `data=${dir}`, "--cache-dir", join(dir, "cache"), "--admin-token", ADMIN, "--shm-dir", "off"],
    env: {},
    readTextFile: () => "",
    cwd: dir,
  });
  const server = await createServer(config, {
    now: () => performance.now(),
    log: (m) => console.error(m),
    buildOffThread: way === "worker thread" ? workerIndexBuilder("node") : undefined,
  });
  const listener = await listenNode(server.fetch, config.listen);
  const base = listener.url;
  const put = (name: string, body: unknown) =>
    fetch(`${base}/v1/datasets/${name}`, { method: "PUT", headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" }, body: JSON.stringify(body) });
  const smallSteps = Math.floor((4 * 2 ** 20 - 1) / 4096 / 8);
  if ((await put("small", registration("data", "small", smallSteps * 8))).status !== 201) throw new Error("small dataset not registered");
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  for (let s = 0; s < smallSteps; s++) await httpGet(agent, `${base}/v1/datasets/small/batches/${s}?micro_batch=8`); // warm

  const latencies: number[] = [];
  let registering = true;
  const trainer = (async () => {
    for (let s = 0; registering && latencies.length < 1_000_000; s = (s + 1) % smallSteps) {
      const t0 = performance.now();
      const r = await httpGet(agent, `${base}/v1/datasets/small/batches/${s}?micro_batch=8`);
      if (r.status !== 200) throw new Error(`batch ${s}: ${r.status}`);
      latencies.push(performance.now() - t0);
    }
  })();
  const loop = monitorEventLoopDelay({ resolution: 5 });
  loop.enable();
  const t0 = performance.now();
  const res = await put("big", registration("data", "big", bigSamples));
  const seconds = (performance.now() - t0) / 1000;
  registering = false;
  loop.disable();
  await trainer;
  if (res.status !== 201) throw new Error(`big dataset: ${res.status} ${await res.text()}`);
  agent.destroy();
  await listener.close();
  await server.close();
  const sorted = sortedCopy(latencies);
  return [way, fmt(seconds, 2), String(latencies.length), fmt(pct(sorted, 50), 2), fmt(pct(sorted, 99), 1), fmt(sorted[sorted.length - 1], 0), fmt(loop.max / 1e6, 0)];
}

console.log(`registering ${DOCS} documents, ${(tokens / 1e9).toFixed(2)} G tokens, ${bigSamples} samples of 4096, while a trainer reads warm 8 × 4097 uint16 batches (Node ${process.version})`);
const rows: string[][] = [];
for (const way of ["event loop (baseline)", "worker thread"] as const) rows.push(await run(way));
console.log(table(["dataset built on", "registration s", "batches during it", "batch p50 ms", "p99 ms", "max ms", "longest event-loop delay ms"], rows));
process.exit(0);
