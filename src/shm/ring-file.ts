/**
 * @module A ring file under `--shm-dir`, opened by the server for writing: mapped when the runtime
 * can map files (batches are then assembled straight into the slot, one copy), else written with
 * positional writes from a reused scratch buffer.
 */

import * as fs from "node:fs";
import type { FileLock, LockFile } from "../cache/cache-dir-lock.ts";
import { encodeRingHeader, type RingLayout, SLOT_HEADER_BYTES, type SlotHeader, slotHeaderOffset, writeSlotHeader } from "./protocol.ts";

/** Maps `bytes` bytes of a file shared and writable; `unmap` must be called once nothing reads the view. */
export type MapFile = (path: string, bytes: number) => { readonly bytes: Uint8Array; unmap(): void };

/** Prefix of ring file names; `rackfeed-ring-<server pid>-<instance>-<n>.ring` (`.spare` while kept for the next consumer). */
export const RING_PREFIX = "rackfeed-ring-";

/** The shm directory has no room for a ring (a small tmpfs, e.g. a container's 64 MiB /dev/shm). */
export class RingSpaceError extends Error {
  constructor(readonly path: string, readonly bytes: number) {
    super(`No room for a ring of ${bytes} bytes at ${path} (ENOSPC)`);
    this.name = "RingSpaceError";
  }
}

/**
 * The zeros rings are allocated with, one buffer for all (only ever read): a new MiB per ring was
 * external memory per consumer, which V8 answers with full collections.
 */
const ZEROS = new Uint8Array(1 << 20);

/**
 * Writes zeros over the whole file, so that tmpfs allocates every page now: a sparse ring on a
 * full tmpfs would fail later, and a write through a mapping then kills the process (SIGBUS)
 * instead of returning ENOSPC. The writes run on the runtime's I/O threads, a MiB at a time: a
 * ring of a GiB or two took the event loop (every other consumer's batches) for seconds.
 */
async function allocate(fd: number, bytes: number, signal: AbortSignal | undefined): Promise<void> {
  const zeros = ZEROS.subarray(0, Math.min(bytes, ZEROS.length));
  for (let at = 0; at < bytes;) {
    signal?.throwIfAborted();
    at += await new Promise<number>((resolve, reject) =>
      fs.write(fd, zeros, 0, Math.min(zeros.length, bytes - at), at, (e, written) => (e ? reject(e) : resolve(written)))
    );
  }
}

/** One consumer's ring, owned by the server. */
export class RingFile {
  #path: string;
  readonly layout: RingLayout;
  readonly #fd: number;
  readonly #map: ReturnType<MapFile> | undefined;
  readonly #mapView: DataView | undefined;
  /** The header written with pwrite when the ring is not mapped. */
  readonly #header = new DataView(new ArrayBuffer(SLOT_HEADER_BYTES));
  #scratch: Uint8Array | undefined;
  /** Each mapped slot's view, as `target` last made it (dropped at `close`). */
  #views: Uint8Array[] = [];
  #closed = false;

  /**
   * Creates the file (exclusively: a name left by a dead process is removed first), allocates
   * its pages and writes its header.
   *
   * @param path where, under the shm directory
   * @param layout slot count and sizes
   * @param mapFile the runtime's file mapping, if it has one
   * @param signal stops the allocation (the peer left, the server stops): the file is removed
   * @throws {RingSpaceError} when the directory has no room for it
   * @throws the signal's reason when it aborts first
   */
  static async create(path: string, layout: RingLayout, mapFile: MapFile | undefined, signal?: AbortSignal): Promise<RingFile> {
    let fd: number;
    try {
      try {
        fd = fs.openSync(path, "wx", 0o640);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
        fs.rmSync(path, { force: true });
        fd = fs.openSync(path, "wx", 0o640);
      }
    } catch (e) {
      // No inode left (a tmpfs's nr_inodes) or a quota: no room, as ENOSPC on the pages.
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ENOSPC" || code === "EDQUOT") throw new RingSpaceError(path, layout.fileBytes);
      throw e;
    }
    try {
      await allocate(fd, layout.fileBytes, signal);
      fs.writeSync(fd, encodeRingHeader(layout), 0, undefined, 0);
      return new RingFile(path, layout, fd, mapFile?.(path, layout.fileBytes));
    } catch (e) {
      fs.closeSync(fd);
      fs.rmSync(path, { force: true });
      if ((e as NodeJS.ErrnoException).code === "ENOSPC") throw new RingSpaceError(path, layout.fileBytes);
      throw e;
    }
  }

  private constructor(path: string, layout: RingLayout, fd: number, map: ReturnType<MapFile> | undefined) {
    this.#path = path;
    this.layout = layout;
    this.#fd = fd;
    this.#map = map;
    if (map) this.#mapView = new DataView(map.bytes.buffer, map.bytes.byteOffset, map.bytes.byteLength);
  }

  /** The file's name now (a ring kept for the next consumer is renamed, see `rename`). */
  get path(): string {
    return this.#path;
  }

  /**
   * Makes the ring ready for another consumer: every slot header zeroed, so no slot is published
   * (a new consumer's generations start at 1, and an old header could otherwise be taken for one
   * of them). Its pages and mapping stay: a new ring costs page allocation (~1 ms for 4 MiB here)
   * and a mapping that V8 counts as external memory, which it answers with full collections.
   * Call only when no fill is writing into `target()`.
   */
  resetSlots(): void {
    const from = slotHeaderOffset(0);
    const to = slotHeaderOffset(this.layout.slots);
    if (this.#map) this.#map.bytes.fill(0, from, to);
    else fs.writeSync(this.#fd, ZEROS.subarray(0, to - from), 0, to - from, from);
  }

  /** Renames the file (out of the ring names clients are given while spare, then to a new ring name). */
  rename(path: string): void {
    fs.renameSync(this.#path, path);
    this.#path = path;
  }

  /**
   * Whether batches are assembled in their slots (a mapped ring). Else every slot's batch goes
   * through one scratch buffer, written out by `publish`: one slot at a time.
   */
  get inPlace(): boolean {
    return this.#map !== undefined;
  }

  /**
   * Where slot `i`'s batch is assembled: the mapped slot itself, or the scratch buffer later
   * copied in; its first `length` bytes (default: all of it). A mapped slot's view is kept
   * while its length stays the same, as it does for a consumer's batches: a view per step was
   * garbage per step.
   */
  target(slot: number, length = this.layout.slotBytes): Uint8Array {
    if (length < 0 || length > this.layout.slotBytes) throw new RangeError(`A slot of ${this.layout.slotBytes} bytes has no view of ${length}`);
    if (this.#map) {
      const kept = this.#views[slot];
      if (kept !== undefined && kept.length === length) return kept;
      const at = this.layout.dataOffset + slot * this.layout.slotBytes;
      return (this.#views[slot] = this.#map.bytes.subarray(at, at + length));
    }
    this.#scratch ??= new Uint8Array(this.layout.slotBytes);
    return length === this.#scratch.length ? this.#scratch : this.#scratch.subarray(0, length);
  }

  /**
   * Publishes slot `i`: its data (written to the file unless it was assembled in place), then the
   * rest of its header, then the header's generation. A client polling the header accepts the
   * slot only when the generation is the one it expects, so the generation is stored last (and
   * on its own: a header copied in one piece could be seen half old, half new).
   */
  publish(slot: number, body: Uint8Array, header: SlotHeader): void {
    const at = slotHeaderOffset(slot);
    if (this.#mapView) {
      writeSlotHeader(this.#mapView, at, header);
      return;
    }
    fs.writeSync(this.#fd, body, 0, body.length, this.layout.dataOffset + slot * this.layout.slotBytes);
    writeSlotHeader(this.#header, 0, header);
    const h = new Uint8Array(this.#header.buffer);
    fs.writeSync(this.#fd, h, 8, SLOT_HEADER_BYTES - 8, at + 8);
    fs.writeSync(this.#fd, h, 0, 8, at);
  }

  /** Removes the file's name; the mapping and the pages stay until `close()`. */
  unlink(): void {
    fs.rmSync(this.#path, { force: true });
  }

  /** Unmaps, closes and removes the file. Call only when no fill is writing into `target()`. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#views = [];
    this.#map?.unmap();
    fs.closeSync(this.#fd);
    fs.rmSync(this.#path, { force: true });
  }
}

/**
 * The lock file of a server's rings (`rackfeed-ring-<pid>-<instance>.lock`), which the server
 * holds locked (`flock`) while it runs. A server in another pid namespace (two containers that
 * share the directory) is then told apart by its lock, not by a pid this one cannot see.
 */
export function ringOwnerLockPath(dir: string, pid: number, instance: string): string {
  return `${dir}/${ringOwnerLockName(pid, instance)}`;
}

function ringOwnerLockName(pid: number, instance: string): string {
  return `${RING_PREFIX}${pid}-${instance}.lock`;
}

/** Gives this server's ring lock back: the file first, then the lock, so a sweep never finds the file unlocked while the server lives. */
export async function releaseRingOwnerLock(dir: string, pid: number, instance: string, lock: FileLock | undefined): Promise<void> {
  fs.rmSync(ringOwnerLockPath(dir, pid, instance), { force: true });
  await lock?.release();
}

/**
 * Takes this server's ring lock: locked under a temporary name, then renamed into place, so
 * that another server's sweep never finds the file unlocked (and takes this server for dead).
 *
 * @returns the lock (release it after removing the file), or undefined where the file system has no flock
 */
export async function takeRingOwnerLock(dir: string, pid: number, instance: string, lockFile: LockFile): Promise<FileLock | undefined> {
  const tmp = `${dir}/.${RING_PREFIX}${pid}-${instance}.lock.tmp`;
  let lock: FileLock | undefined;
  try {
    lock = await lockFile(tmp);
  } catch {
    fs.rmSync(tmp, { force: true });
    return undefined; // no flock here (ENOLCK): liveness goes by pid, as without a lock
  }
  if (!lock) throw new Error(`${tmp} is locked by another process: is another server running with this instance id?`);
  fs.renameSync(tmp, ringOwnerLockPath(dir, pid, instance));
  return lock;
}

/**
 * Removes ring files whose server is gone (a server killed with -9 cannot clean up), with their
 * lock files. A server whose lock file is there is alive while the file is locked, whatever its
 * pid; without a lock file (no flock, or an older server) it is alive while its pid runs, except
 * an earlier server that had this server's process id (a container's pid 1 restarted with the shm
 * directory kept): named with `self.pid` but another instance.
 *
 * @param dir the shm directory
 * @param isAlive whether a process id is running
 * @param self this server's process id and instance
 * @param lockFile the runtime's flock, to test other servers' locks
 * @param log told of a file that cannot be removed (another user's, in a shared sticky
 * directory): it is left, and the sweep goes on
 * @returns the files removed
 */
export async function removeDeadRings(
  dir: string,
  isAlive: (pid: number) => boolean,
  self?: { pid: number; instance: string },
  lockFile?: LockFile,
  log: (message: string, err?: unknown) => void = () => {},
): Promise<string[]> {
  const removed: string[] = [];
  let names: string[];
  try {
    names = fs.readdirSync(dir);
  } catch {
    return removed;
  }
  const ownedFile = new RegExp(`^${RING_PREFIX}(\\d+)-(.*?)(?:-\\d+\\.(?:ring|spare)|\\.lock)$`);
  const owners = new Map<string, { pid: number; instance: string; files: string[] }>();
  for (const name of names) {
    const m = ownedFile.exec(name);
    if (!m) continue;
    const key = `${m[1]}-${m[2]}`;
    const o = owners.get(key) ?? { pid: Number(m[1]), instance: m[2], files: [] };
    o.files.push(name);
    owners.set(key, o);
  }
  for (const o of owners.values()) {
    if (self !== undefined && o.pid === self.pid && o.instance === self.instance) continue;
    const lockName = ringOwnerLockName(o.pid, o.instance);
    let held: FileLock | undefined;
    let byLock = false;
    if (lockFile && o.files.includes(lockName)) {
      try {
        held = await lockFile(`${dir}/${lockName}`);
        byLock = true;
      } catch {
        // Not ours to open (another user's lock file): its owner is judged by pid, as without one.
      }
      if (byLock && !held) continue; // locked: its server runs (maybe in another pid namespace)
    }
    if (!byLock) {
      const earlierSelf = self !== undefined && o.pid === self.pid;
      if (!earlierSelf && isAlive(o.pid)) continue;
    }
    try {
      // Rings first, the lock file last: a sweep that stops midway leaves the lock to say who owned them.
      for (const name of o.files.sort((a, b) => Number(a === lockName) - Number(b === lockName))) {
        try {
          fs.rmSync(`${dir}/${name}`, { force: true });
          removed.push(name);
        } catch (e) {
          log(`rackfeed: cannot remove ${dir}/${name}, a ring file of a server that is gone; remove it by hand`, e);
        }
      }
    } finally {
      await held?.release();
    }
  }
  return removed;
}
