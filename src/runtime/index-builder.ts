/**
 * @module Builds a dataset's indexes on a worker thread, so registering or rebuilding a large
 * dataset (seconds of index building for ~10 G tokens) never stalls the batches being served.
 */

import { type IndexBuildInput, type TokenDataset, tokenDatasetFromParts, type TokenDatasetParts, transferablesOf } from "../dataset/mod.ts";
import { CacheServerError, type ErrorCode } from "../errors.ts";
import { startThread } from "./threads.ts";

/** Builds a dataset from its `.idx` bytes somewhere else than the calling thread. */
export type IndexBuilder = (input: IndexBuildInput, signal?: AbortSignal) => Promise<TokenDataset>;

const WORKER = new URL("./index-build-worker.ts", import.meta.url);

/**
 * An `IndexBuilder` that starts one worker thread per build (a build is rare; a worker costs
 * 0.1–0.5 s to start) and ends it with the build. The `.idx` bytes are moved to the worker, not
 * copied; the built arrays are moved back, or come back in shared memory (`shareArrays`).
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
      // Kept alive: a build at start-up runs before anything else keeps the event loop alive (the
      // entry files exit explicitly at shutdown, so a build in flight does not delay it).
      const worker = startThread(runtime, WORKER);
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
      worker.onMessage((message) => {
        const m = message as { parts?: TokenDatasetParts; error?: { code?: ErrorCode; message: string } };
        finish(() => {
          if (m.parts) resolve(tokenDatasetFromParts(m.parts));
          else if (m.error?.code) reject(new CacheServerError(m.error.code, m.error.message));
          else reject(new Error(`Index build failed: ${m.error?.message}`));
        });
      });
      worker.onFailure((e) => finish(() => reject(new Error(`Index build worker failed before answering: ${e.message}`, { cause: e }))));
      // Moved, not copied, where an .idx fills its own buffer (the catalog reads each into one and
      // drops it after); a view into a larger buffer is copied, so nothing else is detached.
      const own = input.idx.filter((b) => b.byteOffset === 0 && b.byteLength === b.buffer.byteLength);
      worker.postMessage(input, transferablesOf(own));
    });
}
