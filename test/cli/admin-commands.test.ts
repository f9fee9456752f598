import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { parseMetrics, prefetchCommand, renderStats } from "../../src/cli/admin-commands.ts";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
import type { ObjectInfo } from "../../src/origin/origin.ts";
import { freePort, makeWorkspace, patternBytes, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { NODE, NODE_TS, ROOT, runToExit } from "../helpers/spawn.ts";

const ADMIN = "admin-token-for-tests";
const entry = `${ROOT}src/main.node.ts`;
let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  for (let i = 0; i < 4; i++) await ws.put(`warm/${i}.bin`, patternBytes(100_000, i));
  rf = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "64KiB"]);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

describe("rackfeed prefetch", () => {
  it("--watch follows the job to the end and prints a summary that adds up", async () => {
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "prefetch", "--server", rf.url, "--objects", "data/warm/", "--watch", "--admin-token", ADMIN]);
    expect(code, out).toBe(0);
    expect(out).toMatch(/prefetch p\w+-\w+: objects data\/warm\/ → disk tier, 390\.6 KiB in 8 blocks/);
    expect(out).toMatch(/prefetch p\S+ done: 390\.6 KiB of 390\.6 KiB, 4\/4 objects, 8\/8 blocks \(0 already cached\)/);
    expect(await rf.metric("rackfeed_cache_blocks", { tier: "disk" })).toBe(8);
  });

  it("--watch reads through the comment lines of a job that has nothing to tell for a while", async () => {
    /** Each block read takes 300 ms, so the stream sends comment lines between events. */
    class SlowOrigin extends FsOrigin {
      override async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
        await new Promise((r) => setTimeout(r, 300));
        return await super.read(key, info, offset, dest);
      }
    }
    const quiet = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "64KiB", "--cache-dir", `${ws.dir}/cache-quiet`], {
      makeOrigin: () => new SlowOrigin({ name: "data", root: ws.origin }),
      sseKeepAliveMs: 20,
    });
    try {
      const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "prefetch", "--server", quiet.url, "--objects", "data/warm/", "--watch", "--admin-token", ADMIN]);
      expect(code, out).toBe(0);
      expect(out).toMatch(/prefetch p\S+ done: 390\.6 KiB of 390\.6 KiB, 4\/4 objects, 8\/8 blocks/);
    } finally {
      await quiet.close();
    }
  });

  it("exits 2 with the server's message when the admin token is missing", async () => {
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "prefetch", "--server", rf.url, "--objects", "data/warm/"]);
    expect(code).toBe(2);
    expect(out).toMatch(/answered 401: Missing or wrong admin token/);
  });

  it("exits 1 saying it cannot reach the server when nothing listens there", async () => {
    const port = await freePort(); // nothing listens there (port 1 would be refused by fetch itself, as a "bad port")
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "prefetch", "--server", `http://127.0.0.1:${port}/`, "--objects", "data/warm/", "--admin-token", ADMIN]);
    expect(code).toBe(1);
    expect(out).toMatch(new RegExp(`^rackfeed prefetch: cannot reach http://127\\.0\\.0\\.1:${port}: fetch failed \\(.*ECONNREFUSED`, "m"));
    expect(out).not.toMatch(/^\s+at /m); // a message, not a stack trace
  });

  it("--watch exits 1 saying it lost the server when the event stream breaks, without a stack trace", async () => {
    // A server that accepts the job, sends one progress event, then dies mid-stream.
    const job = { id: "p1", state: "running", tier: "disk", what: "objects data/x/", objectsDone: 0, objectsTotal: 1, blocksDone: 0, blocksTotal: 4, blocksCached: 0, bytesDone: 0, bytesTotal: 400, rate: 0, etaSeconds: null, startedAt: null, finishedAt: null, error: null };
    const dying = createServer((req, res) => {
      if (req.method === "POST") {
        res.writeHead(202, { "content-type": "application/json" }).end(JSON.stringify(job));
        return;
      }
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write(`data: ${JSON.stringify(job)}\n\n`);
      setTimeout(() => res.socket?.destroy(), 50);
    });
    await new Promise<void>((r) => dying.listen(0, "127.0.0.1", r));
    const url = `http://127.0.0.1:${(dying.address() as AddressInfo).port}`;
    const out: string[] = [];
    const errors: string[] = [];
    try {
      const code = await prefetchCommand(["--server", url, "--objects", "data/x/", "--watch", "--admin-token", ADMIN], {
        env: {},
        print: (l) => out.push(l),
        printError: (l) => errors.push(l),
      });
      expect(code).toBe(1);
      expect(errors.join("\n")).toMatch(new RegExp(`^rackfeed prefetch: lost ${url.replace(/\./g, "\\.")} while watching job p1: .*the job may still run`, "m"));
      expect(out).toContain("running: 0 B of 400 B");
    } finally {
      dying.closeAllConnections();
      await new Promise((r) => dying.close(r));
    }
  });

  it("exits 2 on bad usage, naming what to fix", async () => {
    const both = await runToExit(NODE, [...NODE_TS, entry, "prefetch", "--server", rf.url, "--objects", "a/", "--dataset", "d"]);
    expect(both.code).toBe(2);
    expect(both.out).toMatch(/either --objects .* or --dataset/);
    const steps = await runToExit(NODE, [...NODE_TS, entry, "prefetch", "--server", rf.url, "--dataset", "d", "--steps", "5"]);
    expect(steps.code).toBe(2);
    expect(steps.out).toMatch(/--steps must be A:B/);
  });
});

describe("rackfeed stats", () => {
  it("prints hit rate per tier, tier usage and origin traffic", async () => {
    await (await fetch(`${rf.url}/v1/objects/data/warm/0.bin`)).arrayBuffer();
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "stats", "--server", rf.url]);
    expect(code, out).toBe(0);
    expect(out).toMatch(/hit rate\s+memory \d+\.\d% \(\d+\)\s+disk/);
    const bytes = await rf.metric("rackfeed_origin_bytes_total", { origin: "data" });
    const reads = await rf.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" });
    expect(out).toMatch(/memory tier [\d.]+ KiB of 1 GiB \(0\.0%\), \d+ blocks/);
    expect(out).toMatch(/disk\s+tier [\d.]+ KiB of 16 GiB/);
    expect(out).toContain(`data: ${(bytes / 1024).toFixed(1)} KiB read, ${reads} reads`);
  });

  it("renders consumers with their look-ahead from the metrics", () => {
    const lines = renderStats(parseMetrics([
      'rackfeed_readahead_steps{dataset="pile",rank="3",world="8",micro_batch="4"} 12',
      'rackfeed_readahead_seconds{dataset="pile",rank="3",world="8",micro_batch="4"} 0.24',
      'rackfeed_consumer_step_seconds{dataset="pile",rank="3",world="8",micro_batch="4"} 0.02',
      'rackfeed_served_bytes_total{transport="http1"} 2048',
      'rackfeed_served_bytes_total{transport="http2"} 3145728',
      'rackfeed_served_bytes_total{transport="shm"} 0',
    ].join("\n")));
    expect(lines).toContain("  pile 3/8 × 4: 12 steps, 0.24 s buffered, 20.0 ms/step");
    expect(lines).toContain("served 2 KiB over HTTP/1.1, 3 MiB over HTTP/2, 0 B over shared memory");
  });

  it("exits 1 saying why the server cannot be reached", async () => {
    const port = await freePort(); // nothing listens there
    const { code, out } = await runToExit(NODE, [...NODE_TS, entry, "stats", "--server", `http://127.0.0.1:${port}`]);
    expect(code).toBe(1);
    expect(out).toContain(`cannot read http://127.0.0.1:${port}/metrics: fetch failed (connect ECONNREFUSED 127.0.0.1:${port})`);
  });
});

describe("--help of the admin commands", () => {
  for (const command of ["prefetch", "stats"]) {
    it(`${command} --help prints the usage and exits 0`, async () => {
      const { code, out } = await runToExit(NODE, [...NODE_TS, entry, command, "--help"]);
      expect(code, out).toBe(0);
      expect(out).toContain(`rackfeed ${command} `);
      expect(out).not.toContain("Unknown option");
    });
  }
});
