/**
 * @module Memory-mapped files on Node through libc, called with koffi (Node has no FFI of its
 * own): the shm path's zero-copy views, as `mmap-deno.ts` gives them on Deno. The server maps a
 * ring read-write and assembles batches straight into its slots; the SDK maps it read-only.
 * When koffi or glibc is missing (another OS, musl without the symbols) `loadNodeMapping`
 * returns undefined and callers fall back to positional reads and writes.
 */

import * as fs from "node:fs";
import { createRequire } from "node:module";

const PROT_READ = 1;
const PROT_WRITE = 2;
const MAP_SHARED = 1;

/** Maps the first `bytes` bytes of a file, shared; after `unmap` the view must never be touched again. */
export type NodeMapFile = (path: string, bytes: number, writable: boolean) => { bytes: Uint8Array; unmap(): void };

let loaded: NodeMapFile | null | undefined;

/**
 * Binds libc's `mmap`/`munmap` once; later calls return the same binding.
 *
 * @returns the mapping function, or undefined where it cannot be bound
 */
export function loadNodeMapping(): NodeMapFile | undefined {
  if (loaded === undefined) {
    try {
      loaded = bind();
    } catch {
      loaded = null;
    }
  }
  return loaded ?? undefined;
}

function bind(): NodeMapFile {
  // koffi is CommonJS with a native addon: required lazily, so a platform without its
  // prebuilt binary still runs (with positional I/O).
  const koffi = createRequire(import.meta.url)("koffi") as typeof import("koffi");
  const libc = koffi.load("libc.so.6");
  const mmap = libc.func("void *mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off)");
  const munmap = libc.func("int munmap(void *addr, size_t len)");
  return (path, bytes, writable) => {
    const fd = fs.openSync(path, writable ? "r+" : "r");
    let ptr: unknown;
    try {
      ptr = mmap(null, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0);
    } finally {
      fs.closeSync(fd); // the mapping keeps the file
    }
    // MAP_FAILED is (void*)-1.
    const address = ptr === null ? 0n : koffi.address(ptr);
    if (address === 0n || address === 0xffffffffffffffffn) throw new Error(`Cannot map ${bytes} bytes of ${path}`);
    const view = new Uint8Array(koffi.view(ptr, bytes));
    let mapped = true;
    return {
      bytes: view,
      unmap() {
        if (!mapped) return;
        mapped = false;
        munmap(ptr, bytes);
      },
    };
  };
}
