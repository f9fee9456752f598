/**
 * @module The lock of a cache directory (`<dir>/lock`): one server per directory, since each
 * keeps its whole `--disk-bytes` budget there, evicts by its own index and removes temporary
 * files it did not write. The kernel's `flock` where the runtime has one, else a pid file.
 */

import { randomBytes } from "node:crypto";
import { link, readFile, realpath, rename, stat, unlink, writeFile } from "node:fs/promises";
import { makeDirs } from "../runtime/make-dirs.ts";

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

/** This process, as a cache directory's lock knows it: its pid, a liveness test for other pids, and the runtime's `flock` where it has one. */
export interface CacheDirOwner {
  readonly pid: number;
  readonly isAlive: (pid: number) => boolean;
  readonly lockFile?: LockFile;
}

/** Ends the line of a lock file written by a server that holds the kernel's lock on it. */
const FLOCK_TAG = "flock";

/**
 * The pid of a lock line (`PID [START@BOOT]...`) when it names another process that runs, and
 * is the same process as far as /proc can tell (a start time that differs: the pid was reused).
 */
async function livePidOf(line: string, owner: CacheDirOwner): Promise<number | undefined> {
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

/**
 * A held cache directory lock, shared by the tiers of this process that use the directory
 * (tests, embedding: several servers in one process): released when the last of them releases it.
 */
export class CacheDirLock {
  readonly #dir: string;
  /** The directory's real path: the key of its lock among this process's tiers. */
  readonly #key: string;
  readonly #onError: (message: string, cause: unknown) => void;
  #released = false;

  private constructor(dir: string, key: string, onError: (message: string, cause: unknown) => void) {
    this.#dir = dir;
    this.#key = key;
    this.#onError = onError;
  }

  /**
   * Takes `<dir>/lock`: two servers on one directory would each keep the whole budget (together
   * twice --disk-bytes), evict each other's files and delete each other's temporary files at
   * start-up. Where the runtime can `flock`, the kernel's lock decides: it ends with its process
   * (kill -9 included) and holds across pid namespaces, so servers in two containers sharing a
   * directory are told apart, which pids cannot do. Elsewhere the file's pid decides (`#lockByPid`).
   *
   * @param owner this process (its pid, a liveness test, the runtime's `flock`); unset: the lock names pid 0
   * @param onError told when the kernel's lock cannot be had and the pid decides instead
   * @throws {CacheDirInUseError} when another live process holds the directory
   */
  static async take(dir: string, owner: CacheDirOwner | undefined, onError: (message: string, cause: unknown) => void): Promise<CacheDirLock> {
    await makeDirs(dir);
    // Servers in this process share the lock by the directory's real path, however it is spelled;
    // their locks and releases run one at a time, so the count below is never raced.
    const lock = new CacheDirLock(dir, await realpath(dir), onError);
    await serial(lock.#key, async () => {
      const shared = HELD.get(lock.#key);
      if (shared !== undefined) {
        shared.users++;
        return;
      }
      const path = `${dir}/lock`;
      // The pid and its process's start time: a pid reused by another process (after a reboot,
      // or a kill -9 long ago) is then not taken for the server that left the lock.
      const mine = owner ? `${owner.pid} ${(await processStartTime(owner.pid)) ?? ""}`.trim() + "\n" : "0\n";
      const fileLock = owner?.lockFile ? await lock.#lockByKernel(path, mine, owner, owner.lockFile) : await lock.#lockByPid(path, mine, owner);
      HELD.set(lock.#key, { users: 1, fileLock });
    });
    return lock;
  }

  async #lockByKernel(path: string, mine: string, owner: CacheDirOwner, lockFile: LockFile): Promise<FileLock | undefined> {
    for (let attempt = 0; attempt < 3; attempt++) {
      let held: FileLock | undefined;
      try {
        held = await lockFile(path);
      } catch (e) {
        // A directory this process may not write is no lock problem: said as what it is (the
        // pid lock would fail on it too, with a message about locking).
        const code = (e as NodeJS.ErrnoException).code;
        if (code === "EACCES" || code === "EPERM" || code === "EROFS") {
          throw new Error(`Cannot write the cache directory ${this.#dir} (${code}): run as a user that may write it, or give another --cache-dir`, { cause: e });
        }
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
  async #lockByPid(path: string, mine: string, owner: CacheDirOwner | undefined): Promise<undefined> {
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

  /** Gives this share of the lock back; the last share removes the lock file and releases the kernel's lock. */
  async release(): Promise<void> {
    if (this.#released) return;
    this.#released = true;
    await serial(this.#key, async () => {
      const held = HELD.get(this.#key);
      if (held && --held.users > 0) return;
      HELD.delete(this.#key);
      // Removed while still locked, then unlocked (see `#lockByKernel`).
      await unlink(`${this.#dir}/lock`).catch(() => {});
      await held?.fileLock?.release();
    });
  }
}
