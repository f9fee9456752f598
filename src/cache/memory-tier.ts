/** @module The memory tier: whole blocks in an lru-cache bounded by bytes. */

import { LRUCache } from "lru-cache";

/** Counters of the memory tier. */
export interface MemoryTierStats {
  readonly bytes: number;
  readonly blocks: number;
  readonly maxBytes: number;
  readonly evictions: number;
}

/**
 * Blocks held in memory, least recently used evicted first, never more than `maxBytes`
 * in total. Values are stored as given (no copy); callers must not mutate them.
 *
 * @example
 * ```ts
 * const tier = new MemoryTier({ maxBytes: 512 * 2 ** 20 });
 * tier.set("k", bytes);
 * tier.get("k");
 * ```
 */
export class MemoryTier {
  readonly #lru: LRUCache<string, Uint8Array>;
  readonly #maxBytes: number;
  #evictions = 0;

  /**
   * @param opts `maxBytes`, a positive integer
   * @throws {RangeError} when the budget is missing or not positive: an unbounded tier is refused
   */
  constructor(opts: { maxBytes: number }) {
    if (!Number.isSafeInteger(opts.maxBytes) || opts.maxBytes <= 0) {
      throw new RangeError(`Cannot create MemoryTier: maxBytes must be a positive integer, received ${opts.maxBytes}`);
    }
    this.#maxBytes = opts.maxBytes;
    this.#lru = new LRUCache<string, Uint8Array>({
      maxSize: opts.maxBytes,
      // lru-cache refuses a zero size; empty blocks (empty objects) still occupy an entry.
      sizeCalculation: (v) => Math.max(1, v.byteLength),
      dispose: (_v, _k, reason) => {
        if (reason === "evict") this.#evictions++;
      },
    });
  }

  /** The block, marking it most recently used. */
  get(key: string): Uint8Array | undefined {
    return this.#lru.get(key);
  }

  /** True when held, without touching recency. */
  has(key: string): boolean {
    return this.#lru.has(key);
  }

  /** Stores a block; one larger than the whole budget is not stored. */
  set(key: string, bytes: Uint8Array): void {
    if (bytes.byteLength > this.#maxBytes) return;
    this.#lru.set(key, bytes);
  }

  /** Drops a block. */
  delete(key: string): void {
    this.#lru.delete(key);
  }

  /** A snapshot of the counters. */
  stats(): MemoryTierStats {
    return { bytes: this.#lru.calculatedSize, blocks: this.#lru.size, maxBytes: this.#maxBytes, evictions: this.#evictions };
  }
}
