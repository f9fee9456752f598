/**
 * @module The ceiling of any transport in the benchmarks: rackfeed's own batch assembly (plan +
 * one gather copy from memory-tier blocks into a reused buffer, as the shm server does into a
 * slot), run in this process with no transport at all. A gather of scattered samples is bound by
 * memory latency, so it runs well below a cache-hot memcpy of the same byte count.
 */

import { readFileSync } from "node:fs";
import { assembleSamples } from "../../src/batch/assemble-batch.ts";
import { stepSamples } from "../../src/batch/steps.ts";
import { loadConfig } from "../../src/config/load.ts";
import { loadNodePieceCopier } from "../../src/runtime/native-gather-node.ts";
import { createServer } from "../../src/server.ts";

/**
 * GB/s of assembling `steps` consecutive batches of rank 0/1 (cycled for `seconds`), after one
 * warm pass through the HTTP handler put every block in the memory tier.
 *
 * @param serveArgs the `serve` flags of the measured servers (origin, dataset, cache dir)
 */
export async function assemblyGBs(serveArgs: string[], dataset: string, microBatch: number, steps: number, seconds: number): Promise<number> {
  const config = loadConfig({ args: [...serveArgs, "--shm-dir", "off"], env: {}, readTextFile: (p) => readFileSync(p, "utf8"), cwd: process.cwd() });
  // As the servers copy: natively where the library is built (BENCH_ARGS="--native-gather off" turns both off).
  const copier = config.nativeGather === "off" ? undefined : loadNodePieceCopier();
  const server = await createServer(config, { now: () => performance.now(), log: () => {}, copier });
  try {
    for (let s = 0; s < steps; s++) {
      const res = await server.fetch(new Request(`http://bench/v1/datasets/${dataset}/batches/${s}?rank=0&world=1&micro_batch=${microBatch}`));
      if (res.status !== 200) throw new Error(`warm batch ${s}: HTTP ${res.status}`);
      await res.arrayBuffer();
    }
    const reg = await server.datasets.get(dataset);
    let into: Uint8Array | undefined;
    let bytes = 0;
    let n = 0;
    const t0 = performance.now();
    while (performance.now() - t0 < seconds * 1000) {
      const b = await assembleSamples(server.cache, reg, stepSamples(n++ % steps, 0, 1, microBatch), microBatch, Infinity, { into, copier });
      into ??= b.body;
      bytes += b.body.length;
    }
    return bytes / ((performance.now() - t0) / 1000) / 1e9;
  } finally {
    await server.close();
  }
}
