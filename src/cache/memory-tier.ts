/** @module The memory tier: whole blocks in an lru-cache bounded by bytes. */

import { LRUCache } from "lru-cache";

/**
 * Options passed to every `get`/`has`: lru-cache otherwise makes an options object per call (its
 * parameter default), a few dozen per served batch. It writes `status` into them: undefined, or a
 * new record while something subscribes to its `lru-cache:metrics` channel (an APM tool). The
 * record is dropped after each call, so that the next call gets its own and the last block
 * looked up is not kept alive by it.
 */
const GET_OPTIONS: LRUCache.GetOptions<string, Uint8Array, unknown> = {};
const HAS_OPTIONS: LRUCache.HasOptions<string, Uint8Array, unknown> = {};

/** Counters of the memory tier. */
export interface MemoryTierStats {
  readonly bytes: number;
  readonly blocks: number;
  readonly maxBytes: number;
  readonly evictions: number;
}

/**
 * Blocks held in memory, never more than `maxBytes` in total; least recently used evicted
 * first, or, with a `nextUse` oracle (the dataset schedules), by Belady's rule among the
 * coldest blocks. Values are stored as given (no copy); callers must not mutate them.
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
  readonly #nextUse: ((key: string) => number) | undefined;
  #evictions = 0;

  /**
   * @param opts `maxBytes`, a positive integer; `nextUse`, when given, turns eviction into
   *   Belady's rule among the least recently used blocks (see `#evictFor`)
   * @throws {RangeError} when the budget is missing or not positive: an unbounded tier is refused
   */
  constructor(opts: { maxBytes: number; nextUse?: (key: string) => number }) {
    if (!Number.isSafeInteger(opts.maxBytes) || opts.maxBytes <= 0) {
      throw new RangeError(`Cannot create MemoryTier: maxBytes must be a positive integer, received ${opts.maxBytes}`);
    }
    this.#maxBytes = opts.maxBytes;
    this.#nextUse = opts.nextUse;
    this.#lru = new LRUCache<string, Uint8Array>({
      // The tier evicts by itself before each insert (#evictFor); lru-cache's own bound is a
      // backstop that never triggers first.
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
    const v = this.#lru.get(key, GET_OPTIONS);
    GET_OPTIONS.status = undefined;
    return v;
  }

  /** True when held, without touching recency. */
  has(key: string): boolean {
    const v = this.#lru.has(key, HAS_OPTIONS);
    HAS_OPTIONS.status = undefined;
    return v;
  }

  /** Stores a block; one larger than the whole budget is not stored. */
  set(key: string, bytes: Uint8Array): void {
    if (bytes.byteLength > this.#maxBytes) return;
    if (this.#nextUse) {
      this.#lru.delete(key);
      this.#evictFor(Math.max(1, bytes.byteLength));
    }
    this.#lru.set(key, bytes);
  }

  /**
   * Makes room for `size` bytes by Belady's rule: a block no schedule references (next use
   * unknown, i.e. infinitely far) goes first, the least recently used of them; only when the
   * `BELADY_SCAN` coldest blocks are all scheduled does the one whose next use is furthest
   * away go. The scan limit bounds an insert's cost on a tier of millions of blocks.
   */
  #evictFor(size: number): void {
    const nextUse = this.#nextUse!;
    while (this.#lru.size > 0 && this.#lru.calculatedSize + size > this.#maxBytes) {
      let victim: string | undefined;
      let furthest = -Infinity;
      let seen = 0;
      for (const k of this.#lru.rkeys()) {
        const t = nextUse(k);
        if (t === Infinity) {
          victim = k;
          break;
        }
        if (t > furthest) {
          furthest = t;
          victim = k;
        }
        if (++seen >= BELADY_SCAN) break;
      }
      this.#lru.delete(victim!);
      this.#evictions++;
    }
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

/** How many of the least recently used blocks Belady eviction looks at, at most, per eviction. */
export const BELADY_SCAN = 4096;
