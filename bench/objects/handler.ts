// bench/objects/handler.ts — in-process cost of the request handler alone (no sockets): how many
// µs of JS one warm 64 KiB GET costs in rackfeed's `app.fetch` versus a one-route Hono app
// returning the same bytes, on the runtime it runs under. Used by profile.sh; also by hand:
//
//   deno run -A bench/objects/handler.ts DATA_DIR [ITERATIONS]
//   node --import tsx bench/objects/handler.ts DATA_DIR [ITERATIONS]
//
// DATA_DIR holds obj-64k-{0..15}.bin (bench/.out/objects-data after run.sh or profile.sh).
// Each case: the same 16 URLs in rotation, `await fetch(new Request(url))`, body not read (the
// runtime's HTTP server is what reads it; on Node, reading it here would build a full undici
// Response that production never builds); "request only" is the cost of building the Request
// and of the loop itself: subtract it. Node's production requests are @hono/node-server's light
// requests, not undici ones, so on Node this measures the handler's JS, not the adapter's.
import { Hono } from "hono";
import { loadConfig } from "../../src/config/load.ts";
import { createServer } from "../../src/server.ts";

declare const Deno: { args: string[]; makeTempDirSync(): string } | undefined;
const isDeno = typeof Deno !== "undefined";
const args = isDeno ? Deno!.args : process.argv.slice(2);
const dataDir = args[0];
const N = Number(args[1] ?? 100_000);
if (!dataDir) throw new Error("usage: handler.ts DATA_DIR [ITERATIONS]");
if (!isDeno) await import("@hono/node-server"); // as in production: it swaps in its light Response

const { mkdtempSync } = await import("node:fs");
const { tmpdir } = await import("node:os");
const config = loadConfig({
  args: ["--origin", `bench=${dataDir}`, "--cache-dir", mkdtempSync(`${tmpdir()}/rf-handler-`), "--memory-bytes", "256MiB", "--disk-bytes", "1GiB"],
  env: {},
  readTextFile: () => "",
  cwd: process.cwd(),
});
const server = await createServer(config, { now: () => performance.now(), log: (m) => console.error(m) });

const bodies = Array.from({ length: 16 }, (_, i) => new Uint8Array(65536).fill(i));
const HEADERS = { "content-type": "application/octet-stream", "accept-ranges": "bytes", etag: '"x"', "last-modified": new Date().toUTCString(), "content-length": "65536" };
const hono = new Hono();
hono.get("/v1/objects/*", (c) => new Response(bodies[Number(/(\d+)\D*$/.exec(c.req.path)?.[1] ?? 0) % 16], { status: 200, headers: HEADERS }));

const urls = Array.from({ length: 16 }, (_, i) => `http://127.0.0.1/v1/objects/bench/obj-64k-${i}.bin`);
type F = (r: Request) => Response | Promise<Response>;
const cases: [string, F][] = [
  ["request only", () => undefined as unknown as Response],
  ["hono one route", (r) => hono.fetch(r)],
  ["rackfeed app.fetch", (r) => server.fetch(r)],
];
for (const u of urls) {
  const res = await server.fetch(new Request(u));
  if (res.status !== 200) throw new Error(`${u}: ${res.status}`);
}
const runtime = isDeno ? "deno" : `node ${process.version}`;
for (let round = 0; round < 2; round++) { // round 0 warms the JIT
  for (const [name, f] of cases) {
    const t0 = performance.now();
    for (let i = 0; i < N; i++) {
      // Let the event loop turn now and then, as a server's does: a loop that only ever awaits
      // microtasks starves timers and I/O callbacks, and Deno then holds on to memory (~64 KiB
      // per request here) until it turns.
      if ((i & 255) === 0) await new Promise((r) => setTimeout(r, 0));
      await f(new Request(urls[i & 15]));
    }
    const us = ((performance.now() - t0) * 1000) / N;
    if (round === 1) console.log(`${runtime}\t${name}\t${us.toFixed(2)} µs/request`);
  }
}
await server.close();
