/**
 * @module rackfeed's own native library (native/build/librackfeed.so, built by
 * scripts/build-native.mjs) opened on Deno, for the batch gather (`native-gather-deno.ts`) and the
 * HTTP listener's TCP calls (`native-tcp-deno.ts`). Needs `--allow-ffi` for that path, no more.
 */

import { fileURLToPath } from "node:url";

/** Where scripts/build-native.mjs puts the library. */
export const NATIVE_LIBRARY = fileURLToPath(new URL("../../native/build/librackfeed.so", import.meta.url));

/**
 * Opens the library with `symbols`.
 *
 * @returns the symbols
 * @throws {Error} where FFI for the library is not allowed (asked first, quietly: without the
 *   permission, dlopen would prompt on a terminal), or where it is not built
 */
export function openNativeLibrary<const S extends Deno.ForeignLibraryInterface>(symbols: S): Deno.DynamicLibrary<S>["symbols"] {
  if (Deno.permissions.querySync({ name: "ffi", path: NATIVE_LIBRARY }).state !== "granted") throw new Error("no FFI permission");
  return Deno.dlopen(NATIVE_LIBRARY, symbols).symbols;
}
