/**
 * @module Deno transport for the SDK's shm path: the Unix socket through `node:net` (as on Node)
 * and the ring mapped read-only through libc (FFI), so a batch is a typed array over the slot
 * itself: zero copies. Needs `--allow-ffi` (`-A`); without it, or off Linux, the ring is read
 * with positional reads like on Node.
 */

import { canMapDeno, mapFileDeno } from "../runtime/libc-deno.ts";
import { connectUnix, localTransport as readingTransport, mappedRing, nextTurn, STORES_IN_ORDER } from "./node.ts";
import type { LocalTransport } from "./shm-consumer.ts";

/**
 * The shm transport for Deno: mapped rings when FFI is allowed, else positional reads.
 *
 * @example
 * ```ts
 * import { localTransport } from "rackfeed/client/deno";
 * const rf = new RackfeedClient({ url: "http://127.0.0.1:8080", local: localTransport() });
 * ```
 */
export function localTransport(): LocalTransport {
  if (!canMapDeno()) return readingTransport({ map: false });
  return {
    connect: connectUnix,
    pollSlots: STORES_IN_ORDER,
    nextTurn,
    openRing: (path: string, bytes: number) => mappedRing(mapFileDeno(path, bytes, false)),
  };
}
