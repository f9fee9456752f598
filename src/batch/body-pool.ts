/**
 * @module HTTP batch bodies: reused, and bounded while in flight. A trainer asks for batches of
 * one size over and over; a fresh multi-MiB body per batch cost new pages (page faults and
 * zeroing by the kernel) and garbage that outlives its response, which is what made Node's
 * HTTP/2 batches 0.6× of its HTTP/1.1 (bench/RESULTS.md, transport "Session 7"). And a body
 * lives until its reader has taken it: without a bound, clients that ask for large batches and
 * read slowly (or never) would make the server hold any number of them.
 */

import { Buffer } from "node:buffer";
import { OverloadedError } from "../errors.ts";
import { RoomQueue, type SetTimer } from "../http/room-queue.ts";

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
  /** Bytes of the bodies leased now (assembled or being sent). */
  readonly inflightBytes: number;
  /** Leases waiting for in-flight bytes now. */
  readonly waiting: number;
  /** Leases refused: the wait queue was full, or the wait timed out. */
  readonly refused: number;
  /** Leases abandoned unused: their client left while they waited. */
  readonly abandoned: number;
}

/** Bounds of a `BatchBodyPool`. */
export interface BodyPoolOptions {
  /** Bytes the free bodies may hold at most (0 keeps none). */
  readonly poolBytes: number;
  /** Bytes of leased bodies at most; a lease beyond it waits. At least the largest body. */
  readonly inflightBytes: number;
  /** Leases that may wait at once; more are refused. */
  readonly maxWaiting: number;
  /** How long a lease may wait, in ms; then it is refused. */
  readonly waitMs: number;
  /** Timer (tests inject one). */
  readonly setTimer?: SetTimer;
}

/** A body leased for one response; `end` must be called exactly once. */
export interface BodyLease {
  /** Exactly the bytes asked for, not zeroed. */
  readonly body: Uint8Array;
  /**
   * Ends the lease: its bytes no longer count as in flight. With `reusable`, the body goes back
   * to the pool, so pass true only once nothing reads it any more; else it is left to the
   * garbage collector.
   */
  end(reusable: boolean): void;
  /** Ends the lease unused (its client is gone; the body was never written or handed out), counted. */
  abandon(): void;
}

/**
 * Batch bodies by exact byte length, kept within a byte budget, and leased within a bound on the
 * bytes in flight. Free bodies of the sizes used most recently are kept: when a body given back
 * does not fit, bodies of the size least recently asked for go first. Leases beyond the
 * in-flight bound wait in order of arrival, a bounded number of them for a bounded time.
 *
 * @example
 * ```ts
 * const pool = new BatchBodyPool({ poolBytes: 64 << 20, inflightBytes: 1 << 30, maxWaiting: 1024, waitMs: 30_000 });
 * const lease = await pool.lease(1 << 20); // every byte of lease.body is written by the caller
 * // ... once the response carrying it was sent:
 * lease.end(true);
 * ```
 */
export class BatchBodyPool {
  readonly #o: BodyPoolOptions;
  /** Free bodies by length; Map order is recency of use (oldest first). */
  readonly #free = new Map<number, Uint8Array[]>();
  /** Leases waiting for bytes in flight, by their byte counts. */
  readonly #line: RoomQueue<number>;
  #bytes = 0;
  #inflight = 0;
  #reused = 0;
  #allocated = 0;
  #dropped = 0;
  #abandoned = 0;

  /**
   * @param opts the bounds
   * @throws {RangeError} when a bound is not a non-negative integer, or the in-flight bound is 0
   */
  constructor(opts: BodyPoolOptions) {
    for (const [name, v] of [["poolBytes", opts.poolBytes], ["inflightBytes", opts.inflightBytes], ["maxWaiting", opts.maxWaiting], ["waitMs", opts.waitMs]] as const) {
      if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`Cannot create BatchBodyPool: ${name} must be a non-negative integer: received ${v}`);
    }
    if (opts.inflightBytes === 0) throw new RangeError("Cannot create BatchBodyPool: inflightBytes must be at least 1: received 0");
    this.#o = opts;
    this.#line = new RoomQueue<number>({
      maxWaiting: opts.maxWaiting,
      waitMs: opts.waitMs,
      setTimer: opts.setTimer,
      noun: "batches",
      refuse: (why) =>
        new OverloadedError(
          `Batch bodies in flight are at their bound (--batch-inflight-bytes ${opts.inflightBytes}: ${this.#inflight} bytes being sent to readers) and ${why}; retry`,
        ),
      fits: (bytes) => this.#inflight + bytes <= opts.inflightBytes,
      take: (bytes) => void (this.#inflight += bytes),
    });
  }

  /** Whether a lease of `bytes` asked now would wait for room (or behind others that wait). */
  mustWait(bytes: number): boolean {
    return this.#line.length > 0 || this.#inflight + bytes > this.#o.inflightBytes;
  }

  /**
   * Leases a body of exactly `bytes` bytes, waiting while the bytes in flight would exceed the
   * bound.
   *
   * @param bytes its length, at most the in-flight bound
   * @returns the lease; end it once its response is over
   * @throws {OverloadedError} when too many leases wait already, or the wait timed out (503, retry)
   * @throws {RangeError} when `bytes` exceeds the in-flight bound (a configuration error)
   */
  async lease(bytes: number): Promise<BodyLease> {
    if (bytes > this.#o.inflightBytes) {
      throw new RangeError(`Cannot lease a batch body of ${bytes} bytes: it exceeds the in-flight bound of ${this.#o.inflightBytes} bytes`);
    }
    // In order of arrival: a lease does not pass others that wait, or large ones would starve.
    if (this.mustWait(bytes)) await this.#line.wait(bytes); // counted when it is let in
    else this.#inflight += bytes;
    let body: Uint8Array;
    try {
      body = this.#take(bytes);
    } catch (e) {
      this.#inflight -= bytes; // out of memory: the bytes were never leased
      this.#line.wake();
      throw e;
    }
    let ended = false;
    const end = (reusable: boolean) => {
      if (ended) return;
      ended = true;
      this.#inflight -= bytes;
      if (reusable) this.#give(body);
      this.#line.wake();
    };
    return {
      body,
      end,
      abandon: () => {
        if (!ended) this.#abandoned++;
        end(true);
      },
    };
  }

  /**
   * A snapshot of the counters.
   *
   * @returns reuse and in-flight figures, for `/metrics`
   */
  stats(): BodyPoolStats {
    return {
      reused: this.#reused,
      allocated: this.#allocated,
      dropped: this.#dropped,
      bytes: this.#bytes,
      maxBytes: this.#o.poolBytes,
      inflightBytes: this.#inflight,
      waiting: this.#line.length,
      refused: this.#line.refused,
      abandoned: this.#abandoned,
    };
  }

  #take(bytes: number): Uint8Array {
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

  #give(body: Uint8Array): void {
    const n = body.length;
    if (n === 0 || n > this.#o.poolBytes || body.byteOffset !== 0 || body.buffer.byteLength !== n) {
      this.#dropped++;
      return;
    }
    // Make room: bodies of the sizes least recently used go first.
    for (const [size, list] of this.#free) {
      if (this.#bytes + n <= this.#o.poolBytes) break;
      while (list.length > 0 && this.#bytes + n > this.#o.poolBytes) {
        list.pop();
        this.#bytes -= size;
        this.#dropped++;
      }
      if (list.length === 0) this.#free.delete(size);
    }
    if (this.#bytes + n > this.#o.poolBytes) {
      this.#dropped++;
      return;
    }
    const list = this.#free.get(n) ?? [];
    list.push(body);
    this.#bytes += n;
    this.#touch(n, list);
  }

  /** Marks a size as the most recently used (re-inserted at the end of the Map's order). */
  #touch(size: number, list: Uint8Array[]): void {
    this.#free.delete(size);
    if (list.length > 0) this.#free.set(size, list);
  }
}
