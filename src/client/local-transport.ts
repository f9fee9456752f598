/**
 * @module The shm path's Unix socket and ring access, shared by the Node and Deno transports
 * (`client/node.ts`, `client/deno.ts`): `node:` built-ins both runtimes have, and nothing else,
 * so the Deno transport loads neither undici nor koffi. Each runtime adds its own way of mapping
 * a ring; `readingTransport` is what either falls back to.
 */

import * as fs from "node:fs";
import * as net from "node:net";
import { arch } from "node:os";
import { setImmediate, setTimeout } from "node:timers";
import type { MappedFile } from "../runtime/libc-common.ts";
import type { LocalSocket, LocalTransport, RingReader } from "./shm-consumer.ts";

/**
 * The shm transport without a mapping: each batch is read with `pread` into one reused buffer
 * (where the runtime cannot map the ring, or `map: false` was asked).
 */
export function readingTransport(): LocalTransport {
  return { connect: connectUnix, openRing: readRing, pollSlots: STORES_IN_ORDER, nextTurn };
}

/** One turn of the event loop: `setImmediate` polls I/O and, unlike timers, is not clamped to 1 ms. */
export function nextTurn(): Promise<void> {
  return new Promise((r) => setImmediate(r));
}

// A mapping is released when the last view of it is garbage: the caller may keep a batch's
// tokens past the iterator (or past close()), and touching unmapped memory would crash the process.
const unmapWhenCollected = new FinalizationRegistry<() => void>((unmap) => unmap());

/**
 * A ring reader over a read-only mapping of the ring. Closing it releases the ring's pages
 * (views kept past the iterator read zeros from then on); the address range is unmapped once
 * no view of it is reachable.
 *
 * @param opts `unmap: false` where the runtime lets a caller move the mapping's memory to
 * another ArrayBuffer (Deno: `transfer()`, or a transfer list): the buffer the finalizer watches
 * is then collected while the new one still points at the memory, so the range is never unmapped,
 * only its pages released (zeros, no memory used; the address range stays reserved)
 */
export function mappedRing(m: MappedFile, opts: { unmap?: boolean } = {}): RingReader {
  // The callback must not reach the buffer it watches (through `m`, which holds its view): it
  // would then never be collected, and the callback never run.
  unmapWhenCollected.register(m.bytes.buffer, opts.unmap === false ? m.release : m.unmap);
  return {
    mapped: m.bytes,
    read: (offset, into) => into.set(m.bytes.subarray(offset, offset + into.length)),
    slot: m.viewAt,
    close: () => m.release(),
  };
}

/**
 * x86-64 keeps stores in order between cores (TSO): a slot header whose generation is new is
 * only seen after the batch it describes. Elsewhere the client waits for a notice per batch.
 */
export const STORES_IN_ORDER = arch() === "x64";

/** How long a closed control connection waits for the server to close its side before it is cut (ms). */
const CLOSE_GRACE_MS = 2000;

/** Connects to a Unix socket, returning chunks through `read()` with the socket paused between reads (backpressure). */
export function connectUnix(path: string): Promise<LocalSocket> {
  return new Promise((resolve, reject) => {
    const s = net.connect(path);
    const chunks: Uint8Array[] = [];
    let connected = false;
    let ended = false;
    let closed = false;
    let waiter: (() => void) | undefined;
    s.on("data", (d: Uint8Array) => {
      chunks.push(d);
      s.pause();
      waiter?.();
    });
    const finish = () => {
      ended = true;
      waiter?.();
    };
    s.on("end", finish);
    s.on("close", finish);
    s.on("error", (e) => {
      if (!connected) reject(e);
      finish();
    });
    s.once("connect", () => {
      connected = true;
      resolve({
        async read() {
          if (closed) return null;
          while (chunks.length === 0 && !ended) {
            s.resume();
            await new Promise<void>((r) => (waiter = r));
            waiter = undefined;
          }
          return chunks.shift() ?? null;
        },
        write(bytes) {
          // Ended too when the server's end was read (a socket that is not half-open ends its
          // side then): a write would be dropped, and the caller must know.
          if (s.destroyed || closed || s.writableEnded) return false;
          s.write(bytes);
          return true;
        },
        close() {
          // Ended, not destroyed: what is written but not yet taken by the kernel (timings written
          // just before) still goes, then the server closes its side. Reads end now; a peer that
          // never closes is cut off after a while.
          if (closed) return;
          closed = true;
          finish();
          s.end();
          setTimeout(() => s.destroy(), CLOSE_GRACE_MS).unref();
        },
      });
    });
  });
}

/**
 * `path`, once its file is found to hold the `bytes` the server announced: a mapping past a
 * file's end faults (SIGBUS) when read, so a short file (a server that misbehaves) is refused here.
 *
 * @throws {Error} when the file is shorter
 */
export function checkRingSize(path: string, bytes: number): string {
  const size = fs.statSync(path).size;
  if (size < bytes) throw new Error(`Ring ${path} has ${size} bytes, expected ${bytes}`);
  return path;
}

function readRing(path: string, bytes: number): RingReader {
  const fd = fs.openSync(checkRingSize(path, bytes), "r");
  let open = true;
  return {
    mapped: undefined,
    read(offset, into) {
      let done = 0;
      while (done < into.length) {
        const n = fs.readSync(fd, into, done, into.length - done, offset + done);
        if (n === 0) throw new Error(`Ring ${path} ended at ${offset + done}`);
        done += n;
      }
    },
    close() {
      if (open) fs.closeSync(fd);
      open = false;
    },
  };
}
