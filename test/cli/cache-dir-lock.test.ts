import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAlive } from "../../src/runtime/node.ts";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { NODE, NODE_TS, ROOT, runToExit, startChild } from "../helpers/spawn.ts";

const entry = `${ROOT}src/main.node.ts`;
let ws: Workspace;
beforeAll(async () => {
  ws = await makeWorkspace();
});
afterAll(async () => {
  await ws.remove();
});

/** `rackfeed serve` arguments for a server on `cacheDir`. */
/** The pid a lock file names (it is followed by its process's start time). */
const lockPid = (path: string) => readFileSync(path, "utf8").trim().split(/\s+/)[0];

const serveArgs = (cacheDir: string) => [...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--shm-dir", "off", "--origin", `data=${ws.origin}`, "--cache-dir", cacheDir];

describe("the cache directory lock", () => {
  it("refuses a second server process on the same --cache-dir (exit 2, naming the first's pid) and lets the first go on serving", async () => {
    const dir = join(ws.dir, "shared");
    const first = await startChild(NODE, serveArgs(dir), ws.dir);
    try {
      const second = await runToExit(NODE, serveArgs(dir), ws.dir, 20_000); // one that starts instead is killed then
      expect(second.code, second.out).toBe(2);
      expect(second.out).toMatch(
        new RegExp(`^rackfeed: Invalid --cache-dir ${dir}: Cache directory ${dir} is in use by process ${first.proc.pid} \\(another rackfeed server\\)`, "m"),
      );
      expect((await fetch(`${first.url}/metrics`)).status).toBe(200);
      // The lock holds the first server's pid: the refused one neither took nor removed it.
      expect(lockPid(join(dir, "lock"))).toBe(String(first.proc.pid));
    } finally {
      expect(await first.stop()).toBe(0);
    }
    expect(existsSync(join(dir, "lock"))).toBe(false); // released at shutdown
  }, 60_000);

  it("takes over a lock left by a process that is gone, and releases it at shutdown", async () => {
    const dir = join(ws.dir, "stale");
    const gone = spawnSync(NODE, ["-e", ""]).pid!; // has exited by now
    expect(isAlive(gone)).toBe(false);
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "lock"), `${gone}\n`);
    const server = await startChild(NODE, serveArgs(dir), ws.dir);
    try {
      // Answered: the server is up (and its signal handlers are in place, see `stop`).
      expect((await fetch(`${server.url}/metrics`)).status).toBe(200);
      expect(lockPid(join(dir, "lock"))).toBe(String(server.proc.pid));
    } finally {
      expect(await server.stop()).toBe(0);
    }
    expect(existsSync(join(dir, "lock"))).toBe(false);
  });

  it("takes over a lock whose pid now belongs to another process (its start time differs)", async () => {
    const dir = join(ws.dir, "reused");
    const other = spawn("sleep", ["30"]); // alive, but not the process that wrote the lock
    try {
      expect(isAlive(other.pid!)).toBe(true);
      mkdirSync(dir, { recursive: true });
      writeFileSync(join(dir, "lock"), `${other.pid} 12345@deadbeef\n`);
      const server = await startChild(NODE, serveArgs(dir), ws.dir);
      try {
        expect((await fetch(`${server.url}/metrics`)).status).toBe(200);
        expect(lockPid(join(dir, "lock"))).toBe(String(server.proc.pid));
      } finally {
        expect(await server.stop()).toBe(0);
      }
    } finally {
      other.kill();
    }
  });

  it("keeps one lock, shared and counted, when servers of one process open and close it concurrently", async () => {
    const env = { pid: process.pid, isAlive };
    const gone = spawnSync(NODE, ["-e", ""]).pid!;
    for (let trial = 0; trial < 20; trial++) {
      const cacheDir = join(ws.dir, `concurrent-${trial}`);
      mkdirSync(cacheDir, { recursive: true });
      writeFileSync(join(cacheDir, "lock"), `${gone}\n`); // stale: both race to take it over
      const [a, b] = await Promise.all([startServer(ws, ["--cache-dir", cacheDir], env), startServer(ws, ["--cache-dir", cacheDir], env)]);
      await a.close();
      expect(lockPid(join(cacheDir, "lock")), `trial ${trial}`).toBe(String(process.pid)); // b still holds it
      await b.close();
      expect(existsSync(join(cacheDir, "lock"))).toBe(false);
    }
  });

  it("is shared by servers in one process, and released when the last of them closes", async () => {
    const env = { pid: process.pid, isAlive };
    const servers: RunningServer[] = [];
    try {
      servers.push(await startServer(ws, [], env));
      servers.push(await startServer(ws, [], env));
      const lock = join(ws.cache, "lock");
      expect(lockPid(lock)).toBe(String(process.pid));
      await servers.shift()!.close();
      expect(lockPid(lock)).toBe(String(process.pid)); // the other still holds it
      await servers.shift()!.close();
      expect(existsSync(lock)).toBe(false);
    } finally {
      for (const s of servers) await s.close();
    }
  });
});
