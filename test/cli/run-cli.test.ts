import { readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import * as net from "node:net";
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
