/**
 * @module The cached blocks that object responses are sending, bounded. A response body is a view
 * of a cached block (no copy), so a reader that stops reading keeps its block alive after the
 * memory tier evicts it: 200 stalled readers of different objects held ~1.8 GB beyond a 256 MiB
 * tier (session 10). Each block is counted once however many responses send it (a hot block read
 * by a thousand clients is one block of memory), and a response that would add a block past the
 * bound waits for room, a bounded number of them for a bounded time.
 */

import { OverloadedError } from "../errors.ts";
import { RoomQueue, type SetTimer } from "./room-queue.ts";

/** Bounds of `HeldBlocks`. */
export interface HeldBlocksOptions {
  /** Bytes of distinct blocks held at most; at least one block (`--object-inflight-bytes`). */
  readonly maxBytes: number;
  /** Responses that may wait for room at once; more are refused. */
  readonly maxWaiting: number;
  /** How long a response may wait for room, in ms; then it is refused. */
  readonly waitMs: number;
  /** Timer (tests inject one). */
  readonly setTimer?: SetTimer;
}

/** What `HeldBlocks` holds and has refused, for `/metrics`. */
export interface HeldBlocksStats {
  /** Bytes of the distinct blocks held now. */
  readonly bytes: number;
  /** Distinct blocks held now. */
  readonly blocks: number;
  /** Responses waiting for room now. */
  readonly waiting: number;
  /** Holds refused: the wait queue was full, or the wait timed out. */
  readonly refused: number;
}

/**
 * Reference counts of the block buffers that responses hold, within a byte bound. A buffer
 * counts its whole `byteLength` (a view of a few bytes keeps all of it alive) once, from its
 * first hold to its last release. Holds of a buffer held already never wait; others wait in
 * order of arrival while the bound would be passed.
 *
 * A response holds one block at a time, and gives it back before it asks for its next one:
 * holding one while waiting for another would let readers that all wait hold the whole bound.
 *
 * @example
 * ```ts
 * const holds = new HeldBlocks({ maxBytes: 1 << 30, maxWaiting: 1024, waitMs: 30_000 });
 * await holds.hold(view.buffer); // may wait; throws OverloadedError (503) when refused
 * // ... once the runtime has taken the bytes:
 * holds.release(view.buffer);
 * ```
 */
export class HeldBlocks {
  readonly #o: HeldBlocksOptions;
  readonly #counts = new Map<ArrayBufferLike, number>();
  readonly #line: RoomQueue<ArrayBufferLike>;
  #bytes = 0;

  /**
   * @param opts the bounds
   * @throws {RangeError} when a bound is not a non-negative integer, or `maxBytes` is 0
   */
  constructor(opts: HeldBlocksOptions) {
    if (!Number.isSafeInteger(opts.maxBytes) || opts.maxBytes < 1) {
      throw new RangeError(`Cannot create HeldBlocks: maxBytes must be a positive integer: received ${opts.maxBytes}`);
    }
    this.#o = opts;
    this.#line = new RoomQueue<ArrayBufferLike>({
      maxWaiting: opts.maxWaiting,
      waitMs: opts.waitMs,
      setTimer: opts.setTimer,
      noun: "responses",
      refuse: (why) =>
        new OverloadedError(
          `Cached blocks being sent to object readers are at their bound (--object-inflight-bytes ${opts.maxBytes}: ${this.#bytes} bytes in ` +
            `${this.#counts.size} blocks) and ${why}; retry`,
        ),
      // A block another response took meanwhile costs no new bytes.
      fits: (buffer) => this.#counts.has(buffer) || this.#fits(buffer),
      take: (buffer) => this.#add(buffer),
    });
  }

  /**
   * Holds `buffer` for a response: at once when it is held already or there is room (and nobody
   * waits), else once there is.
   *
   * @returns undefined when held now (no promise on the common path), else a promise of the hold
   * @throws {OverloadedError} (the promise rejects) when too many wait already or the wait timed out
   */
  hold(buffer: ArrayBufferLike): Promise<void> | undefined {
    if (this.#counts.has(buffer)) {
      this.#add(buffer);
      return undefined;
    }
    // In order of arrival: a small block does not pass others that wait.
    if (this.#line.length === 0 && this.#fits(buffer)) {
      this.#add(buffer);
      return undefined;
    }
    return this.#line.wait(buffer);
  }

  /** Gives back one hold of `buffer`; its bytes leave the count with its last hold. */
  release(buffer: ArrayBufferLike): void {
    const n = this.#counts.get(buffer);
    if (n === undefined) throw new Error("Released a block that is not held: a hold was given back twice");
    if (n > 1) {
      this.#counts.set(buffer, n - 1);
      return;
    }
    this.#counts.delete(buffer);
    this.#bytes -= buffer.byteLength;
    this.#line.wake();
  }

  /** A snapshot of the counters. */
  stats(): HeldBlocksStats {
    return { bytes: this.#bytes, blocks: this.#counts.size, waiting: this.#line.length, refused: this.#line.refused };
  }

  /**
   * Whether `buffer` fits beside the blocks held. One larger than the whole bound fits when
   * nothing else is held: a block read from the NVMe tier is a view of its file, header
   * included, a little more than `--block-bytes`, which the bound may equal.
   */
  #fits(buffer: ArrayBufferLike): boolean {
    return this.#bytes + buffer.byteLength <= this.#o.maxBytes || this.#bytes === 0;
  }

  /** One more hold of `buffer`: its bytes count from its first. */
  #add(buffer: ArrayBufferLike): void {
    const n = this.#counts.get(buffer) ?? 0;
    this.#counts.set(buffer, n + 1);
    if (n === 0) this.#bytes += buffer.byteLength;
  }
}

/**
 * One response's share of `HeldBlocks`: the block it is sending now, at most one, until the
 * response is over. `take` gives the block held before back before it waits for the next (a
 * response never holds one while it waits for another), and `end` gives back what is held and
 * takes nothing after: it is called both when the body's stream ends and when the runtime says
 * the response is over, whichever comes first, since a body stream the runtime never reads (its
 * client left before the headers went out) is neither pulled nor ended.
 */
export class ResponseBlockHold {
  readonly #blocks: HeldBlocks;
  #held: ArrayBufferLike | undefined;
  #over = false;

  /** @param blocks the server's bound */
  constructor(blocks: HeldBlocks) {
    this.#blocks = blocks;
  }

  /**
   * Holds `buffer` for this response, giving back the block held before.
   *
   * @returns undefined when held now (or the response is over), else a promise of the hold
   * @throws {OverloadedError} (the promise rejects) as `HeldBlocks.hold`
   */
  take(buffer: ArrayBufferLike): Promise<void> | undefined {
    if (this.#over || buffer === this.#held) return undefined;
    this.#drop();
    const wait = this.#blocks.hold(buffer);
    if (wait === undefined) {
      this.#held = buffer;
      return undefined;
    }
    return wait.then(() => {
      // Over while it waited: nobody will send from it.
      if (this.#over) this.#blocks.release(buffer);
      else this.#held = buffer;
    });
  }

  /** The response is over: gives back its block; later `take`s hold nothing. Idempotent. */
  end(): void {
    this.#over = true;
    this.#drop();
  }

  #drop(): void {
    if (this.#held === undefined) return;
    const b = this.#held;
    this.#held = undefined;
    this.#blocks.release(b);
  }
}
