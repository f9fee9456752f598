/**
 * @module The line of responses waiting for room under a byte bound (batch bodies in flight,
 * cached blocks that object responses hold): in order of arrival, a bounded number of them, each
 * for a bounded time, then refused with a 503 to retry.
 */

/** A timer that can be cleared (tests inject one). */
export type SetTimer = (fn: () => void, ms: number) => { clear(): void };

/** Bounds of a `RoomQueue`, and the owner's room. */
export interface RoomQueueOptions<T> {
  /** Waiters at once; more are refused. */
  readonly maxWaiting: number;
  /** How long one may wait, in ms; then it is refused. */
  readonly waitMs: number;
  /** Timer (tests inject one). */
  readonly setTimer?: SetTimer;
  /** What waits, plural, for the refusal's message ("batches", "responses"). */
  readonly noun: string;
  /** The error a refused waiter gets, given why (its message names the bound and what to do). */
  readonly refuse: (why: string) => Error;
  /** Whether there is room for `item` now. */
  readonly fits: (item: T) => boolean;
  /** Counts `item`'s room as taken. */
  readonly take: (item: T) => void;
}

interface Waiter<T> {
  readonly item: T;
  readonly resolve: () => void;
  readonly reject: (e: unknown) => void;
  timer?: { clear(): void };
}

/**
 * Waiters for room, each with what it needs (`T`). The owner of the bound calls `wake` whenever
 * room may have come: waiters are let in from the head while they fit, and none passes the head.
 *
 * @example
 * ```ts
 * let used = 0;
 * const line = new RoomQueue<number>({
 *   maxWaiting: 1024, waitMs: 30_000, noun: "batches", refuse: (why) => new OverloadedError(why),
 *   fits: (b) => used + b <= max, take: (b) => (used += b),
 * });
 * if (line.length > 0 || used + bytes > max) await line.wait(bytes); else used += bytes;
 * // when bytes are given back:
 * used -= bytes; line.wake();
 * ```
 */
export class RoomQueue<T> {
  readonly #o: RoomQueueOptions<T>;
  readonly #setTimer: SetTimer;
  readonly #waiters: Waiter<T>[] = [];
  #refused = 0;

  /**
   * @param opts the bounds and the refusal
   * @throws {RangeError} when a bound is not a non-negative integer
   */
  constructor(opts: RoomQueueOptions<T>) {
    for (const [name, v] of [["maxWaiting", opts.maxWaiting], ["waitMs", opts.waitMs]] as const) {
      if (!Number.isSafeInteger(v) || v < 0) throw new RangeError(`Cannot create RoomQueue: ${name} must be a non-negative integer: received ${v}`);
    }
    this.#o = opts;
    this.#setTimer = opts.setTimer ?? ((fn, ms) => {
      const t = setTimeout(fn, ms);
      return { clear: () => clearTimeout(t) };
    });
  }

  /** Waiters now. */
  get length(): number {
    return this.#waiters.length;
  }

  /** Waiters refused since start: the line was full, or a wait timed out. */
  get refused(): number {
    return this.#refused;
  }

  /**
   * Waits in line for room for `item`.
   *
   * @returns a promise that resolves once `wake` has let it in (and counted it)
   * @throws (the promise rejects) `refuse`'s error when the line is full or the wait timed out
   */
  wait(item: T): Promise<void> {
    if (this.#waiters.length >= this.#o.maxWaiting) {
      this.#refused++;
      return Promise.reject(this.#o.refuse(`${this.#waiters.length} ${this.#o.noun} already wait for it`));
    }
    return new Promise<void>((resolve, reject) => {
      const w: Waiter<T> = { item, resolve, reject };
      w.timer = this.#setTimer(() => {
        const i = this.#waiters.indexOf(w);
        if (i < 0) return;
        this.#waiters.splice(i, 1);
        this.#refused++;
        reject(this.#o.refuse(`waited ${this.#o.waitMs} ms`));
        this.wake(); // the head may have changed
      }, this.#o.waitMs);
      this.#waiters.push(w);
    });
  }

  /**
   * Lets waiters in from the head while `fits` says so. `take` counts each one's room at once,
   * not when it resumes (a microtask later): the next one must see it taken.
   */
  wake(): void {
    while (this.#waiters.length > 0) {
      const w = this.#waiters[0];
      if (!this.#o.fits(w.item)) return;
      this.#waiters.shift();
      w.timer?.clear();
      this.#o.take(w.item);
      w.resolve();
    }
  }
}
