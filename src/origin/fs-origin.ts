/** @module An origin on a POSIX or NFS mount: positional reads, version from inode+size+mtime, never a path outside its root. */

import { constants, type Stats } from "node:fs";
import { open, opendir, realpath, stat } from "node:fs/promises";
import { OriginError } from "../errors.ts";
import { type ListedObject, type ObjectInfo, type Origin, readDeadlineMs } from "./origin.ts";

/** Options of `FsOrigin`. */
export interface FsOriginOptions {
  /** Origin name. */
  readonly name: string;
  /** Absolute directory every key is resolved under. */
  readonly root: string;
  /**
   * A stat, or a read (plus its bytes at `MIN_ORIGIN_BYTES_PER_S`, see `readDeadlineMs`), not done in this long fails
   * with `ORIGIN_TIMEOUT`: a hard-mounted NFS server that stops answering blocks file calls for
   * ever. Unset: no deadline.
   */
  readonly timeoutMs?: number;
  /**
   * While a call is hung (past its deadline and not returned), new calls are refused once this
   * many are unreturned (default `HUNG_CALLS_MAX`).
   */
  readonly maxHungCalls?: number;
}

/**
 * Unreturned file calls a hung origin may keep. A file call cannot be cancelled, and on Node each
 * one holds a thread of libuv's pool (`bin/rackfeed` starts 64) until it returns: without a
 * bound, a hard-mounted NFS share that stops answering would take every thread, one timed-out
 * read after another, and with them the NVMe tier's reads and every other origin.
 */
export const HUNG_CALLS_MAX = 8;

/**
 * Serves files under one directory. Keys must already be validated (`origin/object-key.ts`);
 * as a second line of defence every path is resolved with `realpath` and refused unless it is
 * still under the root, so a symlink cannot lead out of it either.
 *
 * @example
 * ```ts
 * const origin = new FsOrigin({ name: "data", root: "/srv/datasets" });
 * const info = await origin.stat("shards/0001.bin");
 * ```
 */
export class FsOrigin implements Origin {
  readonly name: string;
  readonly #root: string;
  readonly #timeoutMs: number | undefined;
  readonly #maxHung: number;
  #realRoot: Promise<string> | undefined;
  /** The identity (`idOf`) of the directory the root was last served from, kept across failures: an unmounted share leaves its mount point, another directory. */
  #rootId = "";
  /** File calls started and not returned, and how many of them are past their deadline. */
  #unreturned = 0;
  #hung = 0;

  /**
   * @param opts name and absolute root
   * @throws {RangeError} when the root is not absolute
   */
  constructor(opts: FsOriginOptions) {
    if (!opts.root.startsWith("/")) {
      throw new RangeError(`Cannot create FsOrigin "${opts.name}": root must be absolute, received "${opts.root}"`);
    }
    this.name = opts.name;
    this.#root = opts.root.replace(/\/+$/, "") || "/";
    this.#timeoutMs = opts.timeoutMs;
    this.#maxHung = opts.maxHungCalls ?? HUNG_CALLS_MAX;
    if (!Number.isSafeInteger(this.#maxHung) || this.#maxHung < 1) {
      throw new RangeError(`Cannot create FsOrigin "${opts.name}": maxHungCalls must be an integer >= 1, received ${opts.maxHungCalls}`);
    }
  }

  /**
   * `call()` under the deadline, if any. A file call cannot be cancelled: past the deadline its
   * caller gets `ORIGIN_TIMEOUT` and the call is left to finish (or not) on its own; what it
   * writes then goes into a buffer its failed fill has already dropped. While such a call is
   * hung, at most `maxHungCalls` may be unreturned: the rest are refused before they start.
   */
  #deadline<T>(call: () => Promise<T>, bytes: number, what: string, timeouts = 1): Promise<T> {
    if (this.#timeoutMs === undefined) return call();
    if (this.#hung > 0 && this.#unreturned >= this.#maxHung) {
      return Promise.reject(
        new OriginError(
          "ORIGIN_UNAVAILABLE",
          `Origin "${this.name}" has ${this.#hung} file calls under ${this.#root} hung past their deadline (a hung file system?); ` +
            `${what} is refused until they return`,
          { unreachable: true },
        ),
      );
    }
    const ms = readDeadlineMs(this.#timeoutMs * timeouts, bytes);
    let timer: ReturnType<typeof setTimeout> | undefined;
    let late = false;
    this.#unreturned++;
    const op = call().finally(() => {
      this.#unreturned--;
      if (late) this.#hung--;
    });
    const deadline = new Promise<never>((_, reject) => {
      timer = setTimeout(() => {
        late = true;
        this.#hung++;
        reject(new OriginError("ORIGIN_TIMEOUT", `Origin "${this.name}" did not finish ${what} within ${ms} ms (a hung file system?)`, { unreachable: true }));
      }, ms);
    });
    op.catch(() => {}); // a call that fails after its deadline has nobody left to tell
    return Promise.race([op, deadline]).finally(() => clearTimeout(timer));
  }

  async #resolve(key: string, again = true): Promise<string> {
    const root = await this.#resolveRoot();
    let real: string;
    try {
      real = await realpath(`${this.#root}/${key}`);
    } catch (e) {
      throw await this.#notFound(e, key);
    }
    const prefix = root === "/" ? "/" : `${root}/`;
    if (!real.startsWith(prefix)) {
      // A root that is a symbolic link led elsewhere since it was resolved (`current -> v2`):
      // resolved again, and the key looked up under it once more.
      const down = await this.#rootGone(undefined);
      if (down) throw down;
      if (again && this.#realRoot === undefined) return await this.#resolve(key, false);
      // Reported as not found: saying more would tell a client what exists outside the root.
      throw new OriginError("OBJECT_NOT_FOUND", `Object "${key}" not found in origin "${this.name}"`);
    }
    return real;
  }

  stat(key: string): Promise<ObjectInfo> {
    return this.#deadline(() => this.#stat(key), 0, `stat of "${key}"`);
  }

  read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    return this.#deadline(() => this.#read(key, info, offset, dest), dest.length, `reading "${key}" bytes ${offset}-${offset + dest.length - 1}`);
  }

  async #stat(key: string): Promise<ObjectInfo> {
    const path = await this.#resolve(key);
    let st: Stats;
    try {
      st = await stat(path);
    } catch (e) {
      throw await this.#notFound(e, key);
    }
    if (!st.isFile()) throw new OriginError("OBJECT_NOT_FOUND", `Object "${key}" not found in origin "${this.name}"`);
    return infoOf(st);
  }

  async #read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    const path = await this.#resolve(key);
    let fh;
    try {
      fh = await open(path, constants.O_RDONLY);
    } catch (e) {
      throw await this.#notFound(e, key);
    }
    try {
      // The version is checked on the open descriptor, so the bytes read below belong to
      // exactly the version the block key names (a rename-replace cannot slip in between).
      const now = infoOf(await fh.stat());
      if (now.version !== info.version) {
        throw new OriginError(
          "OBJECT_CHANGED",
          `Object "${key}" in origin "${this.name}" changed while being read (version ${info.version} -> ${now.version})`,
        );
      }
      let done = 0;
      while (done < dest.length) {
        const { bytesRead } = await fh.read(dest, done, dest.length - done, offset + done);
        if (bytesRead === 0) {
          throw new OriginError(
            "OBJECT_CHANGED",
            `Object "${key}" in origin "${this.name}" is shorter than its recorded size ${info.size}`,
          );
        }
        done += bytesRead;
      }
      // And again after: a write in place during the read (same inode, so the check above cannot
      // see it coming) changes the modification time; then the bytes may mix two versions.
      const after = infoOf(await fh.stat());
      if (after.version !== info.version) {
        throw new OriginError(
          "OBJECT_CHANGED",
          `Object "${key}" in origin "${this.name}" changed while being read (version ${info.version} -> ${after.version})`,
        );
      }
    } catch (e) {
      throw e instanceof OriginError ? e : this.#fail(e, key);
    } finally {
      await fh.close();
    }
  }

  list(prefix: string, limit: number): Promise<ListedObject[]> {
    // A listing's stats are many calls: its deadline is one origin timeout per 1000 entries asked for.
    return this.#deadline(() => this.#list(prefix, limit), 0, `listing "${prefix}"`, Math.ceil(limit / 1000));
  }

  async #list(prefix: string, limit: number): Promise<ListedObject[]> {
    // Walk only the directory that holds the prefix; the rest of the tree cannot match.
    const slash = prefix.lastIndexOf("/");
    const dirKey = slash < 0 ? "" : prefix.slice(0, slash);
    const out: ListedObject[] = [];
    let start: string;
    try {
      start = dirKey === "" ? await this.#resolveRoot() : await this.#resolve(dirKey);
    } catch (e) {
      if (e instanceof OriginError && e.code === "OBJECT_NOT_FOUND") return out;
      throw e;
    }
    await this.#walk(start, dirKey, prefix, limit, out);
    // Nothing found may be a share unmounted since: its empty mount point lists nothing.
    if (out.length === 0) {
      const down = await this.#rootGone(undefined);
      if (down) throw down;
    }
    out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
    return out.slice(0, limit);
  }

  /** The root's real path, kept once found; a failure is not kept, so a share that comes back is used again. */
  #resolveRoot(): Promise<string> {
    this.#realRoot ??= (async () => {
      const real = await realpath(this.#root);
      const id = idOf(await stat(real));
      // Another directory than the one served from: taken as the root only when it holds files
      // (a share mounted again); an empty one is the mount point of a share that is not.
      if (this.#rootId !== "" && id !== this.#rootId) {
        const down = await this.#emptyStandIn(undefined);
        if (down) throw down;
      }
      this.#rootId = id;
      return real;
    })().catch((e) => {
      this.#realRoot = undefined;
      throw e instanceof OriginError ? e : this.#rootUnreachable(e);
    });
    return this.#realRoot;
  }

  /** The root itself is gone (an NFS mount that went away): the origin is down, not the object. */
  #rootUnreachable(e: unknown): OriginError {
    return new OriginError("ORIGIN_UNAVAILABLE", `Origin "${this.name}" cannot reach its root ${this.#root}: ${(e as { code?: string }).code ?? (e as Error).message}`, { cause: e, unreachable: true });
  }

  /**
   * The error of a call that found no object: a missing object, unless the root is gone (see
   * `#rootGone`): then the origin is down (502).
   */
  async #notFound(e: unknown, key: string): Promise<OriginError> {
    const err = this.#fail(e, key);
    if (err.code !== "OBJECT_NOT_FOUND") return err;
    return (await this.#rootGone(e)) ?? err;
  }

  /**
   * Checked when something was not found: the root is gone, or is another directory now and an
   * empty one (an NFS share unmounted after start-up leaves its mount point, empty, and on
   * another device). Another directory that holds files is taken as the share mounted again, and
   * becomes the root.
   *
   * @returns the origin's error (502), or undefined when the root is as it was
   */
  async #rootGone(cause: unknown): Promise<OriginError | undefined> {
    if (this.#realRoot === undefined) return undefined;
    let id: string;
    try {
      id = idOf(await stat(this.#root));
    } catch (e) {
      this.#realRoot = undefined;
      return this.#rootUnreachable(e);
    }
    // `stat` follows a root that is a symbolic link: one led elsewhere is another identity too.
    if (id === this.#rootId) return undefined;
    const down = await this.#emptyStandIn(cause);
    // Not empty: resolved again, and taken as the root (see `#resolveRoot`).
    if (!down) this.#realRoot = undefined;
    return down;
  }

  /**
   * The error for a root that is another directory than the one served from and an empty one
   * (or cannot be read); undefined when it holds something.
   */
  async #emptyStandIn(cause: unknown): Promise<OriginError | undefined> {
    let empty: boolean;
    try {
      const dir = await opendir(this.#root);
      try {
        empty = (await dir.read()) === null;
      } finally {
        await dir.close();
      }
    } catch (e) {
      return this.#rootUnreachable(e);
    }
    if (!empty) return undefined;
    return new OriginError("ORIGIN_UNAVAILABLE", `Origin "${this.name}" cannot reach its root ${this.#root}: it is now another directory, and an empty one (the mount point of an unmounted share?)`, { cause, unreachable: true });
  }

  async #walk(dir: string, dirKey: string, prefix: string, limit: number, out: ListedObject[]): Promise<void> {
    const entries = [];
    try {
      for await (const e of await opendir(dir)) entries.push(e);
    } catch (e) {
      throw await this.#notFound(e, dirKey);
    }
    entries.sort((a, b) => (a.name < b.name ? -1 : 1));
    for (const e of entries) {
      if (out.length >= limit) return;
      const key = dirKey === "" ? e.name : `${dirKey}/${e.name}`;
      if (e.isDirectory()) {
        if (prefix.startsWith(`${key}/`) || key.startsWith(prefix)) await this.#walk(`${dir}/${e.name}`, key, prefix, limit, out);
      } else if (e.isFile() && key.startsWith(prefix)) {
        out.push({ key, size: (await stat(`${dir}/${e.name}`)).size });
      }
    }
  }

  close(): Promise<void> {
    return Promise.resolve();
  }

  #fail(e: unknown, key: string): OriginError {
    const code = (e as { code?: string }).code;
    // A name too long, or a symlink loop, names no object either (not an origin failure).
    if (code === "ENOENT" || code === "ENOTDIR" || code === "EISDIR" || code === "ENAMETOOLONG" || code === "ELOOP") {
      return new OriginError("OBJECT_NOT_FOUND", `Object "${key}" not found in origin "${this.name}"`, { cause: e });
    }
    if (code === "ETIMEDOUT") {
      return new OriginError("ORIGIN_TIMEOUT", `Origin "${this.name}" timed out reading "${key}"`, { cause: e, unreachable: true });
    }
    return new OriginError(
      "ORIGIN_UNAVAILABLE",
      `Origin "${this.name}" failed reading "${key}": ${code ?? (e as Error).message}`,
      { cause: e },
    );
  }
}

/**
 * An object's size, version and ETag from its stat: inode, size and modification time. The
 * modification time counts in whole milliseconds: Deno's stat gives no finer, and a version that
 * differed by runtime broke If-None-Match and If-Range across a mixed fleet (and cold-started a
 * cache moved between them); it stays in microseconds in the version, as before. Not the change
 * time, although it would catch a rewrite whose mtime was set back (`cp -p`, `rsync -t
 * --inplace`): a chmod, chown, ACL or hard link changes it too, and each made every cached block
 * of the file cold and its dataset rebuild, failing batches meanwhile (README "How the cache works").
 */
function infoOf(st: Stats): ObjectInfo {
  const mtimeUs = Math.floor(st.mtimeMs) * 1000;
  const version = `${st.ino.toString(36)}-${st.size.toString(36)}-${mtimeUs.toString(36)}`;
  return { size: st.size, version, etag: `"${version}"`, lastModified: new Date(Math.floor(st.mtimeMs)) };
}

/**
 * Checks at start-up that a files origin's root is a directory this process can read, so a
 * mistyped or unmounted path fails the start (exit 2) instead of every request.
 *
 * @throws {Error} naming the root and what is wrong with it
 */
export async function checkFsRoot(root: string): Promise<void> {
  let st: Stats;
  try {
    st = await stat(root);
  } catch (e) {
    throw new Error(`${root} cannot be used: ${(e as { code?: string }).code ?? (e as Error).message} (not mounted, or a typo?)`, { cause: e });
  }
  if (!st.isDirectory()) throw new Error(`${root} is not a directory`);
  // Opened rather than access()'d: Deno's access() asks for the uid, which needs --allow-sys.
  try {
    await (await opendir(root)).close();
  } catch (e) {
    throw new Error(`${root} cannot be read by this process: ${(e as { code?: string }).code ?? (e as Error).message}`, { cause: e });
  }
}

/** A directory's identity: its device, inode and birth time (an inode number may be reused by a new directory). */
function idOf(st: Stats): string {
  return `${st.dev}:${st.ino}:${st.birthtimeMs}`;
}
