import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
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

  it("prints the table of options for --help", async () => {
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "--help"], cwd);
    expect(code).toBe(0);
    expect(out).toMatch(/--block-bytes\s+RACKFEED_BLOCK_BYTES\s+8MiB/);
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
});
