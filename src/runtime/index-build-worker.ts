/**
 * @module The worker that builds a dataset's indexes off the event loop (see `index-builder.ts`):
 * one `IndexBuildInput` in, the dataset's parts (arrays moved, or in shared memory) or its error out.
 */

import { buildFromIndexFiles, type IndexBuildInput, shareArrays, tokenDatasetParts, transferablesOf } from "../dataset/mod.ts";
import { isCacheServerError } from "../errors.ts";
import { parentThread } from "./threads.ts";

const port = parentThread();
port.onMessage((message) => {
  const input = message as IndexBuildInput;
  let reply: unknown;
  try {
    const parts = tokenDatasetParts(buildFromIndexFiles(input));
    // Copied into shared memory where a planning thread will read them (see planning-thread.ts;
    // the copy costs a build's peak memory ~65 % more), else moved.
    if (input.shareArrays) port.postMessage({ parts: shareArrays(parts) });
    else port.postMessage({ parts }, transferablesOf(parts));
    return;
  } catch (e) {
    // Only code and message cross back: the main thread raises the same CacheServerError there.
    reply = { error: { code: isCacheServerError(e) ? e.code : undefined, message: e instanceof Error ? e.message : String(e) } };
  }
  port.postMessage(reply);
});
