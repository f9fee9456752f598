/**
 * @module libc on Node, called with koffi (Node has no FFI of its own), for the shm path as
 * `libc-deno.ts` does on Deno: memory-mapped ring files (the server maps a ring read-write and
 * assembles batches straight into its slots; the SDK maps it read-only), the Unix
 * credentials of a socket's peer (SO_PEERCRED), and `flock` for the cache directory's lock.
 * When koffi or glibc is missing (another OS, a platform without koffi's prebuilt binary) the
 * loaders return undefined and callers fall back to positional reads and writes, to the read
 * token, and to a lock by pid.
 */

import * as fs from "node:fs";
import * as os from "node:os";
import { loadKoffi } from "./koffi-node.ts";
import type { PeerCredentials } from "../shm/shm-server.ts";
import { decodeUcred, MAP_SHARED, MAP_ZERO_OVER, type MappedFile, mappedView, PROT_READ, PROT_WRITE, UCRED_BYTES } from "./libc-common.ts";


/** Maps the first `bytes` bytes of a file, shared. */
export type NodeMapFile = (path: string, bytes: number, writable: boolean) => MappedFile;

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

let koffiLibc: { koffi: typeof import("koffi"); libc: ReturnType<typeof import("koffi").load> } | undefined;

function libc() {
  if (!koffiLibc) {
    // Where koffi cannot load, this throws and callers fall back (positional I/O, token-only peers).
    const koffi = loadKoffi();
    koffiLibc = { koffi, libc: koffi.load("libc.so.6") };
  }
  return koffiLibc;
}

let loadedPeer: ((fd: number) => PeerCredentials | undefined) | null | undefined;

/**
 * Binds `getsockopt(SO_PEERCRED)` once.
 *
 * @returns a function giving the process, user and group at the other end of a connected Unix
 * socket's descriptor (undefined when it cannot be read), or undefined where it cannot be bound
 */
export function loadNodePeerCredentials(): ((fd: number) => PeerCredentials | undefined) | undefined {
  if (loadedPeer === undefined) {
    try {
      const getsockopt = libc().libc.func("int getsockopt(int fd, int level, int name, _Out_ uint8_t *val, _Inout_ uint32_t *len)");
      loadedPeer = (fd) => {
        const cred = new Uint8Array(UCRED_BYTES);
        if (getsockopt(fd, 1 /* SOL_SOCKET */, 17 /* SO_PEERCRED */, cred, [cred.length]) !== 0) return undefined;
        return decodeUcred(cred);
      };
    } catch {
      loadedPeer = null;
    }
  }
  return loadedPeer ?? undefined;
}

let loadedFlock: ((fd: number) => boolean) | null | undefined;

/**
 * Binds `flock(LOCK_EX | LOCK_NB)` once.
 *
 * @returns a function that locks an open descriptor's file exclusively without waiting (true),
 * or says another open file holds it (false); undefined where it cannot be bound
 */
export function loadNodeFlock(): ((fd: number) => boolean) | undefined {
  if (loadedFlock === undefined) {
    try {
      const { koffi, libc: lib } = libc();
      const flock = lib.func("int flock(int fd, int operation)");
      const LOCK_EX = 2;
      const LOCK_NB = 4;
      const EWOULDBLOCK = 11;
      const EINTR = 4;
      loadedFlock = (fd) => {
        for (;;) {
          if (flock(fd, LOCK_EX | LOCK_NB) === 0) return true;
          const errno = koffi.errno();
          if (errno === EWOULDBLOCK) return false;
          if (errno !== EINTR) {
            const code = Object.entries(os.constants.errno).find(([, n]) => n === errno)?.[0] ?? `errno ${errno}`;
            throw Object.assign(new Error(`flock failed: ${code}`), { code });
          }
        }
      };
    } catch {
      loadedFlock = null;
    }
  }
  return loadedFlock ?? undefined;
}

function bind(): NodeMapFile {
  const { koffi, libc: lib } = libc();
  const mmap = lib.func("void *mmap(void *addr, size_t len, int prot, int flags, int fd, int64_t off)");
  const munmap = lib.func("int munmap(void *addr, size_t len)");
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
    return mappedView(
      new Uint8Array(koffi.view(ptr, bytes)),
      () => munmap(ptr, bytes),
      () => {
        const again = mmap(ptr, bytes, PROT_READ, MAP_ZERO_OVER, -1, 0);
        return again !== null && koffi.address(again) === address;
      },
    );
  };
}
