/**
 * @module rackfeed's native gather (`native/gather.c`, built into native/build/librackfeed.so by
 * scripts/build-native.mjs) on Deno, through `Deno.dlopen` (needs `--allow-ffi`). Threaded copies
 * are nonblocking FFI calls, which Deno runs on its blocking-task threads.
 */

import type { PieceCopier } from "../batch/piece-copier.ts";
import { cpuLimit } from "./cpu-limit.ts";
import { openNativeLibrary } from "./native-library-deno.ts";

const SYMBOLS = {
  rackfeed_address: { parameters: ["buffer"], result: "f64" },
  rackfeed_gather: { parameters: ["buffer", "buffer", "i32", "i32"], result: "f64" },
  rackfeed_gather_on_thread: { name: "rackfeed_gather", parameters: ["buffer", "buffer", "i32", "i32"], result: "f64", nonblocking: true },
} as const;

let loaded: PieceCopier | null | undefined;

/**
 * Loads the library once.
 *
 * @returns the copier, or undefined where it is not built or FFI is not allowed (batches are then copied in JavaScript)
 */
export function loadDenoPieceCopier(): PieceCopier | undefined {
  if (loaded === undefined) {
    try {
      const s = openNativeLibrary(SYMBOLS);
      // Addresses travel as doubles: exact below 2^53 (see native-gather-node.ts).
      if (!Number.isSafeInteger(s.rackfeed_address(new Uint8Array(4096)))) throw new Error("addresses do not fit a double");
      loaded = {
        address: (bytes) => s.rackfeed_address(bytes),
        copy: (dst, pieces, first, end) => s.rackfeed_gather(dst, pieces, first, end),
        copyOnThread: (dst, pieces, first, end) => s.rackfeed_gather_on_thread(dst, pieces, first, end),
        threads: Math.min(8, cpuLimit({ cpus: () => navigator.hardwareConcurrency ?? 1 })),
      };
    } catch {
      loaded = null;
    }
  }
  return loaded ?? undefined;
}
