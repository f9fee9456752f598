/**
 * @module Reusable HTTP batch bodies. A trainer asks for batches of one size over and over; a
 * fresh multi-MiB body per batch cost new pages (page faults and zeroing by the kernel) and
 * garbage that outlives its response, which is what made Node's HTTP/2 batches 0.6× of its
 * HTTP/1.1 (bench/RESULTS.md, transport "Session 7"). Bodies come back here only once the
 * runtime says their response is done with (`WhenSent`).
 */

import { Buffer } from "node:buffer";

/** What a pool has done since it was made. */
export interface BodyPoolStats {
  /** Bodies handed out from the pool. */
  readonly reused: number;
  /** Bodies allocated because the pool had none of the size asked. */
  readonly allocated: number;
  /** Bodies given back but dropped (the pool was full, or they were too large to keep). */
  readonly dropped: number;
  /** Bytes of the bodies waiting in the pool. */
  readonly bytes: number;
  /** The pool's budget. */
  readonly maxBytes: number;
}

/**
 * Batch bodies by exact byte length, kept within a byte budget. The sizes used most recently are
 * kept: when a body given back does not fit, bodies of the size least recently asked for go first.
 *
 * A body must be given back only when nothing reads it any more (the runtime has written it out):
 * the next `take` of its size overwrites it.
 *
 * @example
 * ```ts
 * const pool = new BatchBodyPool(64 * 2 ** 20);
 * const body = pool.take(1 << 20); // every byte is written by the caller
 * // ... once the response carrying it was sent:
 * pool.give(body);
 * ```
 */
export class BatchBodyPool {
  readonly #maxBytes: number;
  /** Free bodies by length; Map order is recency of use (oldest first). */
  readonly #free = new Map<number, Uint8Array[]>();
  #bytes = 0;
  #reused = 0;
  #allocated = 0;
  #dropped = 0;

  /**
   * @param maxBytes bytes the free bodies may hold at most (0 keeps none)
   * @throws {RangeError} when `maxBytes` is not a non-negative safe integer
   */
  constructor(maxBytes: number) {
    if (!Number.isSafeInteger(maxBytes) || maxBytes < 0) {
      throw new RangeError(`Invalid batch body pool size: expected a non-negative integer of bytes, received ${maxBytes}`);
    }
    this.#maxBytes = maxBytes;
  }

  /**
   * A body of exactly `bytes` bytes, not zeroed: reused when one is free, else new.
   *
   * @param bytes its length
   * @returns the body; its content is whatever was there before
   */
  take(bytes: number): Uint8Array {
    const list = this.#free.get(bytes);
    const body = list?.pop();
    if (body) {
      this.#bytes -= bytes;
      this.#reused++;
      this.#touch(bytes, list!);
      return body;
    }
    this.#allocated++;
    return Buffer.allocUnsafeSlow(bytes);
  }

  /**
   * Gives a body back for reuse. Only once nothing reads it any more.
   *
   * @param body a body from `take` (any Uint8Array of its own buffer works)
   */
  give(body: Uint8Array): void {
    const n = body.length;
    if (n === 0 || n > this.#maxBytes || body.byteOffset !== 0 || body.buffer.byteLength !== n) {
      this.#dropped++;
      return;
    }
    // Make room: bodies of the sizes least recently used go first.
    for (const [size, list] of this.#free) {
      if (this.#bytes + n <= this.#maxBytes) break;
      while (list.length > 0 && this.#bytes + n > this.#maxBytes) {
        list.pop();
        this.#bytes -= size;
        this.#dropped++;
      }
      if (list.length === 0) this.#free.delete(size);
    }
    if (this.#bytes + n > this.#maxBytes) {
      this.#dropped++;
      return;
    }
    const list = this.#free.get(n) ?? [];
    list.push(body);
    this.#bytes += n;
    this.#touch(n, list);
  }

  /** A snapshot of the counters. */
  stats(): BodyPoolStats {
    return { reused: this.#reused, allocated: this.#allocated, dropped: this.#dropped, bytes: this.#bytes, maxBytes: this.#maxBytes };
  }

  /** Marks a size as the most recently used (re-inserted at the end of the Map's order). */
  #touch(size: number, list: Uint8Array[]): void {
    this.#free.delete(size);
    if (list.length > 0) this.#free.set(size, list);
  }
}
