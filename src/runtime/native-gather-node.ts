/**
 * @module rackfeed's native gather (`native/gather.c`, built into native/build/librackfeed.so by
 * scripts/build-native.mjs) on Node, through koffi. Threaded copies run on libuv's pool.
 */

import { existsSync } from "node:fs";
import { availableParallelism } from "node:os";
import { fileURLToPath } from "node:url";
import type { PieceCopier } from "../batch/piece-copier.ts";
import { limitInFlight, loadKoffi, RESIDENT_ASYNC_CALLS } from "./koffi-node.ts";
import { cpuLimit } from "./cpu-limit.ts";

/** Where scripts/build-native.mjs puts the library. */
export const NATIVE_LIBRARY = fileURLToPath(new URL("../../native/build/librackfeed.so", import.meta.url));

let loaded: PieceCopier | null | undefined;

/**
 * Loads the library once.
 *
 * @returns the copier, or undefined where it is not built or koffi cannot load it (batches are then copied in JavaScript)
 */
export function loadNodePieceCopier(): PieceCopier | undefined {
  if (loaded === undefined) {
    try {
      loaded = existsSync(NATIVE_LIBRARY) ? bind() : null;
    } catch {
      loaded = null;
    }
  }
  return loaded ?? undefined;
}

function bind(): PieceCopier {
  const lib = loadKoffi().load(NATIVE_LIBRARY);
  const address = lib.func("double rackfeed_address(const void *p)");
  const gather = lib.func("double rackfeed_gather(uint8_t *dst, const double *pieces, int32_t first, int32_t end)");
  // Addresses travel as doubles: exact below 2^53. Where pointers carry tags in their top bits
  // (some ARM kernels) they would not be: copy in JavaScript there.
  if (!Number.isSafeInteger(address(new Uint8Array(4096)))) throw new Error("addresses do not fit a double");
  return {
    address: (bytes) => address(bytes) as number,
    copy: (dst, pieces, first, end) => gather(dst, pieces, first, end) as number,
    copyOnThread: limitInFlight(
      (dst: Uint8Array, pieces: Float64Array, first: number, end: number) =>
        new Promise<number>((resolve, reject) => gather.async(dst, pieces, first, end, (e: unknown, n: number) => (e ? reject(e) : resolve(n)))),
      RESIDENT_ASYNC_CALLS,
    ),
    // Slices run on libuv's pool (4 threads unless UV_THREADPOOL_SIZE says more; `npm start` and
    // bin/rackfeed set 64), which fs calls share: more slices than its threads would only queue.
    threads: Math.min(8, cpuLimit({ cpus: availableParallelism }), Number(process.env.UV_THREADPOOL_SIZE) || 4),
  };
}
