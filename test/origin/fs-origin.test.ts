import { execFileSync } from "node:child_process";
import { chmodSync, closeSync, constants, linkSync, mkdirSync, mkdtempSync, openSync, renameSync, rmSync, statSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { OriginError } from "../../src/errors.ts";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
import { OriginGateway } from "../../src/origin/origin-gateway.ts";
import type { ObjectInfo } from "../../src/origin/origin.ts";

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "rackfeed-fs-origin-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("FsOrigin deadlines", () => {
  it("answers ORIGIN_TIMEOUT when a file call hangs (as on a hung NFS mount), within its deadline", async () => {
    // Opening a FIFO for reading blocks until a writer comes: a file call that never returns.
    const fifo = join(dir, "hung");
    execFileSync("mkfifo", [fifo]);
    const origin = new FsOrigin({ name: "data", root: dir, timeoutMs: 200 });
    const info: ObjectInfo = { size: 1000, version: "v", etag: '"v"', lastModified: new Date(0) };
    const t0 = performance.now();
    try {
      await expect(origin.read("hung", info, 0, new Uint8Array(1000))).rejects.toMatchObject({
        code: "ORIGIN_TIMEOUT",
        message: expect.stringMatching(/did not finish reading "hung" bytes 0-999 within 204 ms/),
      });
      expect(performance.now() - t0).toBeGreaterThanOrEqual(195);
      expect(performance.now() - t0).toBeLessThan(2200); // 204 ms, with slack for a loaded machine
    } finally {
      // Release the blocked call (a writer arrives, then leaves): it ends on its own, unheard.
      closeSync(openSync(fifo, constants.O_WRONLY | constants.O_NONBLOCK));
    }
  });

  it("refuses new calls at once while hung calls fill its bound, and takes them again once those return", async () => {
    const fifos = ["hung-a", "hung-b", "hung-c"].map((n) => join(dir, n));
    for (const f of fifos) execFileSync("mkfifo", [f]);
    writeFileSync(join(dir, "fine.bin"), Buffer.alloc(100, 1));
    const origin = new FsOrigin({ name: "data", root: dir, timeoutMs: 100, maxHungCalls: 2 });
    const info: ObjectInfo = { size: 10, version: "v", etag: '"v"', lastModified: new Date(0) };
    const release = (f: string) => closeSync(openSync(f, constants.O_WRONLY | constants.O_NONBLOCK));
    try {
      for (const f of fifos.slice(0, 2)) {
        await expect(origin.read(f.slice(dir.length + 1), info, 0, new Uint8Array(10))).rejects.toMatchObject({ code: "ORIGIN_TIMEOUT" });
      }
      await expect(origin.read("hung-c", info, 0, new Uint8Array(10))).rejects.toMatchObject({
        code: "ORIGIN_UNAVAILABLE",
        message: expect.stringMatching(/^Origin "data" has 2 file calls under .* hung past their deadline \(a hung file system\?\); reading "hung-c" bytes 0-9 is refused until they return$/),
      });
      expect(() => release(fifos[2])).toThrow(/ENXIO/); // refused before it started: nobody is blocked on it
      await expect(origin.stat("fine.bin")).rejects.toMatchObject({ code: "ORIGIN_UNAVAILABLE" });
      release(fifos[0]); // one hung call returns: room for one more
      let info2: ObjectInfo | undefined;
      for (const until = performance.now() + 5000; !info2 && performance.now() < until;) {
        info2 = await origin.stat("fine.bin").catch(() => undefined);
        if (!info2) await new Promise((r) => setTimeout(r, 20));
      }
      expect(info2?.size).toBe(100);
    } finally {
      for (const f of fifos) {
        try {
          release(f);
        } catch {
          // nobody blocked on it
        }
      }
    }
  });

  it("reads and stats normally under the deadline, and has none when not given one", async () => {
    writeFileSync(join(dir, "ok.bin"), Buffer.alloc(4096, 7));
    for (const origin of [new FsOrigin({ name: "data", root: dir, timeoutMs: 200 }), new FsOrigin({ name: "data", root: dir })]) {
      const info = await origin.stat("ok.bin");
      const dest = new Uint8Array(100);
      await origin.read("ok.bin", info, 10, dest);
      expect(dest.every((b) => b === 7)).toBe(true);
    }
  });
});

describe("FsOrigin versions", () => {
  it("versions an object by inode, size and its modification time in whole milliseconds, as Deno reads it (test/runtime/deno/server.test.ts checks the same there)", async () => {
    const path = join(dir, "versioned.bin");
    writeFileSync(path, Buffer.alloc(1000, 1));
    // A time with microseconds: Node's stat gives them, Deno's does not.
    utimesSync(path, 1_700_000_000.123456, 1_700_000_000.123456);
    const st = statSync(path);
    expect(st.mtimeMs % 1).not.toBe(0);
    const info = await new FsOrigin({ name: "data", root: dir }).stat("versioned.bin");
    const version = `${st.ino.toString(36)}-${(1000).toString(36)}-${(1_700_000_000_123 * 1000).toString(36)}`;
    expect(info.version).toBe(version);
    expect(info.etag).toBe(`"${version}"`);
  });

  it("keeps an object's version through a change of its metadata alone (chmod, a hard link): its cached blocks stay warm", async () => {
    const path = join(dir, "metadata.bin");
    writeFileSync(path, Buffer.alloc(1000, 1));
    const origin = new FsOrigin({ name: "data", root: dir });
    const before = await origin.stat("metadata.bin");
    // The change time counts seconds on Deno: change it in a later one.
    const changedIn = Math.floor(statSync(path).ctimeMs / 1000);
    while (Date.now() < (changedIn + 1) * 1000 + 100) await new Promise((r) => setTimeout(r, 20));
    chmodSync(path, 0o640);
    linkSync(path, join(dir, "metadata-link.bin"));
    expect(Math.floor(statSync(path).ctimeMs / 1000)).toBeGreaterThan(changedIn);
    expect((await origin.stat("metadata.bin")).version).toBe(before.version);
  });
});

describe("FsOrigin whose root goes away", () => {
  it("answers ORIGIN_UNAVAILABLE naming its root (502), not a missing object with an empty key", async () => {
    const root = mkdtempSync(join(tmpdir(), "rf-root-"));
    writeFileSync(join(root, "a.bin"), "x");
    const origin = new FsOrigin({ name: "nfs", root });
    rmSync(root, { recursive: true, force: true }); // the mount went away before the first request
    const err = await origin.stat("a.bin").then(() => undefined, (e) => e as Error & { code?: string });
    expect(err?.code).toBe("ORIGIN_UNAVAILABLE");
    expect(err?.message).toBe(`Origin "nfs" cannot reach its root ${root}: ENOENT`);
  });

  it("uses its root again once it is back, after a listing made while it was gone", async () => {
    const root = mkdtempSync(join(tmpdir(), "rf-root-"));
    const origin = new FsOrigin({ name: "nfs", root });
    rmSync(root, { recursive: true, force: true }); // the share is not mounted yet
    await expect(origin.list("", 10)).rejects.toMatchObject({ code: "ORIGIN_UNAVAILABLE" });
    mkdirSync(root);
    writeFileSync(join(root, "a.bin"), "xyz");
    try {
      expect((await origin.stat("a.bin")).size).toBe(3);
      expect(await origin.list("", 10)).toEqual([{ key: "a.bin", size: 3 }]);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });

  it("answers 502 once its root goes away after it has served, and again while an empty directory stands in for it", async () => {
    const root = mkdtempSync(join(tmpdir(), "rf-root-"));
    writeFileSync(join(root, "a.bin"), "xyz");
    const origin = new FsOrigin({ name: "nfs", root });
    try {
      expect((await origin.stat("a.bin")).size).toBe(3);
      await expect(origin.stat("missing.bin")).rejects.toMatchObject({ code: "OBJECT_NOT_FOUND" }); // a missing object is still a 404
      // Unmounted: the share's files go, and its mount point stays as another, empty directory.
      renameSync(root, `${root}.away`);
      mkdirSync(root);
      await expect(origin.stat("a.bin")).rejects.toMatchObject({ code: "ORIGIN_UNAVAILABLE", message: expect.stringMatching(/cannot reach its root .*an empty one/) });
      await expect(origin.stat("a.bin")).rejects.toMatchObject({ code: "ORIGIN_UNAVAILABLE" }); // not once, for as long as it lasts
      await expect(origin.list("", 10)).rejects.toMatchObject({ code: "ORIGIN_UNAVAILABLE" });
      // The mount point itself removed: 502 too.
      rmSync(root, { recursive: true });
      await expect(origin.stat("a.bin")).rejects.toMatchObject({ code: "ORIGIN_UNAVAILABLE", message: expect.stringMatching(/ENOENT/) });
      // ... and an empty directory made there after that is not taken for the root either.
      mkdirSync(root);
      await expect(origin.stat("a.bin")).rejects.toMatchObject({ code: "ORIGIN_UNAVAILABLE", message: expect.stringMatching(/an empty one/) });
      rmSync(root, { recursive: true });
      // Mounted again (another directory, holding files): served, and a missing object is a 404 again.
      renameSync(`${root}.away`, root);
      expect((await origin.stat("a.bin")).size).toBe(3);
      await expect(origin.stat("missing.bin")).rejects.toMatchObject({ code: "OBJECT_NOT_FOUND" });
    } finally {
      rmSync(root, { recursive: true, force: true });
      rmSync(`${root}.away`, { recursive: true, force: true });
    }
  });

  it("follows a root that is a symbolic link led elsewhere (current -> v2), and answers 502 for a root removed and made again empty", async () => {
    const base = mkdtempSync(join(tmpdir(), "rf-root-"));
    try {
      mkdirSync(join(base, "v1"));
      mkdirSync(join(base, "v2"));
      writeFileSync(join(base, "v1", "a.bin"), "x");
      writeFileSync(join(base, "v2", "a.bin"), "xyz");
      writeFileSync(join(base, "v2", "b.bin"), "bb");
      symlinkSync("v1", join(base, "current"));
      const origin = new FsOrigin({ name: "nfs", root: join(base, "current") });
      expect((await origin.stat("a.bin")).size).toBe(1);
      // Led to v2: its objects are found at once, the old ones no longer.
      rmSync(join(base, "current"));
      symlinkSync("v2", join(base, "current"));
      expect((await origin.stat("b.bin")).size).toBe(2);
      expect((await origin.stat("a.bin")).size).toBe(3);
      expect(await origin.list("", 10)).toEqual([{ key: "a.bin", size: 3 }, { key: "b.bin", size: 2 }]);
      // A plain root removed and made again, empty, on the same file system (its inode number
      // may come back): still another directory.
      const plain = join(base, "plain");
      mkdirSync(plain);
      writeFileSync(join(plain, "c.bin"), "c");
      const o2 = new FsOrigin({ name: "nfs2", root: plain });
      expect((await o2.stat("c.bin")).size).toBe(1);
      rmSync(plain, { recursive: true });
      await new Promise((r) => setTimeout(r, 20)); // a later birth time
      mkdirSync(plain);
      await expect(o2.stat("c.bin")).rejects.toMatchObject({ code: "ORIGIN_UNAVAILABLE" });
    } finally {
      rmSync(base, { recursive: true, force: true });
    }
  });
});

describe("a files origin's answers to one request", () => {
  it("lets hundreds of requests wait for a slot without Node warning of an abort-listener leak", async () => {
    const root = mkdtempSync(join(tmpdir(), "rf-root-"));
    writeFileSync(join(root, "a.bin"), "a");
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(w.name);
    process.on("warning", onWarning);
    try {
      const gw = new OriginGateway(new FsOrigin({ name: "data", root }), { concurrency: 1, maxQueue: 1000, metadataTtl: 0 });
      const info = await gw.stat("a.bin");
      await Promise.all(Array.from({ length: 300 }, () => gw.read("a.bin", info, 0, new Uint8Array(1))));
      await new Promise((r) => setTimeout(r, 10)); // warnings are emitted on a later tick
      expect(warnings).not.toContain("MaxListenersExceededWarning");
    } finally {
      process.off("warning", onWarning);
      rmSync(root, { recursive: true, force: true });
    }
  });

  it("do not judge the origin down: keys the file system refuses (a name too long) fail alone, and the others are served", async () => {
    const root = mkdtempSync(join(tmpdir(), "rf-root-"));
    writeFileSync(join(root, "good.bin"), "good");
    const gw = new OriginGateway(new FsOrigin({ name: "data", root, timeoutMs: 1000 }), { concurrency: 2, maxQueue: 64, metadataTtl: 0 });
    try {
      const bad = await Promise.all(Array.from({ length: 8 }, (_, k) => gw.stat(`${String(k).repeat(300)}.bin`).then(() => "ok", (e) => (e as OriginError).code)));
      expect(bad).toEqual(Array(8).fill("OBJECT_NOT_FOUND")); // ENAMETOOLONG: no such object, and about this key only
      expect(gw.stats().down).toBe(false);
      expect((await gw.stat("good.bin")).size).toBe(4);
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

