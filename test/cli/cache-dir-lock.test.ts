import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { isAlive, nodeFileLock } from "../../src/runtime/node.ts";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { DENO, NODE, NODE_TS, ROOT, runToExit, startChild } from "../helpers/spawn.ts";

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
/** The same on Deno, with the Docker image's permissions (no --allow-run, no --allow-ffi). */
const denoServeArgs = (cacheDir: string) => [
  "run", "--allow-net", "--allow-read", "--allow-write", "--allow-env", "--allow-sys", `${ROOT}src/main.ts`,
  ...serveArgs(cacheDir).slice(NODE_TS.length + 1),
];

/** What a lock file written by this very process would say: its pid, start time and boot (see `processStartTime`). */
function ownLockLine(): string {
  const stat = readFileSync("/proc/self/stat", "utf8");
  const start = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
  const boot = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim().slice(0, 8);
  return `${process.pid} ${start}@${boot}\n`;
}

describe("the cache directory lock", () => {
  it("refuses a second server process on the same --cache-dir (exit 2, naming the first's pid) and lets the first go on serving", async () => {
    const dir = join(ws.dir, "shared");
    const first = await startChild(NODE, serveArgs(dir), ws.dir);
    try {
      const second = await runToExit(NODE, serveArgs(dir), ws.dir, 20_000); // one that starts instead is killed then
      expect(second.code, second.out).toBe(2);
      expect(second.out).toMatch(
        new RegExp(`^rackfeed: Invalid --cache-dir ${dir}: Cache directory ${dir} is in use by process ${first.proc.pid} \\(another rackfeed server,`, "m"),
      );
      expect((await fetch(`${first.url}/metrics`)).status).toBe(200);
      // The lock holds the first server's pid: the refused one neither took nor removed it.
      expect(lockPid(join(dir, "lock"))).toBe(String(first.proc.pid));
    } finally {
      expect(await first.stop()).toBe(0);
    }
    expect(existsSync(join(dir, "lock"))).toBe(false); // released at shutdown
  }, 60_000);

  it("says a cache directory it may not write is that, not a lock problem (a read-only mount), and exits 2", async () => {
    const dir = join(ws.dir, "read-only");
    mkdirSync(dir);
    // Root writes anywhere whatever the modes; a read-only mount refuses even root. Mounted in a
    // namespace of the server's own (`unshare -rm`: no root needed, nothing left mounted).
    const quote = (a: string) => `'${a.replaceAll("'", "'\\''")}'`;
    const serve = [NODE, ...serveArgs(dir)].map(quote).join(" ");
    const r = await runToExit("unshare", ["-rm", "sh", "-c", `mount -t tmpfs -o ro,size=1m tmpfs ${quote(dir)} && exec ${serve}`], ws.dir, 20_000);
    expect(r.code, r.out).toBe(2);
    expect(r.out).toMatch(new RegExp(`^rackfeed: Invalid --cache-dir ${dir}: Cannot write the cache directory ${dir} \\(EROFS\\): run as a user that may write it, or give another --cache-dir`, "m"));
    expect(r.out).not.toMatch(/flock/);
  }, 30_000);

  it("refuses a directory a live server holds even when its lock file names a pid that means nothing here (a server in another container)", async () => {
    const dir = join(ws.dir, "other-namespace");
    const first = await startChild(NODE, serveArgs(dir), ws.dir);
    try {
      // Pid 1 runs here, but under another start time: as a server in another pid namespace
      // (another container on the same directory) would have written it.
      writeFileSync(join(dir, "lock"), "1 999@deadbeef\n");
      const second = await runToExit(NODE, serveArgs(dir), ws.dir, 20_000);
      expect(second.code, second.out).toBe(2);
      expect(second.out).toMatch(new RegExp(`Cache directory ${dir} is in use by process 1 \\(another rackfeed server, on this host or in another container`));
      expect((await fetch(`${first.url}/metrics`)).status).toBe(200);
    } finally {
      expect(await first.stop()).toBe(0);
    }
  }, 60_000);

  it("frees the directory of a server killed with SIGKILL at once, whatever its lock file still says", async () => {
    const dir = join(ws.dir, "killed");
    const first = await startChild(NODE, serveArgs(dir), ws.dir);
    first.proc.kill("SIGKILL");
    await new Promise((r) => first.proc.once("exit", r));
    expect(lockPid(join(dir, "lock"))).toBe(String(first.proc.pid)); // left behind
    // Even a flock holder's line naming a live process with its true start time (this test's: as
    // a pid reused in another container could) does not hold the directory: the kernel's lock
    // went with its process. (An untagged line is a pid lock's, which does hold it: see below.)
    writeFileSync(join(dir, "lock"), `${ownLockLine().trim()} flock\n`);
    const second = await startChild(NODE, serveArgs(dir), ws.dir);
    try {
      expect((await fetch(`${second.url}/metrics`)).status).toBe(200);
      expect(lockPid(join(dir, "lock"))).toBe(String(second.proc.pid));
    } finally {
      expect(await second.stop()).toBe(0);
    }
    expect(existsSync(join(dir, "lock"))).toBe(false);
  }, 60_000);

  it("is one lock across runtimes: a Deno server (no --allow-run) is refused a directory a Node server holds, and takes it once that one stopped", async () => {
    const dir = join(ws.dir, "cross-runtime");
    const node = await startChild(NODE, serveArgs(dir), ws.dir);
    try {
      const refused = await runToExit(DENO, denoServeArgs(dir), ws.dir, 30_000);
      expect(refused.code, refused.out).toBe(2);
      expect(refused.out).toContain(`is in use by process ${node.proc.pid} (another rackfeed server,`);
    } finally {
      expect(await node.stop()).toBe(0);
    }
    const deno = await startChild(DENO, denoServeArgs(dir), ws.dir);
    try {
      expect((await fetch(`${deno.url}/metrics`)).status).toBe(200);
      const again = await runToExit(NODE, serveArgs(dir), ws.dir, 20_000);
      expect(again.code, again.out).toBe(2);
      expect(again.out).toContain(`is in use by process ${deno.proc.pid} (another rackfeed server,`);
    } finally {
      expect(await deno.stop()).toBe(0);
    }
  }, 90_000);

  it("refuses a directory that a live server locked by pid (an older release, or Node without koffi), though no one holds its flock", async () => {
    const dir = join(ws.dir, "pid-locked");
    // A server of this process that locks by pid only.
    const pidLocked = await startServer(ws, ["--cache-dir", dir], { pid: process.pid, isAlive });
    try {
      expect(lockPid(join(dir, "lock"))).toBe(String(process.pid));
      const second = await runToExit(NODE, serveArgs(dir), ws.dir, 20_000);
      expect(second.code, second.out).toBe(2);
      expect(second.out).toContain(`Cache directory ${dir} is in use by process ${process.pid} (another rackfeed server); give each server its own --cache-dir (if no server runs as ${process.pid}, remove ${dir}/lock)`);
      expect(lockPid(join(dir, "lock"))).toBe(String(process.pid)); // left as it was
    } finally {
      await pidLocked.close();
    }
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

  it.each([
    ["the kernel's lock", nodeFileLock()],
    ["the lock by pid (no flock)", undefined],
  ])("keeps one lock, shared and counted, when servers of one process open and close it concurrently (%s)", async (mode, lockFile) => {
    if (mode === "the kernel's lock") expect(lockFile).toBeDefined(); // koffi binds flock on this platform
    const env = { pid: process.pid, isAlive, lockFile };
    const gone = spawnSync(NODE, ["-e", ""]).pid!;
    for (let trial = 0; trial < 20; trial++) {
      const cacheDir = join(ws.dir, `concurrent-${lockFile ? "flock" : "pid"}-${trial}`);
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
