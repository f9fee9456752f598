/** @module What the Deno (FFI) and Node (koffi) bindings of libc share: the shapes they return. */

import type { PeerCredentials } from "../shm/shm-server.ts";

/** A mapped file as the bindings return it. */
export interface MappedFile {
  readonly bytes: Uint8Array;
  /** Unmaps (once); after it the view must never be touched (it would fault). */
  unmap(): void;
  /**
   * Lets go of the file's pages but keeps the addresses readable: the range is mapped again
   * over anonymous zero pages (`MAP_FIXED`). A view kept by mistake then reads zeros instead of
   * crashing the process, and an unlinked ring's memory goes back to the tmpfs at once instead
   * of when the garbage collector finally drops the view.
   */
  release(): void;
  /**
   * A view of `bytes` at `offset` over an ArrayBuffer of its own, over the same memory (Deno):
   * a caller may transfer it without detaching the mapping's other views.
   */
  readonly viewAt?: (offset: number, bytes: number) => Uint8Array;
}

/** Pages may be read (`mmap` protection, Linux). */
export const PROT_READ = 1;
/** Pages may be written (`mmap` protection, Linux). */
export const PROT_WRITE = 2;
/** Stores reach the file and every other mapping of it (`mmap` flag, Linux). */
export const MAP_SHARED = 0x01;
/** The flags that put private anonymous zero pages exactly over an existing mapping (Linux: PRIVATE | FIXED | ANONYMOUS). */
export const MAP_ZERO_OVER = 0x02 | 0x10 | 0x20;

/**
 * Wraps a mapping: `unmap` runs once, `release` at most once and never after `unmap`.
 *
 * @param zeroOver maps anonymous zero pages over the range; returns false when that failed
 */
export function mappedView(view: Uint8Array, munmap: () => void, zeroOver: () => boolean, viewAt?: MappedFile["viewAt"]): MappedFile {
  let mapped = true;
  let released = false;
  return {
    bytes: view,
    viewAt,
    unmap() {
      if (!mapped) return;
      mapped = false;
      munmap();
    },
    release() {
      if (!mapped || released) return;
      released = zeroOver();
    },
  };
}

/** Bytes of Linux's `struct ucred { pid_t pid; uid_t uid; gid_t gid; }`. */
export const UCRED_BYTES = 12;

/** Decodes a `struct ucred` as `getsockopt(SO_PEERCRED)` fills it (little-endian hosts). */
export function decodeUcred(cred: Uint8Array): PeerCredentials {
  const v = new DataView(cred.buffer, cred.byteOffset, UCRED_BYTES);
  return { pid: v.getInt32(0, true), uid: v.getUint32(4, true), gid: v.getUint32(8, true) };
}
