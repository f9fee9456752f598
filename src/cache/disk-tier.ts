/**
 * @module The NVMe tier: one file per block under the cache directory, each with a header
 * that names its key and a CRC-32 of its payload. Written to a temporary name and renamed,
 * so a block is never torn; verified on every read, so a corrupt block is dropped, never
 * served; its index is rebuilt from the headers at start-up, so a restart keeps the warm cache.
 */

import { createHash, randomBytes } from "node:crypto";
import { crc32 } from "node:zlib";
import { link, mkdir, open, readdir, readFile, realpath, rename, rm, stat, statfs, unlink, writeFile } from "node:fs/promises";

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
  readonly owner?: { readonly pid: number; readonly isAlive: (pid: number) => boolean; readonly lockFile?: LockFile };
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

/** An exclusive advisory lock on an open file (`flock`), which the kernel drops when its process ends, however it ends. */
export interface FileLock {
  /** The inode of the file locked: the path may name another file by the time the lock is taken. */
  readonly ino: number;
  /** Closes the file, which releases the lock. */
  release(): Promise<void>;
}

/**
 * Opens `path` (creating it if missing) and locks it exclusively without waiting.
 *
 * @returns the lock, or undefined when another open file (of any process) holds it
 */
export type LockFile = (path: string) => Promise<FileLock | undefined>;

/** The cache directory is already used by another server (each needs its own budget and files). */
export class CacheDirInUseError extends Error {
  constructor(message: string) {
    super(message);
    this.name = "CacheDirInUseError";
  }
}

/**
 * Cache directories whose lock this process holds, how many tiers use each, and the kernel lock
 * when one was taken. Servers in one process (tests, embedding) share the lock; it is released
 * when the last of them closes.
 */
const HELD = new Map<string, { users: number; readonly fileLock?: FileLock }>();
/** Lock and release of one directory by this process's tiers, one at a time (by real path). */
const LOCKING = new Map<string, Promise<unknown>>();

/** Runs `fn` after every earlier lock or release of `key` in this process has ended. */
function serial<T>(key: string, fn: () => Promise<T>): Promise<T> {
  const run = (LOCKING.get(key) ?? Promise.resolve()).then(fn, fn);
  LOCKING.set(key, run.catch(() => {}));
  return run;
}

/**
 * When process `pid` started (field 22 of `/proc/PID/stat`, clock ticks since boot, with the
 * boot's id so a reboot changes it too); undefined where /proc cannot say (not Linux, no access).
 */
async function processStartTime(pid: number): Promise<string | undefined> {
  try {
    const stat = await readFile(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) is in parentheses and may hold spaces: count from the last ")".
    const start = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
    const boot = (await readFile("/proc/sys/kernel/random/boot_id", "utf8").catch(() => "")).trim().slice(0, 8);
    return start ? `${start}@${boot}` : undefined;
  } catch {
    return undefined;
  }
}

/** How often a repeated write error is reported, and (by default) a budget cut for want of room is checked again. */
const RECHECK_MS = 60_000;
/** Space left free for the file system's other users (logs, temporary files): 2 % of it, at most this. */
const HEADROOM_MAX = 256 * 2 ** 20;

/** This process, for the cache directory's lock. */
type Owner = NonNullable<DiskTierOptions["owner"]>;

/** Ends the line of a lock file written by a server that holds the kernel's lock on it. */
const FLOCK_TAG = "flock";

/**
 * The pid of a lock line (`PID [START@BOOT]...`) when it names another process that runs, and
 * is the same process as far as /proc can tell (a start time that differs: the pid was reused).
 */
async function livePidOf(line: string, owner: Owner): Promise<number | undefined> {
  const [pidText, started] = line.trim().split(/\s+/);
  const pid = Number(pidText);
  if (!Number.isSafeInteger(pid) || pid <= 0 || pid === owner.pid || !owner.isAlive(pid)) return undefined;
  if (started === undefined || started === FLOCK_TAG) return pid;
  const now = await processStartTime(pid);
  return now === undefined || now === started ? pid : undefined;
}

/** The cache directory is held by `pid` (or someone), by the kernel's lock or by a pid lock. */
function inUse(dir: string, pid: number | undefined, byKernel: boolean): CacheDirInUseError {
  return new CacheDirInUseError(
    `Cache directory ${dir} is in use by ${pid !== undefined ? `process ${pid}` : "another process"} (another rackfeed server` +
      (byKernel ? ", on this host or in another container sharing the directory); " : "); ") +
      `give each server its own --cache-dir` +
      (byKernel || pid === undefined ? "" : ` (if no server runs as ${pid}, remove ${dir}/lock)`),
  );
}

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
  /** Whether this tier holds (a share of) the directory's lock. */
  #locked = false;
  /** The directory's real path: the key of its lock among this process's tiers. */
  #lockKey = "";
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
    await tier.#lock(opts.owner);
    try {
      await tier.#rebuild();
      await tier.#fitToDisk();
    } catch (e) {
      await tier.close();
      throw e;
    }
    return tier;
  }

  /**
   * Takes `<dir>/lock`: two servers on one directory would each keep the whole budget (together
   * twice --disk-bytes), evict each other's files and delete each other's temporary files at
   * start-up. Where the runtime can `flock`, the kernel's lock decides: it ends with its process
   * (kill -9 included) and holds across pid namespaces, so servers in two containers sharing a
   * directory are told apart, which pids cannot do. Elsewhere the file's pid decides (`#lockByPid`).
   */
  async #lock(owner: DiskTierOptions["owner"]): Promise<void> {
    await mkdir(this.#dir, { recursive: true });
    // Servers in this process share the lock by the directory's real path, however it is spelled;
    // their locks and releases run one at a time, so the count below is never raced.
    this.#lockKey = await realpath(this.#dir);
    await serial(this.#lockKey, async () => {
      const shared = HELD.get(this.#lockKey);
      if (shared !== undefined) {
        shared.users++;
        this.#locked = true;
        return;
      }
      const path = `${this.#dir}/lock`;
      // The pid and its process's start time: a pid reused by another process (after a reboot,
      // or a kill -9 long ago) is then not taken for the server that left the lock.
      const mine = owner ? `${owner.pid} ${(await processStartTime(owner.pid)) ?? ""}`.trim() + "\n" : "0\n";
      const fileLock = owner?.lockFile ? await this.#lockByKernel(path, mine, owner, owner.lockFile) : await this.#lockByPid(path, mine, owner);
      HELD.set(this.#lockKey, { users: 1, fileLock });
      this.#locked = true;
    });
  }

  async #lockByKernel(path: string, mine: string, owner: Owner, lockFile: LockFile): Promise<FileLock | undefined> {
    for (let attempt = 0; attempt < 3; attempt++) {
      let held: FileLock | undefined;
      try {
        held = await lockFile(path);
      } catch (e) {
        // A file system without flock (NFSv3 without lockd: ENOLCK) still has files: lock by pid there.
        this.#onError(`Cannot flock ${path}; locking the cache directory by pid instead`, e);
        return await this.#lockByPid(path, mine, owner);
      }
      if (!held) {
        // The pid only names the holder in the message (it may belong to another pid namespace).
        const pid = (await readFile(path, "utf8").catch(() => "")).trim().split(/\s+/)[0];
        throw inUse(this.#dir, /^[1-9]\d*$/.test(pid) ? Number(pid) : undefined, true);
      }
      // A server releasing the lock removes the file first and unlocks after: the file just
      // locked may be one removed meanwhile, while a third server locks a new file at the path.
      // Only a lock on the file the path still names counts.
      const now = await stat(path).catch(() => undefined);
      if (now?.ino !== held.ino) {
        await held.release();
        continue;
      }
      try {
        // A line without the flock tag was written by a server that locks by pid (an older
        // release, or Node without koffi): it never takes the flock, so only its line says it runs.
        const seen = await readFile(path, "utf8");
        const pid = seen.trim().split(/\s+/).at(-1) === FLOCK_TAG ? undefined : await livePidOf(seen, owner);
        if (pid !== undefined) throw inUse(this.#dir, pid, false);
        // Who holds it, for operators and for the message above; tagged last, where a server that
        // locks by pid does not look.
        await writeFile(path, `${mine.trim()} ${FLOCK_TAG}\n`);
      } catch (e) {
        await held.release();
        throw e;
      }
      return held;
    }
    throw new CacheDirInUseError(`Cannot lock cache directory ${this.#dir}: ${path} keeps being replaced`);
  }

  /**
   * The lock where the kernel's cannot be had (Node without koffi): created with O_EXCL,
   * holding the pid and the process's start time; one whose process is gone is taken over.
   */
  async #lockByPid(path: string, mine: string, owner: Owner | undefined): Promise<undefined> {
    // The lock appears with its pid in it (link of a file written first): another server never
    // reads an empty lock, which it would take for a dead one's.
    const tmp = `${this.#dir}/lock.${randomBytes(6).toString("hex")}`;
    await writeFile(tmp, mine, { flag: "wx" });
    try {
      for (let attempt = 0; attempt < 3; attempt++) {
        try {
          await link(tmp, path);
          return;
        } catch (e) {
          if ((e as { code?: string }).code !== "EEXIST") throw e;
        }
        const seen = await readFile(path, "utf8").catch(() => "");
        const pid = owner ? await livePidOf(seen, owner) : undefined;
        if (pid !== undefined) throw inUse(this.#dir, pid, false);
        // Left by a server that is gone: move it aside atomically, and make sure what was moved
        // is the lock judged stale, not one another server has just taken (then put it back).
        const aside = `${this.#dir}/lock.stale.${randomBytes(6).toString("hex")}`;
        try {
          await rename(path, aside);
        } catch (e) {
          if ((e as { code?: string }).code === "ENOENT") continue;
          throw e;
        }
        if ((await readFile(aside, "utf8").catch(() => "")) !== seen) {
          await link(aside, path).catch(() => {});
          await unlink(aside).catch(() => {});
          continue;
        }
        await unlink(aside).catch(() => {});
      }
      throw new CacheDirInUseError(`Cannot lock cache directory ${this.#dir}: ${path} keeps coming back`);
    } finally {
      await unlink(tmp).catch(() => {});
    }
  }

  /** Releases the directory (after `flush()`). */
  async close(): Promise<void> {
    clearInterval(this.#recheckTimer);
    this.#recheckTimer = undefined;
    if (!this.#locked) return;
    this.#locked = false;
    await serial(this.#lockKey, async () => {
      const held = HELD.get(this.#lockKey);
      if (held && --held.users > 0) return;
      HELD.delete(this.#lockKey);
      // Removed while still locked, then unlocked (see `#lockByKernel`).
      await unlink(`${this.#dir}/lock`).catch(() => {});
      await held?.fileLock?.release();
    });
  }

  async #rebuild(): Promise<void> {
    // Temporary files belong to writes that never finished: never part of the cache.
    await rm(`${this.#dir}/tmp`, { recursive: true, force: true });
    await mkdir(`${this.#dir}/tmp`, { recursive: true });
    await mkdir(`${this.#dir}/blocks`, { recursive: true });
    const paths: string[] = [];
    for (const sub of await readdir(`${this.#dir}/blocks`)) {
      try {
        for (const name of await readdir(`${this.#dir}/blocks/${sub}`)) paths.push(`${this.#dir}/blocks/${sub}/${name}`);
      } catch {
        continue;
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
        if (!got) {
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
      const fh = await open(entry.path, "r");
      try {
        const size = (await fh.stat()).size;
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
    if (fileBytes > this.#maxBytes || this.#pending.size >= this.#maxPending || keyBytes.length > 4096) {
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
    for (;;) {
      if (this.#index.has(key)) return true;
      const pending = this.#pending.get(key);
      if (pending) {
        await pending;
        return this.#index.has(key);
      }
      if (this.#pending.size < Math.max(1, this.#maxPending)) break;
      await Promise.race(this.#pending.values());
    }
    const keyBytes = new TextEncoder().encode(key);
    const fileBytes = FIXED_HEADER + keyBytes.length + payload.length;
    if (fileBytes > this.#maxBytes || keyBytes.length > 4096) return false;
    const p = this.#write(key, keyBytes, payload, fileBytes).finally(() => this.#pending.delete(key));
    this.#pending.set(key, p);
    await p;
    return this.#index.has(key);
  }

  async #write(key: string, keyBytes: Uint8Array, payload: Uint8Array, fileBytes: number): Promise<void> {
    // Reserve the space first so that concurrent writes cannot together overshoot the budget.
    this.#reserved += fileBytes;
    let failed = false;
    let landed = false;
    const name = createHash("sha256").update(keyBytes).digest("hex");
    const path = `${this.#dir}/blocks/${name.slice(0, 2)}/${name}.blk`;
    const tmp = `${this.#dir}/tmp/${name}.${randomBytes(6).toString("hex")}.tmp`;
    try {
      await this.#evictUntil(0);
      const header = encodeHeader(keyBytes, payload);
      const fh = await open(tmp, "wx").catch(async (e) => {
        if ((e as { code?: string }).code !== "ENOENT") throw e;
        await mkdir(`${this.#dir}/tmp`, { recursive: true }); // removed under us: recreate, once
        return await open(tmp, "wx");
      });
      try {
        // writev may write less (a full disk); a short file would be renamed into place and then
        // fail its check on every read, so it is refused here as the write error it is.
        const { bytesWritten } = await fh.writev([header, payload]);
        if (bytesWritten !== header.length + payload.length) {
          // Only a full file system stops a write to a regular file short.
          throw Object.assign(new Error(`Short write: ${bytesWritten} of ${header.length + payload.length} bytes`), { code: "ENOSPC" });
        }
        this.#landed += fileBytes;
        landed = true;
      } finally {
        await fh.close();
      }
      await mkdir(`${this.#dir}/blocks/${name.slice(0, 2)}`, { recursive: true });
      // rename() is atomic: a reader sees either no file or the whole block.
      await rename(tmp, path);
      this.#index.set(key, { path, fileBytes });
      this.#bytes += fileBytes;
      this.#landed -= fileBytes;
      landed = false;
      this.#writes++;
    } catch (e) {
      this.#writeErrors++;
      await unlink(tmp).catch(() => {});
      if (landed) this.#landed -= fileBytes;
      landed = false;
      // The reservation goes before the fit below, which counts the bytes held, not hoped for.
      this.#reserved -= fileBytes;
      failed = true;
      if ((e as { code?: string }).code === "ENOSPC") {
        // The file system holds less than the budget (a smaller disk, or others filled it): the
        // budget comes down to what fits, so the tier goes on as an LRU of that size instead of
        // failing every write while it keeps its oldest blocks for ever.
        await this.#fitToDisk(true);
      } else {
        this.#reportWriteError(path, e);
      }
    } finally {
      if (!failed) this.#reserved -= fileBytes;
    }
    // Only a write that stored its block can have taken the tier over its budget (one cut
    // meanwhile); a failed one must not evict for the reservations of others in flight.
    if (failed) return;
    await this.#evictUntil(0);
  }

  /** A failing disk fails every write: the first is reported, then one a minute with the count. */
  #reportWriteError(path: string, e: unknown): void {
    const now = this.#now();
    if (now - this.#errorReportedAt < RECHECK_MS) {
      this.#errorsUnreported++;
      return;
    }
    const more = this.#errorsUnreported > 0 ? ` (and ${this.#errorsUnreported} more write errors since the last report)` : "";
    this.#errorReportedAt = now;
    this.#errorsUnreported = 0;
    this.#onError(`Cannot write block file ${path}${more}`, e);
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
   * held. Where the file system cannot be asked (Deno without --allow-sys), a full disk keeps the
   * budget at the bytes held. A change is reported; while the budget is cut, a timer looks again
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
    if (full) room = this.#bytes + this.#landed;
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
    if (budget < this.#configuredBytes && this.#recheckTimer === undefined && this.#locked) {
      this.#recheckTimer = setInterval(() => this.#recheckRoom(), this.#recheckMs);
    } else if (budget >= this.#configuredBytes && this.#recheckTimer !== undefined) {
      clearInterval(this.#recheckTimer);
      this.#recheckTimer = undefined;
    }
    // On the bytes held only: writes in flight are about to fail too, or end with an eviction of their own.
    await this.#evictUntil(-this.#reserved);
  }

  async #evictUntil(extra: number): Promise<void> {
    const doomed: Entry[] = [];
    for (const [key, entry] of this.#index) {
      if (this.#bytes + this.#reserved + extra <= this.#maxBytes) break;
      this.#drop(key, entry);
      this.#evictions++;
      doomed.push(entry);
    }
    // Unlink after leaving the index: a reader holding an open descriptor still reads the
    // whole old file, and a new reader no longer finds it.
    await Promise.all(doomed.map((e) => unlink(e.path).catch(() => {})));
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
  const fh = await open(path, "r");
  try {
    const st = await fh.stat();
    const head = new Uint8Array(Math.min(st.size, MAX_HEADER));
    await fh.read(head, 0, head.length, 0);
    const h = parseHeader(head, st.size);
    return h ? { key: h.key, fileBytes: st.size, mtime: st.mtimeMs } : undefined;
  } finally {
    await fh.close();
  }
}
