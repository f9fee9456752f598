/**
 * @module libc on Deno (FFI), for the shm path: memory-mapped ring files (zero-copy views: the
 * server maps a ring read-write and assembles batches straight into its slots; the SDK maps it
 * read-only and hands out typed arrays over the slots) and the Unix credentials of a socket's
 * peer (SO_PEERCRED). Needs `--allow-ffi` (`-A`).
 */

import type { PeerCredentials } from "../shm/shm-server.ts";
import { decodeUcred, MAP_SHARED, MAP_ZERO_OVER, type MappedFile, mappedView, PROT_READ, PROT_WRITE, UCRED_BYTES } from "./libc-common.ts";

const O_RDONLY = 0;
const O_RDWR = 2;

const LIBC_SYMBOLS = {
  open: { parameters: ["buffer", "i32", "i32"], result: "i32" },
  close: { parameters: ["i32"], result: "i32" },
  mmap: { parameters: ["pointer", "usize", "i32", "i32", "i32", "i64"], result: "pointer" },
  munmap: { parameters: ["pointer", "usize"], result: "i32" },
  getsockopt: { parameters: ["i32", "i32", "i32", "buffer", "buffer"], result: "i32" },
} as const;

const SOL_SOCKET = 1;
const SO_PEERCRED = 17;

let libc: Deno.DynamicLibrary<typeof LIBC_SYMBOLS> | undefined;

function lib() {
  if (!libc) {
    // Asked first: without the permission, dlopen would prompt on a terminal and wait for an answer.
    if (Deno.permissions.querySync({ name: "ffi" }).state !== "granted") throw new Error("no FFI permission for libc");
    libc = Deno.dlopen("libc.so.6", LIBC_SYMBOLS);
  }
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
export function mapFileDeno(path: string, bytes: number, writable: boolean): MappedFile {
  const c = lib().symbols;
  const fd = c.open(new TextEncoder().encode(`${path}\0`), writable ? O_RDWR : O_RDONLY, 0);
  if (fd < 0) throw new Error(`Cannot open ${path} to map it`);
  // MAP_FAILED is (void*)-1.
  let ptr: Deno.PointerValue;
  try {
    ptr = c.mmap(null, BigInt(bytes), writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED, fd, 0n);
  } finally {
    c.close(fd); // the mapping keeps the file
  }
  if (ptr === null || Deno.UnsafePointer.value(ptr) === 0xffffffffffffffffn) throw new Error(`Cannot map ${bytes} bytes of ${path}`);
  return mappedView(
    new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(ptr, bytes)),
    () => c.munmap(ptr, BigInt(bytes)),
    () => Deno.UnsafePointer.equals(c.mmap(ptr, BigInt(bytes), PROT_READ, MAP_ZERO_OVER, -1, 0n), ptr),
    (offset, length) => {
      if (!(offset >= 0 && length >= 0 && offset + length <= bytes)) throw new RangeError(`A view of ${length} bytes at ${offset} is outside a mapping of ${bytes}`);
      return new Uint8Array(Deno.UnsafePointerView.getArrayBuffer(ptr!, length, offset));
    },
  );
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

/**
 * The process, user and group at the other end of a connected Unix socket (SO_PEERCRED, Linux),
 * or undefined when they cannot be read.
 *
 * @param fd the socket's file descriptor
 */
export function peerCredentialsDeno(fd: number): PeerCredentials | undefined {
  const cred = new Uint8Array(UCRED_BYTES);
  const len = new Uint32Array([cred.length]);
  if (lib().symbols.getsockopt(fd, SOL_SOCKET, SO_PEERCRED, cred, new Uint8Array(len.buffer)) !== 0) return undefined;
  return decodeUcred(cred);
}
