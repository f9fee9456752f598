/**
 * @module Part size from the origin's measured latency × bandwidth: a range GET costs its time
 * to first byte before any data flows, so parts must be long enough that the transfer, not the
 * wait, dominates each request.
 */

/** What one ranged read cost. */
export interface ReadTiming {
  readonly bytes: number;
  /** ms from sending the request to the response headers. */
  readonly firstByteMs: number;
  /** ms from sending the request to the last byte. */
  readonly totalMs: number;
}

/** Options of `PartSizer`. */
export interface PartSizerOptions {
  /** The configured part size: used until enough reads were measured, and never undercut. */
  readonly minBytes: number;
  /** The largest part (a block). */
  readonly maxBytes: number;
  /** Transfer time per part as a multiple of the time to first byte (4: ≤ 20 % of a request is waiting). */
  readonly factor?: number;
  /** Reads measured before the estimate is used. */
  readonly warmup?: number;
}

/**
 * Picks the origin read size: the bandwidth-delay product of one connection (EWMA of time to first
 * byte × EWMA of body bytes per second) times `factor`, rounded up to a power of two, within
 * `[minBytes, maxBytes]`.
 *
 * @example
 * ```ts
 * const sizer = new PartSizer({ minBytes: 1 << 20, maxBytes: 8 << 20 });
 * sizer.observe({ bytes: 1 << 20, firstByteMs: 20, totalMs: 41 }); // 20 ms + 1 MiB at 50 MB/s
 * sizer.partBytes; // 4 MiB once warmed up: 4 × 20 ms × 50 MB/s = 4 MB
 * ```
 */
export class PartSizer {
  readonly #min: number;
  readonly #max: number;
  readonly #factor: number;
  readonly #warmup: number;
  #samples = 0;
  #firstByteMs = 0;
  /** The shortest time to first byte and the fastest connection seen: the origin unloaded by us. */
  #minFirstByteMs = Infinity;
  #maxBytesPerMs = 0;
  /** Body bytes per ms of one connection. */
  #bytesPerMs = 0;

  /** @throws {RangeError} on sizes that do not make sense */
  constructor(opts: PartSizerOptions) {
    if (!(opts.minBytes >= 1 && opts.maxBytes >= opts.minBytes)) {
      throw new RangeError(`Cannot create PartSizer: need 1 <= minBytes (${opts.minBytes}) <= maxBytes (${opts.maxBytes})`);
    }
    this.#min = opts.minBytes;
    this.#max = opts.maxBytes;
    this.#factor = opts.factor ?? 4;
    this.#warmup = opts.warmup ?? 8;
  }

  /** Adds one measured read (ignored when too small to tell bandwidth from noise). */
  observe(t: ReadTiming): void {
    const bodyMs = t.totalMs - t.firstByteMs;
    if (!(t.firstByteMs >= 0) || !(bodyMs > 0) || t.bytes < 64 * 1024) return;
    // EWMA, heavier on the first samples so the estimate settles within the warm-up.
    const a = Math.max(0.1, 1 / (this.#samples + 1));
    this.#firstByteMs += a * (t.firstByteMs - this.#firstByteMs);
    this.#bytesPerMs += a * (t.bytes / bodyMs - this.#bytesPerMs);
    this.#minFirstByteMs = Math.min(this.#minFirstByteMs, t.firstByteMs);
    this.#maxBytesPerMs = Math.max(this.#maxBytesPerMs, t.bytes / bodyMs);
    this.#samples++;
  }

  /** The part size to use now. */
  get partBytes(): number {
    if (this.#samples < this.#warmup) return this.#min;
    const want = this.#factor * this.#firstByteMs * this.#bytesPerMs;
    const pow2 = 2 ** Math.ceil(Math.log2(Math.max(1, want)));
    return Math.min(this.#max, Math.max(this.#min, pow2));
  }

  /** The current estimates (for metrics and the adaptive concurrency); `warm` once the warm-up's reads are in. */
  stats(): {
    samples: number;
    warm: boolean;
    firstByteSeconds: number;
    bytesPerSecond: number;
    minFirstByteSeconds: number;
    maxBytesPerSecond: number;
    partBytes: number;
  } {
    return {
      samples: this.#samples,
      warm: this.#samples >= this.#warmup && this.#maxBytesPerMs > 0,
      firstByteSeconds: this.#firstByteMs / 1000,
      bytesPerSecond: this.#bytesPerMs * 1000,
      minFirstByteSeconds: this.#minFirstByteMs / 1000,
      maxBytesPerSecond: this.#maxBytesPerMs * 1000,
      partBytes: this.partBytes,
    };
  }
}
