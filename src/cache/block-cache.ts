/**
 * @module The block cache: objects cut into aligned blocks keyed by (origin, key, version,
 * block size, index), looked up in memory, then on NVMe, then filled from the origin once
 * however many readers want it (single-flight), with readers served part by part as bytes land.
 */

import { setMaxListeners } from "node:events";
import { isCacheServerError } from "../errors.ts";
import type { ObjectInfo } from "../origin/origin.ts";
import type { OriginGateway } from "../origin/origin-gateway.ts";
import { BlockFill } from "./block-fill.ts";
import type { DiskTier } from "./disk-tier.ts";
import type { MemoryTier } from "./memory-tier.ts";

/** Counters of block lookups, one per decision. */
export interface BlockCacheStats {
  /** Lookups answered by the memory tier. */
  readonly memoryHits: number;
  /** Fills answered by the NVMe tier. */
  readonly diskHits: number;
  /** Fills that went to the origin (read-ahead included). */
  readonly misses: number;
  /** Lookups that joined a fill already in flight instead of starting another. */
  readonly coalesced: number;
  /** Fills that failed. */
  readonly fillErrors: number;
  /** Fills in flight now. */
  readonly inFlight: number;
  /** Times a stream caught up with its read-ahead and deepened it. */
  readonly streamStalls: number;
  /** Block keys kept for reuse (see `keyOf`), at most `KEYS_KEPT`. */
  readonly keysKept: number;
}

/** Options of `BlockCache`. */
export interface BlockCacheOptions {
  readonly memory: MemoryTier;
  /** The NVMe tier; absent means memory only. */
  readonly disk?: DiskTier;
  /** Block size in bytes; part of every block key. */
  readonly blockBytes: number;
  /** Origin read size within a block. */
  readonly partBytes: number;
  /** Blocks fetched ahead of the one being streamed, at first. */
  readonly readAheadBlocks: number;
  /**
   * Deepest read-ahead a stream may grow to (default `readAheadBlocks`): each time a reader
   * catches up with a fill it had started ahead, its depth doubles, up to this.
   */
  readonly maxReadAheadBlocks?: number;
  /** Monotonic clock in ms (injected in tests). */
  readonly now: () => number;
  /** Called once per finished fill with its duration and where it came from (for histograms). */
  readonly onFill?: (seconds: number, source: "disk" | "origin") => void;
}

/**
 * Reads byte ranges of object versions through the tiers.
 *
 * @example
 * ```ts
 * const cache = new BlockCache({ memory, disk, blockBytes: 8 << 20, partBytes: 1 << 20, readAheadBlocks: 2, now: () => performance.now() });
 * for await (const chunk of cache.readRange(gateway, "a.bin", info, 0, info.size)) sink.write(chunk);
 * ```
 */
export class BlockCache {
  readonly #memory: MemoryTier;
  readonly #disk: DiskTier | undefined;
  readonly #blockBytes: number;
  readonly #partBytes: number;
  readonly #readAhead: number;
  readonly #maxReadAhead: number;
  #streamStalls = 0;
  readonly #now: () => number;
  readonly #onFill: (seconds: number, source: "disk" | "origin") => void;
  readonly #flights = new Map<string, BlockFill>();
  /** Where each fill got its bytes; weak, so finished fills are not kept. */
  readonly #fillSource = new WeakMap<BlockFill, "disk" | "origin">();
  /** Background (prefetch) fills: aborting the controller moves their queued reads to the foreground. */
  readonly #promote = new WeakMap<BlockFill, AbortController>();
  /** Fills running (`#runFill`), until they have stored their block or failed; `close()` waits for them. */
  readonly #running = new Set<Promise<void>>();
  /** Prefetch jobs waiting for each background fill (see `#awaitForPrefetch`). */
  readonly #prefetchers = new Map<BlockFill, number>();
  /** Each fill's group: aborting it takes the fill's queued and running origin reads away. */
  readonly #groups = new WeakMap<BlockFill, AbortController>();
  /** Fills given up because every prefetch job waiting for them cancelled, with the reason. */
  readonly #abandoned = new WeakMap<BlockFill, unknown>();
  /** Block keys of each object version, made once (see `keyOf`); weak, so they go with the version. */
  #keys = new WeakMap<ObjectInfo, KeyStrings>();
  /** Keys made since `#keys` was last started over. */
  #keysKept = 0;
  #memoryHits = 0;
  #diskHits = 0;
  #misses = 0;
  #coalesced = 0;
  #fillErrors = 0;

  /**
   * @param opts tiers and sizes
   * @throws {RangeError} on inconsistent sizes
   */
  constructor(opts: BlockCacheOptions) {
    if (!Number.isSafeInteger(opts.blockBytes) || opts.blockBytes < 1) {
      throw new RangeError(`Cannot create BlockCache: blockBytes must be a positive integer, received ${opts.blockBytes}`);
    }
    if (!Number.isSafeInteger(opts.partBytes) || opts.partBytes < 1 || opts.partBytes > opts.blockBytes) {
      throw new RangeError(
        `Cannot create BlockCache: partBytes must be an integer from 1 to blockBytes (${opts.blockBytes}), received ${opts.partBytes}`,
      );
    }
    this.#memory = opts.memory;
    this.#disk = opts.disk;
    this.#blockBytes = opts.blockBytes;
    this.#partBytes = opts.partBytes;
    this.#readAhead = opts.readAheadBlocks;
    this.#maxReadAhead = Math.max(opts.readAheadBlocks, opts.maxReadAheadBlocks ?? opts.readAheadBlocks);
    this.#now = opts.now;
    this.#onFill = opts.onFill ?? (() => {});
  }

  /** The block size. */
  get blockBytes(): number {
    return this.#blockBytes;
  }

  /**
   * Yields the bytes `[start, end)` of one object version, in order, as views into cached
   * blocks (no copies). The read-ahead adapts to the origin: it starts at `readAheadBlocks` and
   * doubles whenever the reader reaches a block still being fetched ahead (the origin's latency ×
   * bandwidth needs more in flight), up to `maxReadAheadBlocks`. At most `1 + maxReadAheadBlocks`
   * blocks of this range are held at once, so memory stays flat however long the range; the
   * consumer's pace sets the origin's pace.
   *
   * @throws {OriginError} when a fill fails (the caller may already have sent bytes)
   */
  async *readRange(
    gw: OriginGateway,
    key: string,
    info: ObjectInfo,
    start: number,
    end: number,
  ): AsyncGenerator<Uint8Array, void, undefined> {
    if (end <= start) return;
    const first = Math.floor(start / this.#blockBytes);
    const last = Math.floor((end - 1) / this.#blockBytes);
    let depth = this.#readAhead;
    let warmed = first; // highest block index whose fill this stream has started or found
    for (let index = first; index <= last; index++) {
      const got = this.#lookup(gw, key, info, index, false);
      if (!(got instanceof Uint8Array) && index > first && index <= warmed && got.filled < got.length && depth < this.#maxReadAhead) {
        // The reader caught up with read-ahead: fills take longer than consuming a block, so
        // keep more of them in flight (the slow-start of a TCP window, bounded).
        depth = Math.min(this.#maxReadAhead, depth * 2);
        this.#streamStalls++;
      }
      for (let ahead = Math.max(warmed, index) + 1; ahead <= Math.min(last, index + depth); ahead++) {
        this.#lookup(gw, key, info, ahead, true);
        warmed = ahead;
      }
      const blockStart = index * this.#blockBytes;
      const from = Math.max(start, blockStart) - blockStart;
      const to = Math.min(end, blockStart + this.#blockBytes) - blockStart;
      if (got instanceof Uint8Array) {
        yield got.subarray(from, to);
        continue;
      }
      let pos = from;
      while (pos < to) {
        await got.waitFor(pos + 1);
        const avail = Math.min(to, got.filled);
        yield got.bytes.subarray(pos, avail);
        pos = avail;
      }
    }
  }

  /**
   * Like `block`, and says where the bytes came from: `memory`, or the `disk`/`origin` fill
   * it started or joined (for per-dataset hit rates and slow-batch causes).
   */
  async blockFrom(
    gw: OriginGateway,
    key: string,
    info: ObjectInfo,
    index: number,
  ): Promise<{ bytes: Uint8Array; source: "memory" | "disk" | "origin" }> {
    const got = this.#lookup(gw, key, info, index, false);
    if (got instanceof Uint8Array) return { bytes: got, source: "memory" };
    const bytes = await got.done;
    return { bytes, source: this.#fillSource.get(got) ?? "origin" };
  }

  /**
   * The whole block `index` of an object version, waiting for its fill if needed.
   *
   * @returns the block's bytes (a shared view; do not mutate)
   */
  async block(gw: OriginGateway, key: string, info: ObjectInfo, index: number): Promise<Uint8Array> {
    const got = this.#lookup(gw, key, info, index, false);
    return got instanceof Uint8Array ? got : await got.done;
  }

  /**
   * Starts filling block `index` unless it is in memory or already in flight (read-ahead).
   * Not counted as a lookup; a failed warm fill is counted in `fillErrors` and forgotten.
   *
   * @param k the block's key, when the caller has it (else made here)
   * @returns true when a fill was started
   */
  warm(gw: OriginGateway, key: string, info: ObjectInfo, index: number, k = this.keyOf(gw, key, info, index)): boolean {
    if (this.#memory.has(k)) return false;
    const flight = this.#flights.get(k);
    if (flight) {
      // A consumer's read-ahead needs a block a prefetch job is filling: at foreground priority.
      this.#promote.get(flight)?.abort();
      return false;
    }
    const fill = this.#lookup(gw, key, info, index, true);
    if (!(fill instanceof Uint8Array)) fill.done.catch(() => {});
    return true;
  }

  /**
   * Brings block `index` into a tier for a prefetch job: the fill's origin reads run at
   * background priority; with `tier: "disk"` the block file is written before this resolves
   * (waiting for a write slot instead of skipping). Blocks pass through the memory tier, where
   * Belady eviction drops them before any scheduled block.
   *
   * @returns `true` when the block was already in the tier (nothing was read)
   */
  async prefetch(
    gw: OriginGateway,
    key: string,
    info: ObjectInfo,
    index: number,
    opts: { tier: "memory" | "disk"; background: boolean; signal?: AbortSignal },
  ): Promise<boolean> {
    const k = this.keyOf(gw, key, info, index);
    const disk = opts.tier === "disk" ? this.#disk : undefined;
    // Found: marked used, as a read would, so that this job's own fills do not evict it first.
    if (disk ? disk.touch(k) : this.#memory.get(k) !== undefined) return true;
    let bytes = this.#memory.get(k);
    if (!bytes) {
      const fill = this.#flights.get(k) ?? this.#startFill(gw, key, info, index, k, opts.background);
      bytes = await this.#awaitForPrefetch(k, fill, opts.signal);
    }
    // A block the NVMe tier could not store (write error, full disk, tier smaller than a block) is
    // not "done": the job fails, naming why, instead of reporting a warm disk that is cold.
    if (disk && !(await disk.writeAndWait(k, bytes))) {
      throw new Error(`Cannot store block ${index} of "${key}" in the NVMe tier (see the server log: disk write errors or --disk-bytes)`);
    }
    return false;
  }

  /**
   * Waits for a fill on a prefetch job's behalf. When every job waiting for a background fill
   * has cancelled and nobody else came to need it (it was never promoted), the fill is given
   * up: it leaves the flights (a later reader starts its own) and its queued origin reads leave
   * the queue, instead of reading what no one wants.
   *
   * @throws the reason of `signal` once it aborts
   */
  async #awaitForPrefetch(k: string, fill: BlockFill, signal: AbortSignal | undefined): Promise<Uint8Array> {
    if (!signal) return await fill.done;
    signal.throwIfAborted();
    this.#prefetchers.set(fill, (this.#prefetchers.get(fill) ?? 0) + 1);
    let onAbort = () => {};
    const aborted = new Promise<never>((_, reject) => {
      onAbort = () => {
        this.#leavePrefetch(k, fill, signal.reason);
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
    });
    try {
      return await Promise.race([fill.done, aborted]);
    } finally {
      signal.removeEventListener("abort", onAbort);
      if (!signal.aborted) this.#leavePrefetch(k, fill, undefined);
    }
  }

  /** One prefetch waiter of `fill` is gone (`reason`: it cancelled); the last to cancel gives the fill up. */
  #leavePrefetch(k: string, fill: BlockFill, reason: unknown): void {
    const left = (this.#prefetchers.get(fill) ?? 1) - 1;
    if (left > 0) {
      this.#prefetchers.set(fill, left);
      return;
    }
    this.#prefetchers.delete(fill);
    const promote = this.#promote.get(fill);
    // Only a fill still in flight (settled ones have left), that no reader was promoted into.
    if (reason === undefined || !promote || promote.signal.aborted || this.#flights.get(k) !== fill) return;
    this.#flights.delete(k);
    this.#abandoned.set(fill, reason);
    this.#groups.get(fill)?.abort(reason);
  }

  /** True when a fill of block `index` of this object version is in flight. */
  filling(gw: OriginGateway, key: string, info: ObjectInfo, index: number): boolean {
    return this.#flights.has(this.keyOf(gw, key, info, index));
  }

  /**
   * The block of cache key `k` (a `keyOf`) when it is in the memory tier (recency updated), else
   * undefined: the caller then asks `blockFrom`. Lets a batch whose blocks are all in memory be
   * assembled without a promise per block. Not counted: the caller counts the hits it uses
   * (`countMemoryHits`).
   */
  memoryBlockOfKey(k: string): Uint8Array | undefined {
    return this.#memory.get(k);
  }

  /** Counts `n` memory hits taken with `memoryBlockOfKey`. */
  countMemoryHits(n: number): void {
    this.#memoryHits += n;
  }

  /** True when block `index` of this object version is in the memory tier (no recency update). */
  inMemory(gw: OriginGateway, key: string, info: ObjectInfo, index: number): boolean {
    return this.#memory.has(this.keyOf(gw, key, info, index));
  }

  /** The cache key of a block. Newlines cannot occur in keys, so the fields cannot run together. */
  #blockKey(origin: string, key: string, version: string, index: number): string {
    return `${origin}\n${key}\n${version}\n${this.#blockBytes}\n${index}`;
  }

  /**
   * The cache key of block `index` of this object version, the same string object each time. A key
   * built afresh costs V8 a flatten and a hash on every map it is looked up in (~0.3 µs, a dozen
   * times per served batch); a kept string carries its hash. At most `KEYS_KEPT` keys are kept,
   * all objects together (then they start over): a registered dataset holds its files' versions
   * for as long as it is served, so keys of blocks long evicted must not pile up with them.
   */
  keyOf(gw: OriginGateway, key: string, info: ObjectInfo, index: number): string {
    let ks = this.#keys.get(info);
    // One ObjectInfo normally belongs to one (origin, key); checked, so a shared one stays correct.
    if (ks === undefined || ks.origin !== gw.name || ks.key !== key) {
      ks = { origin: gw.name, key, byIndex: new Map() };
      this.#keys.set(info, ks);
    }
    let k = ks.byIndex.get(index);
    if (k !== undefined) return k;
    if (this.#keysKept >= KEYS_KEPT) {
      // Start over: every other version's keys go with the old map, this one's are cleared.
      this.#keys = new WeakMap([[info, ks]]);
      ks.byIndex.clear();
      this.#keysKept = 0;
    }
    ks.byIndex.set(index, (k = this.#blockKey(gw.name, key, info.version, index)));
    this.#keysKept++;
    return k;
  }

  /**
   * The block in memory, or its fill (joined, or started). `warmOnly`: a look ahead of a reader
   * (read-ahead, a stream's next blocks), which counts no hit and does not touch recency.
   */
  #lookup(gw: OriginGateway, key: string, info: ObjectInfo, index: number, warmOnly: boolean): Uint8Array | BlockFill {
    const k = this.keyOf(gw, key, info, index);
    const mem = warmOnly ? (this.#memory.has(k) ? EMPTY : undefined) : this.#memory.get(k);
    if (mem) {
      if (!warmOnly) this.#memoryHits++;
      return mem;
    }
    const flight = this.#flights.get(k);
    if (flight) {
      if (!warmOnly) this.#coalesced++;
      // A reader (or read-ahead) now needs a block a prefetch job is filling at background priority.
      this.#promote.get(flight)?.abort();
      return flight;
    }
    return this.#startFill(gw, key, info, index, k, false);
  }

  /** Starts the fill of block `index` (cache key `k`), in flight from now on: later readers join it. */
  #startFill(gw: OriginGateway, key: string, info: ObjectInfo, index: number, k: string, background: boolean): BlockFill {
    const length = Math.min(this.#blockBytes, info.size - index * this.#blockBytes);
    const fill = new BlockFill(length, Math.min(length, gw.partBytes() ?? this.#partBytes));
    this.#flights.set(k, fill);
    this.#track(this.#runFill(gw, key, info, index, k, fill, background));
    return fill;
  }

  async #runFill(
    gw: OriginGateway,
    key: string,
    info: ObjectInfo,
    index: number,
    k: string,
    fill: BlockFill,
    background = false,
  ): Promise<void> {
    const t0 = this.#now();
    const promote = background ? new AbortController() : undefined;
    if (promote) this.#promote.set(fill, promote);
    let group: AbortController | undefined;
    try {
      // Check the lower tier inside the flight: the only place a concurrent fill of the same
      // key cannot race us, so a block is read from disk once however many readers arrive.
      const fromDisk = this.#disk?.has(k) ? await this.#disk.read(k) : undefined;
      if (fromDisk && fromDisk.length === fill.length) {
        this.#diskHits++;
        this.#fillSource.set(fill, "disk");
        fill.adopt(fromDisk);
        this.#memory.set(k, fromDisk);
        this.#onFill((this.#now() - t0) / 1000, "disk");
        return;
      }
      this.#misses++;
      const buf = fill.allocate();
      const base = index * this.#blockBytes;
      const parts: Promise<void>[] = [];
      // The first part that fails fails the block: its other parts are then of no use to anyone,
      // so they leave the origin's queue (or are aborted, on S3) instead of spending slots, and
      // their retries, that other blocks' readers wait for (see `OriginGateway.read`'s group).
      // Given up while the disk was checked: no origin read starts.
      if (this.#abandoned.has(fill)) throw this.#abandoned.get(fill);
      group = new AbortController();
      this.#groups.set(fill, group);
      // Each waiting part listens to it (and to `promote`): a block of many parts is not a leak.
      setMaxListeners(0, group.signal);
      if (promote) setMaxListeners(0, promote.signal);
      for (let i = 0; i < fill.parts; i++) {
        const [s, e] = fill.partRange(i);
        parts.push(gw.read(key, info, base + s, buf.subarray(s, e), { background, group, promote: promote?.signal }).then(() => fill.partDone(i)));
      }
      await Promise.all(parts);
      this.#memory.set(k, buf);
      this.#disk?.write(k, buf);
      this.#onFill((this.#now() - t0) / 1000, "origin");
    } catch (e) {
      // Parts still queued are of no use now (one failed, or was refused for a full queue).
      group?.abort(e);
      if (!this.#abandoned.has(fill)) this.#fillErrors++; // given up is not failed
      // A changed object invalidates its metadata so the next request sees the new version.
      if (isCacheServerError(e) && (e.code === "OBJECT_CHANGED" || e.code === "OBJECT_NOT_FOUND")) gw.invalidate(key);
      fill.fail(e);
    } finally {
      // Deleting on settle means a failure is never cached: the next reader starts a new fill
      // (which may already be there, if this one was given up).
      if (this.#flights.get(k) === fill) this.#flights.delete(k);
    }
  }

  #track(fill: Promise<void>): void {
    this.#running.add(fill);
    void fill.finally(() => this.#running.delete(fill));
  }

  /** A snapshot of the counters. */
  stats(): BlockCacheStats {
    return {
      memoryHits: this.#memoryHits,
      diskHits: this.#diskHits,
      misses: this.#misses,
      coalesced: this.#coalesced,
      fillErrors: this.#fillErrors,
      inFlight: this.#flights.size,
      streamStalls: this.#streamStalls,
      keysKept: this.#keysKept,
    };
  }

  /**
   * Waits for fills in flight (at most `graceMs`: an origin that stopped answering must not hold
   * a shutdown forever; those fills are abandoned) and for pending disk writes.
   */
  async close(graceMs = CLOSE_GRACE_MS): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([
      // Every fill still running: given-up fills have left the flights but may still land a block.
      Promise.allSettled([...this.#running]),
      new Promise<void>((r) => (timer = setTimeout(r, graceMs))),
    ]);
    clearTimeout(timer);
    await this.#disk?.flush();
  }
}

const EMPTY = new Uint8Array(0);

/** Kept block keys of one object version. */
interface KeyStrings {
  readonly origin: string;
  readonly key: string;
  readonly byIndex: Map<number, string>;
}

/** Block keys kept, all objects together: ~100 bytes each (about 25 MiB), the blocks of 2 TiB at 8 MiB. */
export const KEYS_KEPT = 262_144;

/** How long `close()` waits for fills still reading from an origin. */
export const CLOSE_GRACE_MS = 5000;
