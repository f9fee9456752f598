/** @module A native-gather stand-in for tests (Node and Deno): the real copier, its calls counted, with as many threads as a test asks for. */

import type { PieceCopier } from "../../src/batch/piece-copier.ts";

/** A copier's calls: on the event loop (`copy`) and on its threads (`copyOnThread`), and the most of those in flight at once. */
export interface CopierCalls {
  onLoop: number;
  onThreads: number;
  inFlight: number;
  mostInFlight: number;
}

/**
 * `base`, reporting `threads` threads whatever the machine has (4 by default: large batches are
 * cut in four, small shm batches copied in groups), and counting its calls in `calls`.
 */
export function countingCopier(base: PieceCopier, threads = 4): PieceCopier & { readonly calls: CopierCalls } {
  const calls: CopierCalls = { onLoop: 0, onThreads: 0, inFlight: 0, mostInFlight: 0 };
  return {
    ...base,
    threads,
    calls,
    copy: (...a) => (calls.onLoop++, base.copy(...a)),
    copyOnThread: (...a) => {
      calls.onThreads++;
      calls.mostInFlight = Math.max(calls.mostInFlight, ++calls.inFlight);
      return base.copyOnThread(...a).finally(() => calls.inFlight--);
    },
  };
}
