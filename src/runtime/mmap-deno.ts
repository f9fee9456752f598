/**
 * @module Memory-mapped files on Deno through libc (FFI): the shm path's zero-copy views. The
 * server maps a ring read-write and assembles batches straight into its slots; the SDK maps it
 * read-only and hands out typed arrays over the slots. Needs `--allow-ffi` (`-A`).
 */

const PROT_READ = 1;
const PROT_WRITE = 2;
const MAP_SHARED = 1;
const O_RDONLY = 0;
const O_RDWR = 2;

const LIBC_SYMBOLS = {
  open: { parameters: ["buffer", "i32", "i32"], result: "i32" },
  close: { parameters: ["i32"], result: "i32" },
  mmap: { parameters: ["pointer", "usize", "i32", "i32", "i32", "i64"], result: "pointer" },
  munmap: { parameters: ["pointer", "usize"], result: "i32" },
} as const;

let libc: Deno.DynamicLibrary<typeof LIBC_SYMBOLS> | undefined;

function lib() {
  libc ??= Deno.dlopen("libc.so.6", LIBC_SYMBOLS);
  return libc;
}

/**
 * Maps the first `bytes` bytes of a file, shared.
 *
 * @param path the file
 * @param bytes how much to map (the file must be at least this long)
 * @param writable map read-write (the server) or read-only (a client)
 * @returns the view and `unmap`; after `unmap` the view must never be touched again (it would fault)
 * @throws {Error} when libc is missing (not Linux/glibc) or open/mmap fail
 */
export function mapFileDeno(path: string, bytes: number, writable: boolean): { bytes: Uint8Array; unmap(): void } {
  const c = lib().symbols;
  const fd = c.open(new TextEncoder().encode(`${path}\0`), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) throw new Error(`Cannot open ${path} to map it`);
  // MAP_FAILED is (void*)-1.
  const ptr = c.mmap(null, BigInt(bytes), writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0n);
  c.close(fd); // the mapping keeps the file
  if (ptr === null || Deno.UnsafePointer.value(ptr) === 0xffffffffffffffffn) throw new Error(`Cannot map ${bytes} bytes of ${path}`);
  const view = new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(ptr, bytes));
  let mapped = true;
  return {
    bytes: view,
    unmap() {
      if (!mapped) return;
      mapped = false;
      c.munmap(ptr, BigInt(bytes));
    },
  };
}

/** Whether this Deno can map files (Linux with glibc, FFI allowed). */
export function canMapDeno(): boolean {
  try {
    lib();
    return true;
  } catch {
    return false;
  }
}
