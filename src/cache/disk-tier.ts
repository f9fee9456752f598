/**
 * @module The NVMe tier: one file per block under the cache directory, each with a header
 * that names its key and a CRC-32 of its payload. Written to a temporary name and renamed,
 * so a block is never torn; verified on every read, so a corrupt block is dropped, never
 * served; its index is rebuilt from the headers at start-up, so a restart keeps the warm cache.
 */

import { createHash, randomBytes } from "node:crypto";
import { crc32 } from "node:zlib";
import { constants } from "node:fs";
import { dirname } from "node:path";
import { type FileHandle, mkdir, open, readdir, rename, rm, statfs, unlink } from "node:fs/promises";
import { type CacheDirOwner, CacheDirLock } from "./cache-dir-lock.ts";

// Format 2 checks payloads with CRC-32 (zlib's, SIMD: 3–7 GB/s here) instead of format 1's
// SHA-256 (~1.1 GB/s, on the main thread for every block written and read: 18 % of a cold
// fill's CPU). The check is against torn or rotted files, not an adversary: whoever can write
// the cache directory can write any payload with its sum. Format-1 files fail the magic and
// are dropped at start-up like any unreadable block.
const MAGIC = new TextEncoder().encode("RFBLK002");
/** magic(8) + header length u32 + payload length u32 + crc32 of the payload u32 */
const FIXED_HEADER = 8 + 4 + 4 + 4;
const MAX_HEADER = FIXED_HEADER + 4096;

/** Counters of the NVMe tier. */
export interface DiskTierStats {
  readonly bytes: number;
  readonly blocks: number;
  /** The budget in force: `maxBytes` as configured, or less while the file system cannot hold that much. */
  readonly maxBytes: number;
  readonly evictions: number;
  readonly writes: number;
  /** Writes not done because the write queue was full (the block stayed memory-only). */
  readonly writesSkipped: number;
  readonly writeErrors: number;
  /** Blocks found corrupt on read or at start-up, and deleted. */
  readonly corrupt: number;
  readonly pendingWrites: number;
}

/** Options of `DiskTier.open`. */
export interface DiskTierOptions {
  /** The cache directory; created if missing. */
  readonly dir: string;
  /** Byte budget for block files (headers included). */
  readonly maxBytes: number;
  /** Writes in flight at once; more are skipped (counted) rather than queued without bound. */
  readonly maxPendingWrites: number;
  /** Reports unexpected I/O failures (defaults to silence; the counters still move). */
  readonly onError?: (message: string, cause: unknown) => void;
  /** Monotonic clock in ms (default `performance.now`): paces re-checks of a full disk and repeated error reports. */
  readonly now?: () => number;
  /** How often a budget cut for want of room is checked against the file system again, in ms (default a minute). */
  readonly recheckMs?: number;
  /**
   * This process's id, a liveness test and, where the runtime has one, a kernel file lock: a
   * directory locked by another live process is refused.
   */
  readonly owner?: CacheDirOwner;
  /**
   * The size of the file system holding the directory (`statfs`), or undefined where it cannot
   * be read (Deno without --allow-sys: its host answers undefined rather than prompt). Default: node:fs's.
   */
  readonly fileSystem?: (dir: string) => Promise<FileSystemSize | undefined>;
}

/** What `DiskTier` reads of `statfs`: blocks, their size, and those free to unprivileged users. */
export interface FileSystemSize {
  readonly blocks: number;
  readonly bsize: number;
  readonly bavail: number;
}

/** How often a repeated write error is reported, and (by default) a budget cut for want of room is checked again. */
const RECHECK_MS = 60_000;
/** Space left free for the file system's other users (logs, temporary files): 2 % of it, at most this. */
const HEADROOM_MAX = 256 * 2 ** 20;

/**
 * How block files are opened for reading. A FIFO where a block file should be would block a
 * plain open for ever (start-up hung, silently, rebuilding the index); O_NONBLOCK opens it at
 * once, and the regular-file check after fstat refuses it. A symlink is refused (ELOOP) rather
 * than followed to whatever file it names. Both runtimes pass these through node:fs (Deno's
 * compat included) and neither changes anything for a regular file.
 */
const BLOCK_OPEN_FLAGS = constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOFOLLOW;

/** Block-file headers read at once while the index is rebuilt at start-up. */
const REBUILD_READS = 32;

interface Entry {
  readonly path: string;
  readonly fileBytes: number;
}

/**
 * Block files under `<dir>/blocks/<2 hex>/<sha256(key)>.blk`, least recently used evicted
 * first to stay within `maxBytes`.
 *
 * @example
 * ```ts
 * const disk = await DiskTier.open({ dir: "/nvme/rackfeed", maxBytes: 64 * 2 ** 30, maxPendingWrites: 8 });
 * disk.write("k", bytes);
 * const back = await disk.read("k");
 * ```
 */
export class DiskTier {
  readonly #dir: string;
  /** The directory's lock (a share of it), while this tier holds it. */
  #dirLock: CacheDirLock | undefined;
  /** `--disk-bytes`, and the budget in force (less while the file system has no room for it, see `#fitToDisk`). */
  readonly #configuredBytes: number;
  #maxBytes: number;
  readonly #maxPending: number;
  readonly #onError: (message: string, cause: unknown) => void;
  readonly #now: () => number;
  #fitting: Promise<void> | undefined;
  /** A write found the disk full since the last check. */
  #fullSeen = false;
  #fitCheckedAt = -Infinity;
  #recheckTimer: ReturnType<typeof setInterval> | undefined;
  readonly #recheckMs: number;
  readonly #fileSystem: ((dir: string) => Promise<FileSystemSize | undefined>) | undefined;
  /** When a write error was last reported, and how many went unreported since. */
  #errorReportedAt = -Infinity;
  #errorsUnreported = 0;
  /** Map order is recency order: first entry is the least recently used. */
  readonly #index = new Map<string, Entry>();
  readonly #pending = new Map<string, Promise<void>>();
  #bytes = 0;
  #reserved = 0;
  /** Bytes of temporary block files written whole and not yet renamed into place (or removed). */
  #landed = 0;
  /** Bytes of writes whose payload is being written (the temporary file open, the writev not yet back). */
  #writing = 0;
  #evictions = 0;
  #writes = 0;
  #writesSkipped = 0;
  #writeErrors = 0;
  #corrupt = 0;

  private constructor(opts: DiskTierOptions) {
    this.#dir = opts.dir.replace(/\/+$/, "");
    this.#maxBytes = this.#configuredBytes = opts.maxBytes;
    this.#maxPending = opts.maxPendingWrites;
    this.#onError = opts.onError ?? (() => {});
    this.#now = opts.now ?? (() => performance.now());
    this.#recheckMs = opts.recheckMs ?? RECHECK_MS;
    this.#fileSystem = opts.fileSystem;
  }

  /**
   * Opens (or creates) a cache directory and rebuilds the index from the block headers,
   * oldest-modified first, deleting files that are torn or not block files.
   *
   * @param opts directory, budget and write queue bound
   * @returns the tier, ready to use
   * @throws {RangeError} on a bad option
   */
  static async open(opts: DiskTierOptions): Promise<DiskTier> {
    if (!Number.isSafeInteger(opts.maxBytes) || opts.maxBytes <= 0) {
      throw new RangeError(`Cannot create DiskTier: maxBytes must be a positive integer, received ${opts.maxBytes}`);
    }
    if (!Number.isSafeInteger(opts.maxPendingWrites) || opts.maxPendingWrites < 0) {
      throw new RangeError(
        `Cannot create DiskTier: maxPendingWrites must be an integer >= 0, received ${opts.maxPendingWrites}`,
      );
    }
    if (opts.recheckMs !== undefined && (!Number.isSafeInteger(opts.recheckMs) || opts.recheckMs <= 0)) {
      throw new RangeError(`Cannot create DiskTier: recheckMs must be a positive integer, received ${opts.recheckMs}`);
    }
    const tier = new DiskTier(opts);
    tier.#dirLock = await CacheDirLock.take(tier.#dir, opts.owner, tier.#onError);
    try {
      await tier.#rebuild();
      await tier.#fitToDisk();
    } catch (e) {
      await tier.close();
      throw e;
    }
    return tier;
  }

  /** Releases the directory (after `flush()`). */
  async close(): Promise<void> {
    clearInterval(this.#recheckTimer);
    this.#recheckTimer = undefined;
    const lock = this.#dirLock;
    this.#dirLock = undefined;
    await lock?.release();
  }

  async #rebuild(): Promise<void> {
    // Temporary files belong to writes that never finished: never part of the cache.
    await rm(`${this.#dir}/tmp`, { recursive: true, force: true });
    await mkdir(`${this.#dir}/tmp`, { recursive: true });
    await mkdir(`${this.#dir}/blocks`, { recursive: true });
    const paths: string[] = [];
    for (const sub of await readdir(`${this.#dir}/blocks`, { withFileTypes: true })) {
      if (!sub.isDirectory()) continue;
      let names;
      try {
        names = await readdir(`${this.#dir}/blocks/${sub.name}`, { withFileTypes: true });
      } catch {
        continue;
      }
      for (const f of names) {
        const path = `${this.#dir}/blocks/${sub.name}/${f.name}`;
        if (f.isFile()) {
          paths.push(path);
        } else if (f.isDirectory()) {
          // Never ours to remove (it may hold someone's files); it only shadows one block's path.
          this.#onError(`Left directory ${path} in place: not a block file`, undefined);
        } else {
          // A FIFO, socket, device or symlink: never a block file, and opening one could block
          // (a FIFO without a writer) or read some other file (a symlink). Removed like a corrupt block.
          this.#corrupt++;
          this.#onError(`Removed ${path}: not a regular file, so not a block file`, undefined);
          await unlink(path).catch(() => {});
        }
      }
    }
    // Headers are read REBUILD_READS at a time: one by one, a 2 TiB tier of 8 MiB blocks took
    // ~50 s to open (~190 µs per file here), long enough for a liveness probe to restart it.
    const found: { key: string; entry: Entry; mtime: number }[] = [];
    let next = 0;
    const reader = async () => {
      while (next < paths.length) {
        const path = paths[next++];
        const got = await readHeaderOf(path).catch(() => undefined);
        // A file must sit at its own key's path: one copied or renamed over another block's
        // path would otherwise be indexed as well as (and counted twice with) its key's own file,
        // and, overwritten in the index, never evicted or removed until a restart. Being the
        // key's one path, this also allows one file per key.
        if (!got || path !== this.#blockPath(blockName(got.key))) {
          this.#corrupt++;
          await unlink(path).catch(() => {});
          continue;
        }
        found.push({ key: got.key, entry: { path, fileBytes: got.fileBytes }, mtime: got.mtime });
      }
    };
    await Promise.all(Array.from({ length: Math.min(REBUILD_READS, paths.length) }, reader));
    found.sort((a, b) => a.mtime - b.mtime);
    for (const f of found) {
      this.#index.set(f.key, f.entry);
      this.#bytes += f.entry.fileBytes;
    }
    await this.#evictUntil(0);
  }

  /** Where the block file named `name` (see `blockName`) lives. */
  #blockPath(name: string): string {
    return `${this.#dir}/blocks/${name.slice(0, 2)}/${name}.blk`;
  }

  /** True when a block file for `key` is indexed. */
  has(key: string): boolean {
    return this.#index.has(key);
  }

  /**
   * Whether a block file for `key` is indexed, marking it used now (as a read does): a prefetch
   * that finds its block already here must not leave it first in line for eviction.
   */
  touch(key: string): boolean {
    const entry = this.#index.get(key);
    if (!entry) return false;
    this.#index.delete(key);
    this.#index.set(key, entry);
    return true;
  }

  /**
   * Reads and verifies a block. A block whose checksum, length or key does not match is
   * deleted and reported as absent, so the caller refetches it from the origin.
   *
   * @returns the payload, or `undefined` when absent or corrupt
   */
  async read(key: string): Promise<Uint8Array | undefined> {
    const entry = this.#index.get(key);
    if (!entry) return undefined;
    this.#index.delete(key);
    this.#index.set(key, entry);
    let file: Uint8Array;
    try {
      const fh = await open(entry.path, BLOCK_OPEN_FLAGS);
      try {
        const st = await fh.stat();
        if (!st.isFile()) throw Object.assign(new Error(`Not a regular file: ${entry.path}`), { code: "EFTYPE" });
        const size = st.size;
        file = new Uint8Array(size);
        let done = 0;
        while (done < size) {
          const { bytesRead } = await fh.read(file, done, size - done, done);
          if (bytesRead === 0) break;
          done += bytesRead;
        }
        // Recency survives a restart through mtime; a failure here only costs ordering.
        const now = new Date();
        await fh.utimes(now, now).catch(() => {});
      } finally {
        await fh.close();
      }
    } catch (e) {
      // Evicted between the index lookup and the open (ENOENT) is an ordinary miss. Out of file
      // descriptors (EMFILE, ENFILE) passes: the entry stays, with its file still counted
      // against the budget. Anything else (EIO, EACCES) will not pass: the entry and its file go,
      // so the block is written afresh from the origin instead of failing every read.
      const code = (e as { code?: string }).code;
      if (code !== "ENOENT") this.#onError(`Cannot read block file ${entry.path}`, e);
      if (code !== "EMFILE" && code !== "ENFILE") {
        this.#drop(key, entry);
        if (code !== "ENOENT") await unlink(entry.path).catch(() => {});
      }
      return undefined;
    }
    const payload = verifyBlockFile(file, key);
    if (!payload) {
      this.#corrupt++;
      this.#onError(`Dropped corrupt block file ${entry.path} (checksum, length or key mismatch)`, undefined);
      this.#drop(key, entry);
      await unlink(entry.path).catch(() => {});
      return undefined;
    }
    return payload;
  }

  /**
   * Stores a block in the background. Returns false (and counts it) when the block is
   * already stored or being stored, larger than the budget, or the write queue is full.
   */
  write(key: string, payload: Uint8Array): boolean {
    if (this.#index.has(key) || this.#pending.has(key)) return false;
    this.#recheckRoom();
    const keyBytes = new TextEncoder().encode(key);
    const fileBytes = FIXED_HEADER + keyBytes.length + payload.length;
    // The writes in flight hold their reservations until they end, and evicting can free only
    // what is indexed: a write that does not fit beside them would take the tier over its
    // budget, and on a nearly full disk fail for want of room, cutting the budget for nothing.
    if (fileBytes + this.#reserved > this.#maxBytes || this.#pending.size >= this.#maxPending || keyBytes.length > 4096) {
      this.#writesSkipped++;
      return false;
    }
    const p = this.#write(key, keyBytes, payload, fileBytes).finally(() => this.#pending.delete(key));
    this.#pending.set(key, p);
    return true;
  }

  /**
   * Stores a block, waiting for a write slot rather than skipping (prefetch into the NVMe tier).
   *
   * @returns true once the block file is in place (also when it already was)
   */
  async writeAndWait(key: string, payload: Uint8Array): Promise<boolean> {
    this.#recheckRoom();
    const keyBytes = new TextEncoder().encode(key);
    const fileBytes = FIXED_HEADER + keyBytes.length + payload.length;
    for (;;) {
      if (this.#index.has(key)) return true;
      const pending = this.#pending.get(key);
      if (pending) {
        await pending;
        return this.#index.has(key);
      }
      // A slot, and room in the budget beside the writes in flight (see write()); with none in
      // flight it goes ahead, and the budget alone decides below.
      if (this.#pending.size === 0) break;
      if (this.#pending.size < this.#maxPending && fileBytes + this.#reserved <= this.#maxBytes) break;
      await Promise.race(this.#pending.values());
    }
    if (fileBytes > this.#maxBytes || keyBytes.length > 4096) return false;
    const p = this.#write(key, keyBytes, payload, fileBytes).finally(() => this.#pending.delete(key));
    this.#pending.set(key, p);
    await p;
    return this.#index.has(key);
  }

  async #write(key: string, keyBytes: Uint8Array, payload: Uint8Array, fileBytes: number): Promise<void> {
    // Reserve the space first (synchronously, in the caller's turn) so that concurrent writes
    // cannot together overshoot the budget.
    this.#reserved += fileBytes;
    let writing = false;
    let landed = false;
    let stored = false;
    let error: unknown;
    let fh: FileHandle | undefined;
    const name = blockName(keyBytes);
    const path = this.#blockPath(name);
    const tmp = `${this.#dir}/tmp/${name}.${randomBytes(6).toString("hex")}.tmp`;
    try {
      fh = await open(tmp, "wx").catch(async (e) => {
        if ((e as { code?: string }).code !== "ENOENT") throw e;
        await mkdir(`${this.#dir}/tmp`, { recursive: true }); // removed under us: recreate, once
        return await open(tmp, "wx");
      });
      // Evict only once the temporary file is open: in a directory that cannot be written (a
      // read-only remount, a failing disk) the unlinks fail too, and evicting first dropped good
      // blocks from the index, for every failed write, while their files stayed.
      await this.#evictUntil(0);
      if (this.#bytes + this.#reserved > this.#maxBytes) {
        // The budget was cut since this write was admitted (a full disk) or a block would not
        // go: no room even after evicting, so the block stays memory-only.
        this.#writesSkipped++;
      } else {
        const header = encodeHeader(keyBytes, payload);
        this.#writing += fileBytes;
        writing = true;
        // writev may write less (a full disk); a short file would be renamed into place and then
        // fail its check on every read, so it is refused here as the write error it is.
        const { bytesWritten } = await fh.writev([header, payload]);
        if (bytesWritten !== header.length + payload.length) {
          // Only a full file system stops a write to a regular file short.
          throw Object.assign(new Error(`Short write: ${bytesWritten} of ${header.length + payload.length} bytes`), { code: "ENOSPC" });
        }
        this.#writing -= fileBytes;
        writing = false;
        this.#landed += fileBytes;
        landed = true;
        const done = fh;
        fh = undefined;
        await done.close();
        await mkdir(dirname(path), { recursive: true });
        // rename() is atomic: a reader sees either no file or the whole block.
        await rename(tmp, path);
        this.#index.set(key, { path, fileBytes });
        this.#bytes += fileBytes;
        this.#landed -= fileBytes;
        landed = false;
        this.#writes++;
        stored = true;
      }
    } catch (e) {
      this.#writeErrors++;
      error = e;
    }
    // The bytes this write counted go before the fit below, which counts the bytes held, landed
    // and being written by the others, not this one's.
    if (writing) this.#writing -= fileBytes;
    if (landed) this.#landed -= fileBytes;
    await fh?.close().catch(() => {});
    if (!stored) await unlink(tmp).catch(() => {});
    this.#reserved -= fileBytes;
    if (error !== undefined) {
      if ((error as { code?: string }).code === "ENOSPC") {
        // The file system holds less than the budget (a smaller disk, or others filled it): the
        // budget comes down to what fits, so the tier goes on as an LRU of that size instead of
        // failing every write while it keeps its oldest blocks for ever.
        await this.#fitToDisk(true);
      } else {
        this.#reportWriteError(`Cannot write block file ${path}`, error);
      }
    }
    // Only a write that stored its block can have taken the tier over its budget (one cut
    // meanwhile); a failed one must not evict for the reservations of others in flight.
    if (stored) await this.#evictUntil(0);
  }

  /** A failing disk fails every write: the first is reported, then one a minute with the count. */
  #reportWriteError(message: string, e: unknown): void {
    const now = this.#now();
    if (now - this.#errorReportedAt < RECHECK_MS) {
      this.#errorsUnreported++;
      return;
    }
    const more = this.#errorsUnreported > 0 ? ` (and ${this.#errorsUnreported} more write errors since the last report)` : "";
    this.#errorReportedAt = now;
    this.#errorsUnreported = 0;
    this.#onError(`${message}${more}`, e);
  }

  /** While the budget is cut, looks again (at most once a minute) whether the file system has room for more. */
  #recheckRoom(): void {
    if (this.#maxBytes < this.#configuredBytes && this.#now() - this.#fitCheckedAt >= this.#recheckMs) void this.#fitToDisk();
  }

  /**
   * Sets the budget to what the file system can hold (see `#fit`), one check at a time. A full
   * disk seen while a routine check is under way gets a check of its own after it.
   *
   * @param full a write has just found the file system full
   */
  async #fitToDisk(full = false): Promise<void> {
    if (full) this.#fullSeen = true;
    for (;;) {
      this.#fitting ??= this.#fit().finally(() => (this.#fitting = undefined));
      await this.#fitting;
      if (!full || !this.#fullSeen) return;
    }
  }

  /**
   * The budget becomes the block files we have plus the file system's free space, less headroom
   * for its other users, never more than configured; after a full disk, no more than the bytes
   * held (and being written). Where the file system cannot be asked (Deno without --allow-sys), a
   * full disk keeps the budget at the bytes held. A change is reported; while the budget is cut, a timer looks again
   * every minute, so an idle server's budget (and the prefetch jobs it accepts) grows back too.
   */
  async #fit(): Promise<void> {
    const full = this.#fullSeen;
    this.#fullSeen = false;
    // Only routine checks set the clock of the next one: full disks seen more often than that
    // must not postpone it for ever (it is what gives the headroom back to others).
    if (!full) this.#fitCheckedAt = this.#now();
    const fs = await (this.#fileSystem ?? statfs)(this.#dir).catch(() => undefined);
    let room: number;
    if (fs) {
      const headroom = Math.min(HEADROOM_MAX, Math.floor(fs.blocks * fs.bsize * 0.02));
      // Temporary files written whole but not yet in place are ours too: a check during a burst
      // of writes must not take their bytes for others' and evict for them. Counting what is
      // only reserved would count it twice (it is still free space). Writes half done make the
      // room a little low, which costs at most an early eviction.
      room = Math.max(0, this.#bytes + this.#landed + fs.bavail * fs.bsize - headroom);
    } else {
      room = full ? this.#bytes : this.#configuredBytes;
    }
    // A write that found the disk full must not be tried again at the same size: the budget
    // comes down to the bytes held (block files written whole but not yet renamed included), and
    // not below. A full disk reads as no free space at all (often less than the headroom: writes
    // half done in the same burst take what was left), which would otherwise cost a block for
    // every burst of failed writes; the next routine check restores the headroom.
    //
    // Writes of the same burst still in their writev count as held too: their bytes are mostly
    // on disk already, and they land after this cut. Cut below them, each evicted a block as it
    // landed (with the budget at 0, everything: a burst of 8 writes into 4 MiB free left the tier
    // empty and the space free). The free space the file system reports is not added: an ENOSPC
    // with bytes free (no inodes left) is cured by evicting, and a routine check adds it back.
    if (full) room = this.#bytes + this.#landed + this.#writing;
    const budget = Math.min(this.#configuredBytes, room);
    const before = this.#maxBytes;
    this.#maxBytes = budget;
    if (budget < before) {
      this.#onError(
        `NVMe tier: the file system under ${this.#dir} has room for ${mib(room)} of block files, less than --disk-bytes ` +
          `${mib(this.#configuredBytes)}; the tier keeps at most ${mib(budget)} (looked at again every minute)`,
        undefined,
      );
    } else if (budget > before) {
      this.#onError(
        budget === this.#configuredBytes
          ? `NVMe tier: the file system under ${this.#dir} has room for --disk-bytes ${mib(budget)} again`
          : `NVMe tier: the file system under ${this.#dir} has more room; the tier keeps at most ${mib(budget)} (--disk-bytes ${mib(this.#configuredBytes)})`,
        undefined,
      );
    }
    if (budget < this.#configuredBytes && this.#recheckTimer === undefined && this.#dirLock !== undefined) {
      this.#recheckTimer = setInterval(() => this.#recheckRoom(), this.#recheckMs);
    } else if (budget >= this.#configuredBytes && this.#recheckTimer !== undefined) {
      clearInterval(this.#recheckTimer);
      this.#recheckTimer = undefined;
    }
    // On the bytes held only: writes in flight are about to fail too, or end with an eviction of their own.
    await this.#evictUntil(-this.#reserved);
  }

  async #evictUntil(extra: number): Promise<void> {
    const doomed: [string, Entry][] = [];
    for (const [key, entry] of this.#index) {
      if (this.#bytes + this.#reserved + extra <= this.#maxBytes) break;
      this.#drop(key, entry);
      this.#evictions++;
      doomed.push([key, entry]);
    }
    // Unlink after leaving the index: a reader holding an open descriptor still reads the
    // whole old file, and a new reader no longer finds it.
    await Promise.all(doomed.map(([key, entry]) =>
      unlink(entry.path).catch((e) => {
        if ((e as { code?: string }).code === "ENOENT") return;
        // The file stays (a read-only or failing directory), so its entry comes back: dropped,
        // its bytes would be on disk, uncounted and never evicted, until a restart. It comes
        // back as the most recently used, so the next eviction tries other blocks first rather
        // than fail on this one every time.
        this.#evictions--;
        if (!this.#index.has(key)) {
          this.#index.set(key, entry);
          this.#bytes += entry.fileBytes;
        }
        this.#reportWriteError(`Cannot remove block file ${entry.path}`, e);
      })
    ));
  }

  #drop(key: string, entry: Entry): void {
    if (this.#index.get(key) === entry) {
      this.#index.delete(key);
      this.#bytes -= entry.fileBytes;
    }
  }

  /** Waits for the writes in flight (used at shutdown and by tests). */
  async flush(): Promise<void> {
    while (this.#pending.size > 0) await Promise.all([...this.#pending.values()]);
  }

  /** A snapshot of the counters. */
  stats(): DiskTierStats {
    return {
      bytes: this.#bytes,
      blocks: this.#index.size,
      maxBytes: this.#maxBytes,
      evictions: this.#evictions,
      writes: this.#writes,
      writesSkipped: this.#writesSkipped,
      writeErrors: this.#writeErrors,
      corrupt: this.#corrupt,
      pendingWrites: this.#pending.size,
    };
  }

  /** Paths of the indexed block files, least recently used first (for tests and tools). */
  files(): string[] {
    return [...this.#index.values()].map((e) => e.path);
  }
}

/** Bytes as MiB for messages. */
function mib(bytes: number): string {
  return `${(bytes / 2 ** 20).toFixed(1)} MiB`;
}

/** A block file's name: the SHA-256 of its key (the same for the key's string and its UTF-8 bytes). */
function blockName(key: string | Uint8Array): string {
  return createHash("sha256").update(key).digest("hex");
}

function encodeHeader(keyBytes: Uint8Array, payload: Uint8Array): Uint8Array {
  const header = new Uint8Array(FIXED_HEADER + keyBytes.length);
  const view = new DataView(header.buffer);
  header.set(MAGIC, 0);
  view.setUint32(8, header.length, true);
  view.setUint32(12, payload.length, true);
  view.setUint32(16, crc32(payload), true);
  header.set(keyBytes, FIXED_HEADER);
  return header;
}

/** Returns the payload view when the whole file is a valid block for `key`, else undefined. */
function verifyBlockFile(file: Uint8Array, key: string): Uint8Array | undefined {
  const h = parseHeader(file, file.length);
  if (!h || h.key !== key) return undefined;
  const payload = file.subarray(h.headerBytes);
  const view = new DataView(file.buffer, file.byteOffset, file.byteLength);
  return crc32(payload) === view.getUint32(16, true) ? payload : undefined;
}

function parseHeader(
  head: Uint8Array,
  fileBytes: number,
): { key: string; headerBytes: number } | undefined {
  if (head.length < FIXED_HEADER) return undefined;
  for (let i = 0; i < MAGIC.length; i++) if (head[i] !== MAGIC[i]) return undefined;
  const view = new DataView(head.buffer, head.byteOffset, head.byteLength);
  const headerBytes = view.getUint32(8, true);
  const payloadBytes = view.getUint32(12, true);
  if (headerBytes < FIXED_HEADER || headerBytes > MAX_HEADER || headerBytes > head.length) return undefined;
  if (headerBytes + payloadBytes !== fileBytes) return undefined;
  let key: string;
  try {
    key = new TextDecoder("utf-8", { fatal: true }).decode(head.subarray(FIXED_HEADER, headerBytes));
  } catch {
    return undefined;
  }
  return { key, headerBytes };
}

async function readHeaderOf(path: string): Promise<{ key: string; fileBytes: number; mtime: number } | undefined> {
  const fh = await open(path, BLOCK_OPEN_FLAGS);
  try {
    const st = await fh.stat();
    if (!st.isFile()) return undefined;
    const head = new Uint8Array(Math.min(st.size, MAX_HEADER));
    await fh.read(head, 0, head.length, 0);
    const h = parseHeader(head, st.size);
    return h ? { key: h.key, fileBytes: st.size, mtime: st.mtimeMs } : undefined;
  } finally {
    await fh.close();
  }
}
