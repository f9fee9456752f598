/**
 * @module The worker that builds a dataset's indexes off the event loop (see `index-builder.ts`):
 * one `IndexBuildInput` in, the dataset's parts (arrays transferred) or its error out.
 */

import { parentPort } from "node:worker_threads";
import { buildFromIndexFiles, type IndexBuildInput, tokenDatasetParts, transferablesOf } from "../dataset/mod.ts";
import { isCacheServerError } from "../errors.ts";

const port = parentPort!;
port.once("message", (input: IndexBuildInput) => {
  let reply: unknown;
  try {
    const parts = tokenDatasetParts(buildFromIndexFiles(input));
    port.postMessage({ parts }, transferablesOf(parts));
    return;
  } catch (e) {
    // Only code and message cross back: the main thread raises the same CacheServerError there.
    reply = { error: { code: isCacheServerError(e) ? e.code : undefined, message: e instanceof Error ? e.message : String(e) } };
  }
  port.postMessage(reply);
});
