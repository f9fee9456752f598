/**
 * @module "One copy on N threads" of bench/datasets/warm-batches.ts: the same pieces as "one copy
 * alone", copied by N worker threads from a `.bin` held in shared memory into a ring of 64
 * batch-sized slots, each step handed out by a dispatcher on the main thread as the shm server
 * would hand out a planned step (post, wake a worker, wait while the ring is full). It measures
 * how far spreading the gather over threads lifts the ceiling of a one-thread copy, dispatch
 * included; planning, bookkeeping and transport are not in it.
 */

import { mkdtempSync, rmSync, statSync, truncateSync, writeFileSync } from "node:fs";
import { Worker } from "node:worker_threads";

const SLOTS = 64;

/**
 * Batches per second of `steps × passes` steps gathered by `threads` workers.
 *
 * @param binPath the dataset's `.bin`
 * @param rawPlan per sample: piece count, then (byte offset, tokens) per piece, `steps × microBatch` samples
 * @throws {Error} when a step gathers more or fewer bytes than a batch
 */
export async function parallelCopyRun(
  binPath: string,
  rawPlan: Float64Array,
  opts: { steps: number; passes: number; microBatch: number; bodyBytes: number; itemSize: number; threads: number },
): Promise<number> {
  const binBytes = statSync(binPath).size;
  const plan = new SharedArrayBuffer(rawPlan.byteLength);
  new Float64Array(plan).set(rawPlan);
  const stepAt = new SharedArrayBuffer(opts.steps * 8);
  const at = new Float64Array(stepAt);
  for (let s = 0, k = 0; s < opts.steps; s++) {
    at[s] = k;
    for (let j = 0; j < opts.microBatch; j++) k += 1 + 2 * rawPlan[k];
  }
  const dir = mkdtempSync("/dev/shm/rackfeed-bench-copy-");
  const ringPath = `${dir}/ring`;
  writeFileSync(ringPath, "");
  truncateSync(ringPath, SLOTS * opts.bodyBytes);
  const run = async (total: number): Promise<number> => {
    const control = new SharedArrayBuffer(16);
    const c = new Int32Array(control);
    const workers = Array.from({ length: opts.threads }, () =>
      new Worker(new URL("./parallel-copy-worker.mjs", import.meta.url), {
        workerData: { binPath, binBytes, ringPath, plan, stepAt, control, bodyBytes: opts.bodyBytes, slots: SLOTS, itemSize: opts.itemSize, microBatch: opts.microBatch, total },
      })
    );
    const exited = workers.map((w) => new Promise<void>((resolve, reject) => w.once("exit", () => resolve()).once("error", reject)));
    // Workers are started (and their code loaded) before the clock starts.
    await new Promise((r) => setTimeout(r, 200));
    const t0 = performance.now();
    for (let i = 0; i < total; i++) {
      // The ring holds SLOTS steps: step i may be posted only once step i - SLOTS is done.
      for (let done = Atomics.load(c, 2); i - done >= SLOTS; done = Atomics.load(c, 2)) Atomics.wait(c, 2, done, 1);
      Atomics.store(c, 0, i + 1);
      Atomics.notify(c, 0);
    }
    for (let done = Atomics.load(c, 2); done < total; done = Atomics.load(c, 2)) Atomics.wait(c, 2, done, 1);
    const seconds = (performance.now() - t0) / 1000;
    Atomics.notify(c, 0);
    await Promise.all(exited);
    if (c[3] !== 0) throw new Error(`one copy on ${opts.threads} threads: ${c[3]} steps gathered the wrong number of bytes`);
    return total / seconds;
  };
  try {
    await run(opts.steps); // untimed: pages touched, workers' code optimised
    return await run(opts.steps * opts.passes);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
