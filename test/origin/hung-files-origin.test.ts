import { execFileSync } from "node:child_process";
import { closeSync, constants, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NODE, NODE_TS, ROOT, startChild } from "../helpers/spawn.ts";

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "rackfeed-hung-origin-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

/** A writer comes and goes: every open blocked on these FIFOs returns. */
function releaseAll(fifos: string[]): void {
  for (const f of fifos) {
    try {
      closeSync(openSync(f, constants.O_WRONLY | constants.O_NONBLOCK));
    } catch {
      // no reader blocked on this one (ENXIO)
    }
  }
}

describe("a files origin whose file system hangs", () => {
  it("cannot take every file thread: after 80 hung reads the server still serves another origin and its metrics", async () => {
    const hung = join(dir, "hung");
    const other = join(dir, "other");
    mkdirSync(hung);
    mkdirSync(other);
    const KEYS = 80; // more than the 64 threads
    for (let i = 0; i < KEYS; i++) writeFileSync(join(hung, `k${i}`), Buffer.alloc(128 * 1024, i));
    writeFileSync(join(other, "fine"), Buffer.alloc(128 * 1024, 9));
    // Deployed as `bin/rackfeed` starts it: 64 file threads on Node.
    process.env.UV_THREADPOOL_SIZE = "64";
    const server = await startChild(NODE, [
      ...NODE_TS, `${ROOT}src/main.node.ts`, "serve", "--listen", "127.0.0.1:0", "--shm-dir", "off",
      "--origin", `hung=${hung}`, "--origin", `other=${other}`, "--cache-dir", join(dir, "cache"),
      "--block-bytes", "64KiB", "--part-bytes", "64KiB", "--metadata-ttl", "1h", "--origin-timeout", "1s",
    ], dir);
    delete process.env.UV_THREADPOOL_SIZE;
    const fifos: string[] = [];
    try {
      // Each object's size and version are cached by a first read; then the file becomes a FIFO,
      // whose open blocks its thread until a writer comes: a read that never returns, as on a
      // hard-mounted NFS share whose server went away.
      await Promise.all(Array.from({ length: KEYS }, async (_, i) => {
        const r = await fetch(`${server.url}/v1/objects/hung/k${i}`, { headers: { range: "bytes=0-9" } });
        expect(r.status).toBe(206);
        await r.arrayBuffer();
      }));
      for (let i = 0; i < KEYS; i++) {
        rmSync(join(hung, `k${i}`));
        execFileSync("mkfifo", [join(hung, `k${i}`)]);
        fifos.push(join(hung, `k${i}`));
      }
      const statuses = await Promise.all(Array.from({ length: KEYS }, async (_, i) => {
        const r = await fetch(`${server.url}/v1/objects/hung/k${i}`, { headers: { range: "bytes=70000-70009" }, signal: AbortSignal.timeout(30_000) });
        await r.arrayBuffer();
        return r.status;
      }));
      // Each is a gateway timeout, or refused at once once enough calls hang (never a 200, never a hang).
      for (const s of statuses) expect([502, 504]).toContain(s);
      expect(statuses.filter((s) => s === 502).length).toBeGreaterThan(0); // refused, not started
      const t0 = performance.now();
      const fine = await fetch(`${server.url}/v1/objects/other/fine`, { signal: AbortSignal.timeout(10_000) });
      expect(fine.status).toBe(200);
      expect(new Uint8Array(await fine.arrayBuffer())).toEqual(new Uint8Array(128 * 1024).fill(9));
      expect(performance.now() - t0).toBeLessThan(5_000);
      const metrics = await fetch(`${server.url}/metrics`, { signal: AbortSignal.timeout(10_000) });
      expect(metrics.status).toBe(200);
      // The share answers again: once the hung calls return, the origin serves new reads.
      releaseAll(fifos);
      writeFileSync(join(hung, "back"), Buffer.alloc(1000, 3));
      let back = 0;
      for (const until = performance.now() + 10_000; back !== 200 && performance.now() < until;) {
        const r = await fetch(`${server.url}/v1/objects/hung/back`);
        back = r.status;
        await r.arrayBuffer();
        if (back !== 200) await new Promise((res) => setTimeout(res, 100));
      }
      expect(back).toBe(200);
    } finally {
      releaseAll(fifos);
      expect(await server.stop()).toBe(0);
    }
  }, 90_000);
});
