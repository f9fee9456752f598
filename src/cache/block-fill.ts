/** @module One block being filled: parts land out of order, readers follow the contiguous prefix as it grows. */

interface Waiter {
  readonly offset: number;
  readonly resolve: () => void;
  readonly reject: (e: unknown) => void;
}

/**
 * A block buffer that origin parts are written into, possibly out of order. Readers wait for
 * `waitFor(offset)` and may then read `bytes.subarray(pos, filled)`: bytes below `filled`
 * never change again. Every waiter shares the one buffer, which is why any number of readers
 * can join a fill at any time (unlike a streamed response body, which can be read only once).
 *
 * @example
 * ```ts
 * const fill = new BlockFill(size, partBytes);
 * const buf = fill.allocate();
 * fill.partDone(0); // after writing part 0 into buf
 * await fill.waitFor(partBytes);
 * ```
 */
export class BlockFill {
  /** The block's length in bytes. */
  readonly length: number;
  #bytes: Uint8Array | undefined;
  readonly #partBytes: number;
  readonly #partsDone: Uint8Array;
  #filled = 0;
  #nextPart = 0;
  #error: unknown = undefined;
  #waiters: Waiter[] = [];
  /** Settles when the whole block is filled, or rejects with the fill's error. */
  readonly done: Promise<Uint8Array>;
  #resolveDone!: (b: Uint8Array) => void;
  #rejectDone!: (e: unknown) => void;

  /**
   * @param length the block's length
   * @param partBytes size of every part but possibly the last
   */
  constructor(length: number, partBytes: number) {
    this.length = length;
    this.#partBytes = partBytes;
    this.#partsDone = new Uint8Array(Math.max(1, Math.ceil(length / partBytes)));
    this.done = new Promise((resolve, reject) => {
      this.#resolveDone = resolve;
      this.#rejectDone = reject;
    });
    // A fill nobody waits on (read-ahead) must not surface as an unhandled rejection.
    this.done.catch(() => {});
    if (length === 0) {
      this.#bytes = new Uint8Array(0);
      this.#finish();
    }
  }

  /** The block buffer; valid below `filled`. Exists once `allocate()` or `adopt()` ran. */
  get bytes(): Uint8Array {
    if (!this.#bytes) throw new Error("BlockFill.bytes read before allocate() or adopt()");
    return this.#bytes;
  }

  /**
   * Creates the buffer origin parts are written into: after the disk tier was asked (a block read
   * from disk needs none), before the parts wait for origin slots. A new buffer's pages are zero
   * pages until written, so a fill whose parts still wait commits little memory.
   */
  allocate(): Uint8Array {
    this.#bytes ??= new Uint8Array(this.length);
    return this.#bytes;
  }

  /** Number of parts. */
  get parts(): number {
    return this.#partsDone.length;
  }

  /** Length of the valid prefix. */
  get filled(): number {
    return this.#filled;
  }

  /** Byte range `[start, end)` of part `i`. */
  partRange(i: number): [number, number] {
    const start = i * this.#partBytes;
    return [start, Math.min(this.length, start + this.#partBytes)];
  }

  /** Marks part `i` as written and wakes readers the grown prefix satisfies. */
  partDone(i: number): void {
    this.#partsDone[i] = 1;
    while (this.#nextPart < this.#partsDone.length && this.#partsDone[this.#nextPart] === 1) this.#nextPart++;
    this.#filled = Math.min(this.length, this.#nextPart * this.#partBytes);
    if (this.#filled === this.length) {
      this.#finish();
      return;
    }
    const still: Waiter[] = [];
    for (const w of this.#waiters) (w.offset <= this.#filled ? w.resolve() : still.push(w));
    this.#waiters = still;
  }

  /** Takes a whole block at once (a disk-tier hit), without copying it. */
  adopt(bytes: Uint8Array): void {
    if (bytes.length !== this.length) {
      throw new RangeError(`BlockFill.adopt: expected ${this.length} bytes, received ${bytes.length}`);
    }
    this.#bytes = bytes;
    this.#partsDone.fill(1);
    this.#nextPart = this.#partsDone.length;
    this.#filled = this.length;
    this.#finish();
  }

  /** Fails the fill; every current and future waiter gets `error`. */
  fail(error: unknown): void {
    if (this.#error !== undefined || this.#filled === this.length) return;
    this.#error = error;
    for (const w of this.#waiters) w.reject(error);
    this.#waiters = [];
    this.#rejectDone(error);
  }

  /** Resolves once `filled >= offset` (or the block is complete); rejects if the fill fails. */
  waitFor(offset: number): Promise<void> {
    if (this.#error !== undefined) return Promise.reject(this.#error);
    if (offset <= this.#filled) return Promise.resolve();
    return new Promise((resolve, reject) => this.#waiters.push({ offset, resolve, reject }));
  }

  #finish(): void {
    for (const w of this.#waiters) w.resolve();
    this.#waiters = [];
    this.#resolveDone(this.#bytes!);
  }
}
