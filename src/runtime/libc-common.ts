/** @module What the Deno (FFI) and Node (koffi) bindings of libc share: the shapes they return. */

import type { PeerCredentials } from "../shm/shm-server.ts";

/** A mapping's view and an `unmap` that runs once; after it the view must never be touched (it would fault). */
export function mappedView(view: Uint8Array, munmap: () => void): { bytes: Uint8Array; unmap(): void } {
  let mapped = true;
  return {
    bytes: view,
    unmap() {
      if (!mapped) return;
      mapped = false;
      munmap();
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
