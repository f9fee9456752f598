/** @module A bounded concurrency limiter: N operations in flight, a bounded queue behind them, overload beyond it. */

import { OverloadedError } from "../errors.ts";

/**
 * Admits at most `concurrency` operations at once and queues at most `maxQueue` more; the
 * next one is refused with `OverloadedError` (503 + Retry-After) rather than queued without
 * bound. Waiters are served first-come first-served.
 *
 * @example
 * ```ts
 * const limiter = new ConcurrencyLimiter({ concurrency: 16, maxQueue: 1024, what: 'origin "data"' });
 * const bytes = await limiter.run(() => origin.read(key, info, 0, buf));
 * ```
 */
export class ConcurrencyLimiter {
  readonly #concurrency: number;
  readonly #maxQueue: number;
  readonly #what: string;
  #active = 0;
  readonly #queue: Array<() => void> = [];
  #peakQueue = 0;

  /**
   * @param opts `concurrency` ≥ 1, `maxQueue` ≥ 0, and `what` (named in overload messages)
   * @throws {RangeError} on a bad option
   */
  constructor(opts: { concurrency: number; maxQueue: number; what: string }) {
    if (!Number.isSafeInteger(opts.concurrency) || opts.concurrency < 1) {
      throw new RangeError(`Cannot create ConcurrencyLimiter: concurrency must be an integer >= 1, received ${opts.concurrency}`);
    }
    if (!Number.isSafeInteger(opts.maxQueue) || opts.maxQueue < 0) {
      throw new RangeError(`Cannot create ConcurrencyLimiter: maxQueue must be an integer >= 0, received ${opts.maxQueue}`);
    }
    this.#concurrency = opts.concurrency;
    this.#maxQueue = opts.maxQueue;
    this.#what = opts.what;
  }

  /**
   * Runs `fn` when a slot is free.
   * @throws {OverloadedError} when the queue is full
   */
  async run<T>(fn: () => Promise<T>): Promise<T> {
    if (this.#active >= this.#concurrency) {
      if (this.#queue.length >= this.#maxQueue) {
        throw new OverloadedError(`Too many reads waiting for ${this.#what} (${this.#maxQueue} queued); retry shortly`);
      }
      await new Promise<void>((resolve) => this.#queue.push(resolve));
      this.#peakQueue = Math.max(this.#peakQueue, this.#queue.length + 1);
    } else {
      this.#active++;
    }
    try {
      return await fn();
    } finally {
      // Hand the slot straight to the next waiter so a burst of arrivals cannot overtake it.
      const next = this.#queue.shift();
      if (next) next();
      else this.#active--;
    }
  }

  /** In-flight and queued counts. */
  stats(): { active: number; queued: number; peakQueued: number } {
    return { active: this.#active, queued: this.#queue.length, peakQueued: this.#peakQueue };
  }
}
