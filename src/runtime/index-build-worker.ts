/**
 * @module The worker that builds a dataset's indexes off the event loop (see `index-builder.ts`):
 * one `IndexBuildInput` in, the dataset's parts (arrays in shared memory) or its error out.
 */

import { parentPort } from "node:worker_threads";
import { buildFromIndexFiles, type IndexBuildInput, shareArrays, tokenDatasetParts } from "../dataset/mod.ts";
import { isCacheServerError } from "../errors.ts";

const port = parentPort!;
port.once("message", (input: IndexBuildInput) => {
  let reply: unknown;
  try {
    // In shared memory: the main thread gets them without a copy, and can hand them on to its
    // planning thread (see planning-thread.ts) without one either.
    const parts = shareArrays(tokenDatasetParts(buildFromIndexFiles(input)));
    port.postMessage({ parts });
    return;
  } catch (e) {
    // Only code and message cross back: the main thread raises the same CacheServerError there.
    reply = { error: { code: isCacheServerError(e) ? e.code : undefined, message: e instanceof Error ? e.message : String(e) } };
  }
  port.postMessage(reply);
});
