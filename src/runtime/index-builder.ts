/**
 * @module Builds a dataset's indexes on a worker thread, so registering or rebuilding a large
 * dataset (seconds of index building for ~10 G tokens) never stalls the batches being served.
 */

import { Worker } from "node:worker_threads";
import { type IndexBuildInput, type TokenDataset, tokenDatasetFromParts, type TokenDatasetParts, transferablesOf } from "../dataset/mod.ts";
import { CacheServerError, type ErrorCode } from "../errors.ts";

/** Builds a dataset from its `.idx` bytes somewhere else than the calling thread. */
export type IndexBuilder = (input: IndexBuildInput, signal?: AbortSignal) => Promise<TokenDataset>;

const WORKER = new URL("./index-build-worker.ts", import.meta.url);
const NODE_BOOT = new URL("./index-build-worker-node.mjs", import.meta.url);

/**
 * An `IndexBuilder` that starts one worker thread per build (a build is rare; a worker costs
 * 0.1–0.5 s to start) and ends it with the build. The `.idx` bytes are moved to the worker, not
 * copied; the built arrays come back in shared memory.
 *
 * @param runtime which runtime loads the worker: Node needs tsx registered in the thread first
 * @returns the builder
 * @example
 * ```ts
 * const build = workerIndexBuilder("node");
 * const ds = await build({ config, idx: [idxBytes], paths: ["data/a.idx"], binSizes: [binBytes] });
 * ```
 */
export function workerIndexBuilder(runtime: "node" | "deno"): IndexBuilder {
  return (input, signal) =>
    new Promise<TokenDataset>((resolve, reject) => {
      signal?.throwIfAborted();
      const worker = runtime === "node"
        ? new Worker(NODE_BOOT, { workerData: { entry: WORKER.href } })
        : new Worker(WORKER);
      // Not unref'd: a build at start-up runs before anything else keeps the event loop alive
      // (the entry files exit explicitly at shutdown, so a build in flight does not delay it).
      let settled = false;
      const finish = (f: () => void) => {
        if (settled) return;
        settled = true;
        signal?.removeEventListener("abort", onAbort);
        void worker.terminate();
        f();
      };
      // Aborted (overtaken by a later registration): the thread ends now, its work unused.
      const onAbort = () => finish(() => reject(signal!.reason));
      signal?.addEventListener("abort", onAbort, { once: true });
      worker.once("message", (m: { parts?: TokenDatasetParts; error?: { code?: ErrorCode; message: string } }) =>
        finish(() => {
          if (m.parts) resolve(tokenDatasetFromParts(m.parts));
          else if (m.error?.code) reject(new CacheServerError(m.error.code, m.error.message));
          else reject(new Error(`Index build failed: ${m.error?.message}`));
        }));
      worker.once("error", (e) => finish(() => reject(new Error(`Index build worker failed: ${e.message}`, { cause: e }))));
      worker.once("exit", (code) => finish(() => reject(new Error(`Index build worker exited (code ${code}) before answering`))));
      // Moved, not copied, where an .idx fills its own buffer (the catalog reads each into one and
      // drops it after); a view into a larger buffer is copied, so nothing else is detached.
      const own = input.idx.filter((b) => b.byteOffset === 0 && b.byteLength === b.buffer.byteLength);
      worker.postMessage(input, transferablesOf(own));
    });
}
