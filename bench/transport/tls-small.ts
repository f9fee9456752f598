// bench/transport/tls-small.ts: latency of small responses over TLS on a keep-alive connection,
// rackfeed on Deno and on Node, HTTP/1.1 and h2 (ALPN), one request at a time, as a trainer's
// small token batches or a reader of small objects meets it. Deno.serve leaves Nagle's algorithm
// on, and a small response over TLS then waited ~44 ms for the client's delayed ACK; rackfeed
// sets TCP_NODELAY on its listener (src/runtime/tcp-listener-deno.ts). The baseline is Node's
// server (TCP_NODELAY by default), the one the README recommended for small batches over TLS.
//
// Run: node --import tsx bench/transport/tls-small.ts [OTHER_CHECKOUT]
// OTHER_CHECKOUT: a tree of another commit, whose Deno server is measured too (e.g. the commit
// before the change: `mkdir /tmp/base && git archive REV | tar -x -C /tmp/base`; it uses this
// checkout's node_modules when it has none).
// Knobs: BENCH_REQUESTS=300 (timed requests per row, after 20 untimed), BENCH_BYTES=4096 (object
// size), BENCH_TLS=0 (cleartext instead: HTTP/1.1 and h2c).

import * as http2 from "node:http2";
import * as http from "node:http";
import * as https from "node:https";
import { existsSync, symlinkSync } from "node:fs";
import { resolve } from "node:path";
import { makeWorkspace, patternBytes } from "../../test/helpers/rackfeed.ts";
import { selfSignedCert } from "../../test/helpers/tls.ts";
import { type ChildServer, DENO, NODE, NODE_TS, ROOT, startChild } from "../../test/helpers/spawn.ts";

const REQUESTS = Number(process.env.BENCH_REQUESTS ?? 300);
const BYTES = Number(process.env.BENCH_BYTES ?? 4096);
const WARMUP = 20;
const TLS = process.env.BENCH_TLS !== "0";
const other = process.argv[2] ? resolve(process.argv[2]) : undefined;
if (other && !existsSync(`${other}/node_modules`)) symlinkSync(`${ROOT}node_modules`, `${other}/node_modules`);

const ws = await makeWorkspace();
await ws.put("small.bin", patternBytes(BYTES, 3));
const tls = selfSignedCert(ws.dir, "bench", { endEntity: true });
const path = "/v1/objects/data/small.bin";

/** Milliseconds of each of `n` requests made one after another, untimed ones first. */
async function timeRequests(get: () => Promise<number>, n: number): Promise<number[]> {
  for (let i = 0; i < WARMUP; i++) await get();
  const ms: number[] = [];
  for (let i = 0; i < n; i++) {
    const t0 = performance.now();
    const got = await get();
    ms.push(performance.now() - t0);
    if (got !== BYTES) throw new Error(`a response of ${got} bytes, expected ${BYTES}`);
  }
  return ms.sort((a, b) => a - b);
}

async function overH1(url: string): Promise<number[]> {
  const agent = TLS ? new https.Agent({ keepAlive: true, maxSockets: 1, rejectUnauthorized: false }) : new http.Agent({ keepAlive: true, maxSockets: 1 });
  try {
    return await timeRequests(() =>
      new Promise((ok, fail) => {
        (TLS ? https : http).get(`${url}${path}`, { agent, rejectUnauthorized: false }, (res) => {
          let n = 0;
          res.on("data", (c: Buffer) => (n += c.length));
          res.on("end", () => ok(n));
        }).on("error", fail);
      }), REQUESTS);
  } finally {
    agent.destroy();
  }
}

async function overH2(url: string): Promise<number[]> {
  const session = http2.connect(url, { rejectUnauthorized: false });
  try {
    return await timeRequests(() =>
      new Promise((ok, fail) => {
        const s = session.request({ ":path": path });
        let n = 0;
        s.on("data", (c: Buffer) => (n += c.length));
        s.on("end", () => ok(n));
        s.on("error", fail);
      }), REQUESTS);
  } finally {
    session.close();
  }
}

const q = (ms: number[], p: number) => ms[Math.min(ms.length - 1, Math.floor(p * ms.length))].toFixed(2);
const serveArgs = ["serve", "--listen", "127.0.0.1:0", "--origin", `data=${ws.dir}/origin`, "--shm-dir", "off", ...(TLS ? ["--tls-cert", tls.cert, "--tls-key", tls.key] : [])];
const servers: { name: string; start: () => Promise<ChildServer> }[] = [
  { name: "rackfeed node (baseline)", start: () => startChild(NODE, [...NODE_TS, "src/main.node.ts", ...serveArgs, "--cache-dir", `${ws.dir}/c1`]) },
  { name: "rackfeed deno", start: () => startChild(DENO, ["run", "-A", "src/main.ts", ...serveArgs, "--cache-dir", `${ws.dir}/c2`]) },
];
if (other) servers.push({ name: `rackfeed deno, ${other}`, start: () => startChild(DENO, ["run", "-A", "src/main.ts", ...serveArgs, "--cache-dir", `${ws.dir}/c3`], other) });

console.log(`tls-small: ${TLS ? "TLS" : "cleartext"}, ${BYTES}-byte object, ${REQUESTS} requests one at a time per row on one keep-alive connection, ${new Date().toISOString().slice(0, 16)} UTC`);
console.log("| server | HTTP/1.1 p50 ms | p99 ms | h2 p50 ms | p99 ms |");
console.log("|---|---|---|---|---|");
try {
  for (const s of servers) {
    const child = await s.start();
    try {
      const h1 = await overH1(child.url);
      const h2 = await overH2(child.url);
      console.log(`| ${s.name} | ${q(h1, 0.5)} | ${q(h1, 0.99)} | ${q(h2, 0.5)} | ${q(h2, 0.99)} |`);
    } finally {
      await child.stop();
    }
  }
} finally {
  await ws.remove();
}
