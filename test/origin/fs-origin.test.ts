import { execFileSync } from "node:child_process";
import { closeSync, constants, mkdtempSync, openSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
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
});
