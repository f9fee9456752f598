/**
 * @module rackfeed's native gather (`native/gather.c`, built into native/build/librackfeed.so by
 * scripts/build-native.mjs) on Deno, through `Deno.dlopen` (needs `--allow-ffi`). Threaded copies
 * are nonblocking FFI calls, which Deno runs on its blocking-task threads.
 */

import { fileURLToPath } from "node:url";
import type { PieceCopier } from "../batch/piece-copier.ts";
import { cpuLimit } from "./cpu-limit.ts";

const NATIVE_LIBRARY = fileURLToPath(new URL("../../native/build/librackfeed.so", import.meta.url));

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
      // Without --allow-ffi, dlopen would prompt on a terminal: ask first, quietly.
      if (Deno.permissions.querySync({ name: "ffi", path: NATIVE_LIBRARY }).state !== "granted") throw new Error("no FFI permission");
      const { symbols: s } = Deno.dlopen(NATIVE_LIBRARY, SYMBOLS);
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
