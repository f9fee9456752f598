import { readdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import * as net from "node:net";
import { tmpdir, totalmem } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runCli } from "../../src/cli/run-cli.ts";
import { listenNode } from "../../src/runtime/node.ts";
import { readMetric } from "../helpers/rackfeed.ts";
import { NODE, NODE_TS, ROOT, runToExit, startChild } from "../helpers/spawn.ts";

let cwd: string;
beforeAll(async () => {
  cwd = await mkdtemp(join(tmpdir(), "rackfeed-cli-"));
});
afterAll(async () => {
  await rm(cwd, { recursive: true, force: true });
});

const entry = `${ROOT}src/main.node.ts`;

describe("rackfeed command line (Node entry)", () => {
  it("exits 2 with a message naming the flag and what was expected for a bad size", async () => {
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "serve", "--origin", "d=/tmp", "--memory-bytes", "lots"], cwd);
    expect(code).toBe(2);
    expect(out).toMatch(/rackfeed: Invalid --memory-bytes: expected a size such as .*"lots"/);
  });

  it("exits 2 for an unknown flag and for an unknown command", async () => {
    const flag = await runToExit(NODE, [...NODE_TS, entry, "serve", "--memroy-bytes", "1GiB"], cwd);
    expect(flag.code).toBe(2);
    expect(flag.out).toMatch(/memroy-bytes/);
    const cmd = await runToExit(NODE, [...NODE_TS, entry, "frobnicate"], cwd);
    expect(cmd.code).toBe(2);
    expect(cmd.out).toMatch(/Unknown command "frobnicate"/);
  });

  it("exits 2 when serve has no origin", async () => {
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0"], cwd);
    expect(code).toBe(2);
    expect(out).toMatch(/no origin configured/);
  });

  it("exits 2 when --memory-bytes exceeds this machine's memory, and warns when the budgets only add up to more", async () => {
    const GiB = 2 ** 30;
    const tooBig = totalmem() + GiB;
    const refused = await runToExit(NODE, [...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--shm-dir", "off", "--origin", `d=${cwd}`, "--cache-dir", join(cwd, "c-mem"), "--memory-bytes", String(tooBig)], cwd);
    expect(refused.code, refused.out).toBe(2);
    expect(refused.out).toMatch(/^rackfeed: --memory-bytes [\d.]+ GiB exceeds the memory this process may use, [\d.]+ GiB \((physical memory|cgroup [a-z._]+)\): the kernel would kill the server once the memory tier fills; lower --memory-bytes/m);
    // A tier that fits, with batches in flight on top that do not: it starts, and says so.
    const server = await startChild(NODE, [
      ...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--shm-dir", "off", "--origin", `d=${cwd}`, "--cache-dir", join(cwd, "c-mem"),
      "--memory-bytes", String(totalmem() - GiB), "--batch-inflight-bytes", String(2 * GiB),
    ], cwd);
    try {
      expect(server.output()).toMatch(/rackfeed: warning: --memory-bytes [\d.]+ GiB \+ --batch-inflight-bytes 2\.0 GiB \+ --object-inflight-bytes 1\.0 GiB \+ --batch-pool-bytes 0\.1 GiB \+ --dataset-index-bytes 4\.0 GiB = [\d.]+ GiB exceed the memory this process may use/);
      expect((await fetch(`${server.url}/healthz`)).status).toBe(200);
    } finally {
      expect(await server.stop()).toBe(0);
    }
  });

  it("exits 1 with a clear message when the port is taken", async () => {
    const first = await startChild(NODE, [...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--origin", `d=${cwd}`, "--cache-dir", join(cwd, "c1")], cwd);
    try {
      const port = new URL(first.url).port;
      const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "serve", "--listen", `127.0.0.1:${port}`, "--origin", `d=${cwd}`, "--cache-dir", join(cwd, "c2")], cwd);
      expect(code).toBe(1);
      expect(out).toMatch(new RegExp(`cannot listen on 127.0.0.1:${port}.*EADDRINUSE`));
    } finally {
      await first.stop();
    }
  });

  it("exits 2 naming --cache-dir, without a stack trace, when the cache directory is a regular file", async () => {
    const file = join(cwd, "cache-is-a-file");
    writeFileSync(file, "x");
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--shm-dir", "off", "--origin", `d=${cwd}`, "--cache-dir", file], cwd);
    expect(code, out).toBe(2);
    expect(out).toMatch(new RegExp(`^rackfeed: Invalid --cache-dir ${file}: `, "m"));
    expect(out).not.toMatch(/^\s+at /m);
  });

  it("exits 2, not hangs, when --cache-dir or --shm-dir cannot be made although its parent exists (under /proc)", async () => {
    // Node 20's recursive mkdir loops for ever there (mkdir answers ENOENT under an existing parent).
    const cache = await runToExit(NODE, [...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--shm-dir", "off", "--origin", `d=${cwd}`, "--cache-dir", "/proc/rackfeed-no-such-dir"], cwd, 20_000);
    expect(cache.code, cache.out).toBe(2);
    expect(cache.out).toMatch(/^rackfeed: Invalid --cache-dir \/proc\/rackfeed-no-such-dir: ENOENT/m);
    const shm = await runToExit(NODE, [...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--shm-dir", "/proc/rackfeed-no-such-dir", "--origin", `d=${cwd}`, "--cache-dir", join(cwd, "c-proc")], cwd, 20_000);
    expect(shm.code, shm.out).toBe(2);
    expect(shm.out).toMatch(/Cannot start the shared-memory path on \/proc\/rackfeed-no-such-dir.*ENOENT/);
  });

  it("exits 2 naming --origin when a files origin's root does not exist, or is a file", async () => {
    const missing = join(cwd, "not-mounted");
    const gone = await runToExit(NODE, [...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--shm-dir", "off", "--origin", `data=${missing}`, "--cache-dir", join(cwd, "c-missing")], cwd);
    expect(gone.code, gone.out).toBe(2);
    expect(gone.out).toMatch(new RegExp(`^rackfeed: Invalid --origin data=${missing}: ${missing} cannot be used: ENOENT`, "m"));
    const file = join(cwd, "origin-is-a-file");
    writeFileSync(file, "x");
    const notDir = await runToExit(NODE, [...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--shm-dir", "off", "--origin", `data=${file}`, "--cache-dir", join(cwd, "c-file")], cwd);
    expect(notDir.code, notDir.out).toBe(2);
    expect(notDir.out).toMatch(new RegExp(`^rackfeed: Invalid --origin data=${file}: ${file} is not a directory`, "m"));
  });

  it("prints the table of options for --help", async () => {
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "--help"], cwd);
    expect(code).toBe(0);
    expect(out).toMatch(/--block-bytes\s+RACKFEED_BLOCK_BYTES\s+8MiB/);
    expect(out).toContain("[--dataset NAME=FILE.json]...");
  });

  it("runs as bin/rackfeed from a working directory outside the checkout (tsx found by its path)", async () => {
    const { code, out } = await runToExit(`${ROOT}bin/rackfeed`, ["serve", "--help"], cwd);
    expect(code, out).toBe(0);
    expect(out).toContain("rackfeed serve [--config FILE.json]");
  });

  it("starts the embedded demo with no command, serves its URLs, and stops cleanly on SIGTERM", async () => {
    const demo = await startChild(NODE, [...NODE_TS, entry, "--listen", "127.0.0.1:0"], cwd);
    try {
      for (let i = 0; i < 100 && !demo.output().includes("metrics"); i++) await new Promise((r) => setTimeout(r, 20));
      expect(demo.output()).toMatch(/curl http:\/\/127\.0\.0\.1:\d+\/v1\/objects\/demo\/hello\.txt/);
      const hello = await fetch(`${demo.url}/v1/objects/demo/hello.txt`);
      expect(hello.status).toBe(200);
      expect(await hello.text()).toMatch(/Hello from rackfeed/);
      const range = await fetch(`${demo.url}/v1/objects/demo/shards/shard-00000.bin`, { headers: { range: "bytes=8388600-8388615" } });
      expect(range.status).toBe(206);
      expect((await range.arrayBuffer()).byteLength).toBe(16);
      const batch = await fetch(`${demo.url}/v1/datasets/demo/batches/0?rank=0&world=2&micro_batch=4`);
      expect(batch.status).toBe(200);
      expect(batch.headers.get("x-rackfeed-shape")).toBe("4,1025");
      expect((await batch.arrayBuffer()).byteLength).toBe(4 * 1025 * 2);
      const metrics = await (await fetch(`${demo.url}/metrics`)).text();
      expect(metrics).toMatch(/rackfeed_cache_misses_total [1-9]/);
    } finally {
      expect(await demo.stop()).toBe(0);
    }
  });

  it("prints demo lines that work with a read token, naming a variable and never the token", async () => {
    const token = "demo-read-token-0123456789";
    const demo = await startChild(NODE, [...NODE_TS, entry, "--listen", "127.0.0.1:0", "--read-token", token], cwd);
    try {
      for (let i = 0; i < 100 && !demo.output().includes("metrics"); i++) await new Promise((r) => setTimeout(r, 20));
      expect(demo.output()).not.toContain(token);
      const line = demo.output().split("\n").find((l) => l.includes("/v1/objects/demo/hello.txt"));
      expect(line).toContain('-H "Authorization: Bearer $RACKFEED_READ_TOKEN"');
      const ran = await runToExit("sh", ["-c", `export RACKFEED_READ_TOKEN=${token}; ${line!.trim()}`], cwd);
      expect(ran.out).toContain("Hello from rackfeed");
      expect((await runToExit("sh", ["-c", `export RACKFEED_READ_TOKEN=wrong; ${line!.trim()}`], cwd)).out).toMatch(/Missing or wrong read token/);
    } finally {
      expect(await demo.stop()).toBe(0);
    }
  });

  it("exits after --shutdown-grace on SIGTERM although a request waits on an origin that stopped answering", async () => {
    // An S3 endpoint that accepts connections and never answers.
    const held: net.Socket[] = [];
    const blackHole = net.createServer((s) => held.push(s.on("error", () => {})));
    await new Promise<void>((r) => blackHole.listen(0, "127.0.0.1", r));
    const env = { AWS_ENDPOINT_URL: `http://127.0.0.1:${(blackHole.address() as net.AddressInfo).port}`, AWS_ACCESS_KEY_ID: "k", AWS_SECRET_ACCESS_KEY: "s", AWS_REGION: "us-east-1" };
    const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
    Object.assign(process.env, env); // the child inherits them
    try {
      const server = await startChild(NODE, [
        ...NODE_TS, entry, "serve", "--listen", "127.0.0.1:0", "--origin", "data=s3://bucket/prefix", "--origin-timeout", "600s",
        "--shutdown-grace", "1s", "--shm-dir", join(cwd, "shm-grace"), "--cache-dir", join(cwd, "c-grace"),
      ], cwd);
      expect(readdirSync(join(cwd, "shm-grace")).some((n) => n.endsWith(".sock"))).toBe(true);
      const hanging = fetch(`${server.url}/v1/objects/data/never.bin`).catch(() => undefined);
      for (let i = 0; i < 500 && held.length === 0; i++) await new Promise((r) => setTimeout(r, 20));
      expect(held.length, "the request reached the silent origin").toBeGreaterThan(0);
      expect(await server.stop()).toBe(1); // would wait for the origin (10 minutes) without the grace
      expect(server.output()).toMatch(/still in flight after --shutdown-grace \(1000 ms\); exiting without them/);
      // The server's own close still ran: its shm socket is gone.
      expect(readdirSync(join(cwd, "shm-grace"))).toEqual([]);
      await hanging;
    } finally {
      for (const [k, v] of Object.entries(saved)) if (v === undefined) delete process.env[k];
      else process.env[k] = v;
      for (const s of held) s.destroy();
      blackHole.close();
    }
  });
});

describe("demo budgets", () => {
  /**
   * Runs `runCli` in this process with `args` and `env` (a fake host on the real filesystem and a
   * real listener), reads the tier budgets from /metrics, and shuts it down.
   */
  async function demoBudgets(args: string[], env: Record<string, string> = {}): Promise<{ memory: number; disk: number }> {
    const lines: string[] = [];
    let shutdown: (() => void) | undefined;
    let listening!: (url: string) => void;
    const url = new Promise<string>((r) => (listening = r));
    const code = runCli({
      args,
      env,
      cwd,
      readTextFile: (p) => readFileSync(p, "utf8"),
      listen: listenNode,
      now: () => performance.now(),
      print: (line) => {
        lines.push(line);
        const m = /listening on (\S+)/.exec(line);
        if (m) listening(m[1]);
      },
      printError: (line) => lines.push(line),
      onShutdown: (handler) => (shutdown = handler),
      runtime: "test",
    });
    const ended = code.then((c) => {
      throw new Error(`runCli returned ${c} before listening:\n${lines.join("\n")}`);
    });
    const base = await Promise.race([url, ended]);
    try {
      const text = await (await fetch(`${base}/metrics`)).text();
      return {
        memory: readMetric(text, "rackfeed_cache_budget_bytes", { tier: "memory" }),
        disk: readMetric(text, "rackfeed_cache_budget_bytes", { tier: "disk" }),
      };
    } finally {
      shutdown?.();
      expect(await code, lines.join("\n")).toBe(0);
    }
  }

  it("are defaults: a config file, the environment and flags all set the budgets of a flags-first (demo) command line", async () => {
    const common = ["--listen", "127.0.0.1:0", "--shm-dir", "off"];
    const MiB = 2 ** 20;
    // Nothing set: the demo's small budgets.
    expect(await demoBudgets([...common, "--cache-dir", join(cwd, "demo-c0")])).toEqual({ memory: 256 * MiB, disk: 1024 * MiB });
    // A config file (flags first, so this is the demo).
    writeFileSync(join(cwd, "prod.json"), JSON.stringify({ memoryBytes: "2GiB", diskBytes: "8GiB", cacheDir: join(cwd, "demo-c1") }));
    expect(await demoBudgets(["--config", join(cwd, "prod.json"), ...common])).toEqual({ memory: 2048 * MiB, disk: 8192 * MiB });
    // The environment.
    expect(await demoBudgets([...common, "--cache-dir", join(cwd, "demo-c2")], { RACKFEED_MEMORY_BYTES: "512MiB", RACKFEED_DISK_BYTES: "4GiB" }))
      .toEqual({ memory: 512 * MiB, disk: 4096 * MiB });
    // A flag, and the other budget stays the demo's.
    expect(await demoBudgets(["demo", ...common, "--cache-dir", join(cwd, "demo-c3"), "--disk-bytes", "3GiB"])).toEqual({ memory: 256 * MiB, disk: 3072 * MiB });
  });
});
