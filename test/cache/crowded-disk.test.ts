import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NODE, NODE_TS, ROOT } from "../helpers/spawn.ts";

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "rackfeed-crowded-disk-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const MiB = 2 ** 20;

/**
 * Runs the fixture's `scenario` in a new mount namespace (`unshare -rm`: no root needed where
 * user namespaces are allowed) on a tmpfs of `mib` MiB: a real, fillable file system that the
 * fixture may remount read-only. The mounts go with the namespace when the fixture exits.
 */
function scenario(name: string, mib: number) {
  const mnt = join(dir, name);
  mkdirSync(mnt, { recursive: true });
  const run = `mount -t tmpfs -o size=${mib}m tmpfs '${mnt}' && exec '${NODE}' ${NODE_TS.map((a) => `'${a}'`).join(" ")} ` +
    `'${ROOT}test/cache/fixtures/crowded-disk.ts' ${name} '${mnt}'`;
  const out = execFileSync("unshare", ["-rm", "sh", "-c", run], { encoding: "utf8", timeout: 60_000 });
  return JSON.parse(out.trim().split("\n").pop()!);
}

describe("the NVMe tier on a nearly full file system", () => {
  it("keeps caching through bursts of concurrent writes: it admits only the writes its budget holds beside those in flight, and never cuts the budget below what it holds plus the free space", () => {
    const r = scenario("bursts", 16);
    // ~4 MiB free of 16 MiB, less 2 % headroom.
    expect(r.atStart).toBeGreaterThan(3.5 * MiB);
    expect(r.atStart).toBeLessThanOrEqual(4 * MiB);
    for (const { stats, free } of r.bursts) {
      // 8 writes at once, room for 3: the others stay memory-only instead of failing for want of
      // room and cutting the budget (to 0 before: each failure cut it below what was held).
      expect(stats.writeErrors).toBe(0);
      expect(stats.blocks).toBe(3);
      expect(stats.bytes).toBeGreaterThan(3 * MiB);
      expect(stats.maxBytes).toBe(r.atStart);
      expect(stats.maxBytes).toBeGreaterThanOrEqual(stats.bytes + free - MiB);
    }
    expect(r.bursts.at(-1).stats.writes).toBe(9);
  }, 90_000);

  it("does not evict for a sibling write that lands after another write of its burst found the disk full", () => {
    const r = scenario("sibling", 8);
    expect(r.admitted).toEqual([true, true]);
    // The other write failed (the sibling took the last MiB); the budget came down to the blocks
    // held plus the sibling being written, so the sibling landed without evicting a block.
    expect(r.after.writeErrors).toBe(1);
    expect(r.siblingKept).toBe(true);
    expect(r.after.evictions).toBe(0);
    expect(r.after.blocks).toBe(3);
    expect(r.after.maxBytes).toBeGreaterThanOrEqual(r.after.bytes);
    expect(r.after.maxBytes).toBeGreaterThanOrEqual(r.after.bytes + r.free - MiB);
    expect(r.after.maxBytes).toBeLessThan(r.before.maxBytes);
  }, 90_000);

  it("keeps its blocks indexed while the directory is read-only, and its accounting equal to the files on disk after", () => {
    const r = scenario("readonly", 8);
    expect(r.full.blocks).toBe(4);
    // Every write fails to open its temporary file, and evicts nothing for it.
    expect(r.whileRo).toEqual([false, false, false]);
    expect(r.ro.writeErrors).toBe(3);
    expect(r.ro).toMatchObject({ blocks: 4, bytes: r.full.bytes, evictions: 0 });
    // Writable again: new blocks evict old ones, and the tier counts exactly what is on disk.
    expect(r.afterRo).toEqual([true, true]);
    expect(r.rw).toMatchObject({ blocks: 4, evictions: 2 });
    expect(r.rwHas).toEqual([false, false, true, true]); // the least recently used went, as if nothing had failed
    expect(r.rwDisk).toEqual({ files: r.rw.blocks, bytes: r.rw.bytes });
    // A block whose file cannot be removed (its folder alone read-only) stays indexed and counted;
    // with no room made, the new block stays memory-only.
    expect(r.evictRo).toBe(false);
    expect(r.lruKept).toBe(true);
    expect(r.bindRo).toMatchObject({ blocks: 4, evictions: 2, writesSkipped: 1 });
    expect(r.bindRoDisk).toEqual({ files: r.bindRo.blocks, bytes: r.bindRo.bytes });
    expect(r.messages).toContainEqual(expect.stringMatching(/^Cannot write block file .*\.blk$/));
  }, 90_000);
});
