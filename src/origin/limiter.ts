/** @module A bounded concurrency limiter: N operations in flight, a bounded queue behind them, overload beyond it. */

import { OverloadedError } from "../errors.ts";

/** A queued operation: called when its slot is free; `leave` takes it out of the queue, failing it. */
type Waiter = (() => void) & { leave?: (reason: unknown) => void };

/**
 * At most `concurrency` operations in flight; more wait in a bounded queue (overload beyond it).
 * Two priorities: foreground (trainers, client requests) and background (prefetch jobs).
 * Background work never takes the last `reserve` slots, never overtakes a waiting foreground
 * operation, and never takes a foreground operation's place in a full queue (the newest
 * background waiter gives way, with `OverloadedError`), so warming a rack cannot starve a trainer.
 *
 * @example
 * ```ts
 * const limiter = new ConcurrencyLimiter({ concurrency: 16, maxQueue: 4096, what: 'origin "data"' });
 * await limiter.run(() => origin.read(key, info, 0, dest));
 * await limiter.run(() => origin.read(key, info, 0, dest), { background: true });
 * ```
 */
export class ConcurrencyLimiter {
  #concurrency: number;
  readonly #maxQueue: number;
  readonly #what: string;
  /** Slots background work may not take. */
  #reserve: number;
  #active = 0;
  readonly #queue: Waiter[] = [];
  readonly #background: Waiter[] = [];
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
    this.#reserve = opts.concurrency === 1 ? 0 : Math.max(1, Math.floor(opts.concurrency / 4));
  }

  /**
   * Runs `fn` when a slot is free. With `signal`, an operation nobody needs any more (it aborted)
   * leaves the queue at once and never runs, so it cannot hold a slot that others wait for;
   * `gate` does the same for every operation waiting at once (an origin judged down). Both are
   * listened to only while the operation waits: a long-lived gate collects no listeners.
   * @throws {OverloadedError} when the queue is full
   * @throws the reason of `signal` or `gate` when either aborts before `fn` starts
   */
  async run<T>(fn: () => Promise<T>, opts: { background?: boolean; signal?: AbortSignal; gate?: AbortSignal; promote?: AbortSignal } = {}): Promise<T> {
    const background = opts.background === true && !opts.promote?.aborted;
    const signal = opts.signal;
    const gate = opts.gate;
    if (signal?.aborted) throw signal.reason;
    if (gate?.aborted) throw gate.reason;
    if (this.#mayStart(background)) {
      this.#active++;
    } else {
      if (this.#queue.length + this.#background.length >= this.#maxQueue) {
        const givesWay = background ? undefined : this.#background.at(-1);
        if (!givesWay) throw new OverloadedError(`Too many reads waiting for ${this.#what} (${this.#maxQueue} queued); retry shortly`);
        givesWay.leave!(new OverloadedError(`Too many reads waiting for ${this.#what} (${this.#maxQueue} queued): a background read gave way to a foreground one; retry shortly`));
      }
      // The slot is counted by #dispatch before the waiter resumes, so no arrival overtakes it.
      const queue = background ? this.#background : this.#queue;
      await new Promise<void>((resolve, reject) => {
        const leave = (reason: unknown) => {
          const q = queue.includes(start) ? queue : this.#queue;
          const at = q.indexOf(start);
          if (at < 0) return; // already dispatched: its slot is taken and fn runs
          q.splice(at, 1);
          signal?.removeEventListener("abort", onAbort);
          gate?.removeEventListener("abort", onGate);
          opts.promote?.removeEventListener("abort", onPromote);
          reject(reason);
        };
        const onAbort = () => leave(signal!.reason);
        const onGate = () => leave(gate!.reason);
        // A background read that a foreground reader came to need (it joined the block's fill)
        // moves to the foreground queue: otherwise it would wait for as long as foreground reads
        // keep coming, and so would that reader.
        const onPromote = () => {
          const at = this.#background.indexOf(start);
          if (at < 0) return;
          this.#background.splice(at, 1);
          this.#queue.push(start);
          this.#dispatch();
        };
        const start: Waiter = () => {
          signal?.removeEventListener("abort", onAbort);
          gate?.removeEventListener("abort", onGate);
          opts.promote?.removeEventListener("abort", onPromote);
          resolve();
        };
        start.leave = leave;
        signal?.addEventListener("abort", onAbort, { once: true });
        gate?.addEventListener("abort", onGate, { once: true });
        if (background) opts.promote?.addEventListener("abort", onPromote, { once: true });
        queue.push(start);
      });
      this.#peakQueue = Math.max(this.#peakQueue, this.#queue.length + this.#background.length + 1);
    }
    try {
      return await fn();
    } finally {
      this.#active--;
      this.#dispatch();
    }
  }

  #mayStart(background: boolean): boolean {
    if (!background) return this.#active < this.#concurrency && this.#queue.length === 0;
    return this.#active < this.#concurrency - this.#reserve && this.#queue.length === 0 && this.#background.length === 0;
  }

  #dispatch(): void {
    while (this.#queue.length > 0 && this.#active < this.#concurrency) {
      this.#active++;
      this.#queue.shift()!();
    }
    while (this.#queue.length === 0 && this.#background.length > 0 && this.#active < this.#concurrency - this.#reserve) {
      this.#active++;
      this.#background.shift()!();
    }
  }

  /**
   * Changes the number of slots (an origin that throttles gets fewer). Operations in flight
   * finish; waiting ones start as slots free up under the new limit.
   *
   * @throws {RangeError} unless `n` is an integer >= 1
   */
  setConcurrency(n: number): void {
    if (!Number.isSafeInteger(n) || n < 1) throw new RangeError(`concurrency must be an integer >= 1, received ${n}`);
    this.#concurrency = n;
    this.#reserve = n === 1 ? 0 : Math.max(1, Math.floor(n / 4));
    this.#dispatch();
  }

  /** The number of slots now. */
  get concurrency(): number {
    return this.#concurrency;
  }

  /** In-flight and queued counts. */
  stats(): { active: number; queued: number; queuedBackground: number; peakQueued: number } {
    return {
      active: this.#active,
      queued: this.#queue.length + this.#background.length,
      queuedBackground: this.#background.length,
      peakQueued: this.#peakQueue,
    };
  }
}
