/**
 * @module A rackfeed server (Node listener, 127.0.0.1:0) whose filesystem origin `data` sleeps
 * BENCH_ORIGIN_MS (default 20) before every read and stat: a stand-in for an NFS/S3 round trip.
 * Used by cold-trainer.ts and eviction.ts as a child process, so that the trainer's event loop is
 * not the server's. Prints `listening on URL`; serve flags come from the command line.
 *
 *   node --import tsx bench/datasets/delayed-server.ts ORIGIN_ROOT [serve flags...]
 * BENCH_LOG_ORIGIN=1 logs each origin stat (when it reached the origin, how long it took) to stderr.
 */

import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
import type { ObjectInfo } from "../../src/origin/origin.ts";
import { startServer, type Workspace } from "../../test/helpers/rackfeed.ts";

const ORIGIN_MS = Number(process.env.BENCH_ORIGIN_MS ?? 20);
const LOG = process.env.BENCH_LOG_ORIGIN === "1";
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

class DelayedOrigin extends FsOrigin {
  override async stat(key: string): Promise<ObjectInfo> {
    const t0 = performance.now();
    await sleep(ORIGIN_MS);
    const info = await super.stat(key);
    if (LOG) console.error(`stat ${key} started at ${t0.toFixed(0)} ms, took ${(performance.now() - t0).toFixed(1)} ms`);
    return info;
  }
  override async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    await sleep(ORIGIN_MS);
    return await super.read(key, info, offset, dest);
  }
}

const [root, ...flags] = process.argv.slice(2);
const dir = mkdtempSync(join(tmpdir(), "rackfeed-bench-delayed-"));
const ws: Workspace = { dir, origin: root, cache: join(dir, "cache"), put: async () => {}, remove: async () => {} };
const rf = await startServer(ws, flags, { makeOrigin: () => new DelayedOrigin({ name: "data", root }) });
const stop = async () => {
  await rf.close();
  rmSync(dir, { recursive: true, force: true });
  process.exit(0);
};
process.on("SIGTERM", () => void stop());
process.on("SIGINT", () => void stop());
// Never outlive the benchmark by long.
setTimeout(() => void stop(), 15 * 60_000).unref();
console.log(`listening on ${rf.url}`);
