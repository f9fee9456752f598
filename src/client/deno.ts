/**
 * @module Deno transport for the SDK's shm path: the Unix socket through `node:net` (as on Node)
 * and the ring mapped read-only through libc (FFI), so a batch is a typed array over the slot
 * itself: zero copies. Needs `--allow-ffi` (`-A`); without it, or off Linux, the ring is read
 * with positional reads like on Node.
 */

import { canMapDeno, mapFileDeno } from "../runtime/mmap-deno.ts";
import { connectUnix, localTransport as readingTransport, STORES_IN_ORDER } from "./node.ts";
import type { LocalTransport, RingReader } from "./shm-consumer.ts";

// A mapping is released when the last view of it is garbage: the caller may keep a batch's
// tokens past the iterator (or past close()), and touching unmapped memory would crash the process.
const unmapWhenCollected = new FinalizationRegistry<() => void>((unmap) => unmap());

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
  if (!canMapDeno()) return readingTransport();
  return {
    connect: connectUnix,
    pollSlots: STORES_IN_ORDER,
    openRing(path: string, bytes: number): RingReader {
      const m = mapFileDeno(path, bytes, false);
      unmapWhenCollected.register(m.bytes.buffer, m.unmap);
      return { mapped: m.bytes, read: (offset, into) => into.set(m.bytes.subarray(offset, offset + into.length)), close() {} };
    },
  };
}
