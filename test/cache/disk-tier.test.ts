import { execFileSync } from "node:child_process";
import { copyFileSync, existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, statSync, symlinkSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { LockFile } from "../../src/cache/cache-dir-lock.ts";
import { DiskTier } from "../../src/cache/disk-tier.ts";
import { nodeFileLock } from "../../src/runtime/node.ts";
import { expectSameBytes, within } from "../helpers/rackfeed.ts";

/** While set, opening a block file for reading fails with this code (as under descriptor pressure). */
let failBlockOpens: string | undefined;
/** While set, creating a block's temporary file fails with this code (a failing disk). */
let failTmpOpens: string | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const real = await importOriginal<typeof import("node:fs/promises")>();
  return {
    ...real,
    open: (path: string, flags?: string, ...rest: unknown[]) => {
      if (failTmpOpens && flags === "wx" && String(path).endsWith(".tmp")) {
        return Promise.reject(Object.assign(new Error(`${failTmpOpens}: simulated, open '${path}'`), { code: failTmpOpens }));
      }
      if (failBlockOpens && flags !== "wx" && String(path).endsWith(".blk")) {
        return Promise.reject(Object.assign(new Error(`${failBlockOpens}: simulated, open '${path}'`), { code: failBlockOpens }));
      }
      return (real.open as (...a: unknown[]) => ReturnType<typeof real.open>)(path, flags, ...rest);
    },
  };
});

const MiB = 2 ** 20;
let dir: string | undefined;
afterEach(async () => {
  failBlockOpens = undefined;
  failTmpOpens = undefined;
  if (dir) await rm(dir, { recursive: true, force: true });
  dir = undefined;
});

/** Total bytes of the block files under the tier's directory (what the budget is about). */
function bytesOnDisk(root: string): number {
  let n = 0;
  for (const sub of readdirSync(join(root, "blocks"))) {
    for (const f of readdirSync(join(root, "blocks", sub))) n += statSync(join(root, "blocks", sub, f)).size;
  }
  return n;
}

describe("DiskTier read errors", () => {
  it("keeps the entry of a block file it cannot open (EMFILE): the file still counts, reads again later, and is evicted in its turn", async () => {
    dir = await mkdtemp(join(tmpdir(), "rackfeed-disk-"));
    const errors: string[] = [];
    const tier = await DiskTier.open({ dir, maxBytes: 4 * MiB, maxPendingWrites: 8, onError: (m, e) => errors.push(`${m}: ${(e as Error)?.message}`) });
    const key = (i: number) => `data\na.bin\nv1\n${MiB}\n${i}`;
    const payload = new Uint8Array(MiB).fill(3);
    expect(await tier.writeAndWait(key(0), payload)).toBe(true);
    const [path] = tier.files();
    const fileBytes = statSync(path).size;
    expect(tier.stats()).toMatchObject({ bytes: fileBytes, blocks: 1 });

    failBlockOpens = "EMFILE";
    expect(await tier.read(key(0))).toBeUndefined();
    failBlockOpens = undefined;
    expect(errors).toEqual([expect.stringMatching(/^Cannot read block file .*\.blk: EMFILE/)]);
    // Still indexed and accounted, file in place.
    expect(tier.has(key(0))).toBe(true);
    expect(tier.stats()).toMatchObject({ bytes: fileBytes, blocks: 1 });
    expect(existsSync(path)).toBe(true);
    // Once descriptors are back, the block is served from the NVMe tier again.
    expectSameBytes((await tier.read(key(0)))!, payload, "block 0 after the failed read");

    // Filling the budget evicts it like any other file: the directory stays within --disk-bytes.
    for (let i = 1; i <= 4; i++) expect(await tier.writeAndWait(key(i), new Uint8Array(MiB).fill(i))).toBe(true);
    expect(existsSync(path)).toBe(false);
    expect(bytesOnDisk(dir)).toBeLessThanOrEqual(4 * MiB);
    expect(bytesOnDisk(dir)).toBe(tier.stats().bytes);
    await tier.close();
  });

  it("drops the entry of a block file that is gone (ENOENT): an ordinary miss, reported to nobody", async () => {
    dir = await mkdtemp(join(tmpdir(), "rackfeed-disk-"));
    const errors: string[] = [];
    const tier = await DiskTier.open({ dir, maxBytes: 4 * MiB, maxPendingWrites: 8, onError: (m) => errors.push(m) });
    const key = `data\nb.bin\nv1\n${MiB}\n0`;
    expect(await tier.writeAndWait(key, new Uint8Array(MiB))).toBe(true);
    await rm(tier.files()[0]);
    expect(await tier.read(key)).toBeUndefined();
    expect(tier.has(key)).toBe(false);
    expect(tier.stats()).toMatchObject({ bytes: 0, blocks: 0 });
    expect(errors).toEqual([]);
    await tier.close();
  });
});

/** The regular files under the tier's `blocks/`: how many, and their bytes. */
function blockFiles(root: string): { files: number; bytes: number } {
  let files = 0;
  let bytes = 0;
  for (const sub of readdirSync(join(root, "blocks"))) {
    for (const f of readdirSync(join(root, "blocks", sub))) {
      const st = lstatSync(join(root, "blocks", sub, f));
      if (st.isFile()) (files++, bytes += st.size);
    }
  }
  return { files, bytes };
}


describe("DiskTier index rebuild at start-up", () => {
  const key = (i: number) => `data\nc.bin\nv1\n${MiB}\n${i}`;

  it("removes a block file copied over another block's path rather than index its key twice and count its bytes twice", async () => {
    dir = await mkdtemp(join(tmpdir(), "rackfeed-disk-"));
    let tier = await DiskTier.open({ dir, maxBytes: 8 * MiB, maxPendingWrites: 8 });
    for (let i = 0; i < 4; i++) expect(await tier.writeAndWait(key(i), new Uint8Array(MiB).fill(i))).toBe(true);
    const paths = tier.files();
    await tier.close();
    // Block 0's file at block 1's path: its header names key 0, its name is key 1's hash.
    copyFileSync(paths[0], paths[1]);

    tier = await DiskTier.open({ dir, maxBytes: 8 * MiB, maxPendingWrites: 8 });
    try {
      expect(existsSync(paths[1])).toBe(false);
      expect(tier.stats()).toMatchObject({ blocks: 3, corrupt: 1 });
      expect(blockFiles(dir)).toEqual({ files: 3, bytes: tier.stats().bytes });
      expect(tier.has(key(1))).toBe(false);
      expectSameBytes((await tier.read(key(0)))!, new Uint8Array(MiB).fill(0), "block 0");
    } finally {
      await tier.close();
    }
  });

  it("starts with a FIFO, a symlink and a directory where block files should be: removes the first two, leaves and reports the directory, serves the rest", async () => {
    dir = await mkdtemp(join(tmpdir(), "rackfeed-disk-"));
    let tier = await DiskTier.open({ dir, maxBytes: 8 * MiB, maxPendingWrites: 8 });
    for (let i = 0; i < 4; i++) expect(await tier.writeAndWait(key(i), new Uint8Array(MiB).fill(i))).toBe(true);
    const paths = tier.files();
    await tier.close();
    rmSync(paths[1]);
    execFileSync("mkfifo", [paths[1]]); // a plain open for reading blocks until a writer comes: for ever
    rmSync(paths[2]);
    symlinkSync(paths[0], paths[2]); // a valid block file, but key 0's, reached through key 2's path
    rmSync(paths[3]);
    mkdirSync(paths[3]);

    const errors: string[] = [];
    tier = await within(DiskTier.open({ dir, maxBytes: 8 * MiB, maxPendingWrites: 8, onError: (m) => errors.push(m) }), 5000, "DiskTier.open");
    try {
      expect(existsSync(paths[1])).toBe(false);
      expect(() => lstatSync(paths[2])).toThrow(/ENOENT/);
      expect(lstatSync(paths[3]).isDirectory()).toBe(true);
      expect(errors).toEqual(expect.arrayContaining([
        `Removed ${paths[1]}: not a regular file, so not a block file`,
        `Removed ${paths[2]}: not a regular file, so not a block file`,
        `Left directory ${paths[3]} in place: not a block file`,
      ]));
      expect(tier.stats()).toMatchObject({ blocks: 1, corrupt: 2 });
      expect(blockFiles(dir)).toEqual({ files: 1, bytes: tier.stats().bytes });
      expectSameBytes((await tier.read(key(0)))!, new Uint8Array(MiB).fill(0), "block 0");
      // A FIFO that takes an indexed block's place later is refused on read too, not waited on.
      expect(await tier.writeAndWait(key(5), new Uint8Array(MiB).fill(5))).toBe(true);
      const five = tier.files().at(-1)!;
      rmSync(five);
      execFileSync("mkfifo", [five]);
      expect(await within(tier.read(key(5)), 5000, "read of a FIFO")).toBeUndefined();
      expect(tier.has(key(5))).toBe(false);
      expect(existsSync(five)).toBe(false);
    } finally {
      await tier.close();
    }
  });
});

describe("DiskTier directory lock", () => {
  it("locks by pid, and says so, where the file system refuses flock (NFSv3 without lockd: ENOLCK)", async () => {
    dir = await mkdtemp(join(tmpdir(), "rackfeed-disk-"));
    const errors: string[] = [];
    const lockFile: LockFile = () => Promise.reject(Object.assign(new Error("flock failed: ENOLCK"), { code: "ENOLCK" }));
    const tier = await DiskTier.open({
      dir, maxBytes: 4 * MiB, maxPendingWrites: 8, onError: (m, e) => errors.push(`${m}: ${(e as Error).message}`),
      owner: { pid: process.pid, isAlive: () => true, lockFile },
    });
    try {
      expect(errors).toEqual([`Cannot flock ${dir}/lock; locking the cache directory by pid instead: flock failed: ENOLCK`]);
      expect(readFileSync(join(dir, "lock"), "utf8")).toMatch(new RegExp(`^${process.pid} \\d+@\\w+\\n$`)); // untagged: a pid lock
    } finally {
      await tier.close();
    }
  });

  it("holds the lock only on the file its path still names: one taken on a file replaced meanwhile is let go and taken again", async () => {
    dir = await mkdtemp(join(tmpdir(), "rackfeed-disk-"));
    const lockPath = join(dir, "lock");
    const real = nodeFileLock()!;
    expect(real).toBeDefined();
    const released: number[] = [];
    let calls = 0;
    // The first lock lands on a file that another server's release removes right after (as when
    // a server stops while this one opens the lock), and a third server's new file takes the path.
    const lockFile: LockFile = async (path) => {
      const lock = await real(path);
      if (lock && calls++ === 0) {
        renameSync(path, `${path}.gone`);
        writeFileSync(path, "");
      }
      return lock && { ino: lock.ino, release: () => (released.push(lock.ino), lock.release()) };
    };
    const tier = await DiskTier.open({ dir, maxBytes: 4 * MiB, maxPendingWrites: 8, owner: { pid: process.pid, isAlive: () => true, lockFile } });
    try {
      expect(calls).toBe(2);
      expect(released).toHaveLength(1); // the lock on the replaced file
      expect(released[0]).toBe(statSync(`${lockPath}.gone`).ino);
      expect(readFileSync(lockPath, "utf8")).toMatch(new RegExp(`^${process.pid} `));
      // The path's file is the one locked now: another open of it is refused.
      expect(await real(lockPath)).toBeUndefined();
    } finally {
      await tier.close();
    }
    expect(existsSync(lockPath)).toBe(false);
    expect(released).toHaveLength(2);
  });
});

describe("DiskTier write errors", () => {
  it("reports a failing disk's first write error, then one a minute with the count of the others", async () => {
    dir = await mkdtemp(join(tmpdir(), "rackfeed-disk-"));
    let clock = 0;
    const errors: string[] = [];
    const tier = await DiskTier.open({ dir, maxBytes: 64 * MiB, maxPendingWrites: 8, now: () => clock, onError: (m, e) => errors.push(`${m}: ${(e as Error)?.message}`) });
    try {
      failTmpOpens = "EIO";
      for (let k = 0; k < 5; k++) expect(await tier.writeAndWait(`k${k}`, new Uint8Array(1000))).toBe(false);
      expect(tier.stats().writeErrors).toBe(5);
      expect(errors).toHaveLength(1);
      expect(errors[0]).toMatch(/^Cannot write block file .*\.blk: EIO: simulated/);
      clock += 61_000;
      await tier.writeAndWait("k5", new Uint8Array(1000));
      expect(errors).toHaveLength(2);
      expect(errors[1]).toMatch(/\.blk \(and 4 more write errors since the last report\): EIO/);
      failTmpOpens = undefined;
      expect(await tier.writeAndWait("k6", new Uint8Array(1000))).toBe(true);
      expect(tier.stats().maxBytes).toBe(64 * MiB); // not a full disk: the budget stays
    } finally {
      await tier.close();
    }
  });
});
