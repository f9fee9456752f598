/**
 * Do cut response bodies (a later block's origin fill fails after the headers went out) leave
 * socket fds behind in the server? Starts rackfeed (node|deno) on an S3 origin behind the fault
 * proxy, which fails every read past the first block, sends N ranged GETs that span 3 blocks over
 * HTTP/1.1 (fetch) or h2c (node:http2), and prints the server's fds before, after, and 5 s later.
 *   set -a; . /tmp/rackfeed-rgw.env; set +a
 *   node --import tsx bench/soak/cut-body-fds.ts node|deno h1|h2c [N=20]
 */
import { PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { spawn } from "node:child_process";
import { randomFillSync } from "node:crypto";
import * as fs from "node:fs";
import * as http2 from "node:http2";
import * as os from "node:os";
import * as path from "node:path";
import { startFaultProxy } from "../../test/helpers/fault-proxy.ts";

const [runtime = "deno", transport = "h1", nArg = "20"] = process.argv.slice(2);
const N = Number(nArg);
const env = process.env;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const WORK = fs.mkdtempSync(path.join(os.tmpdir(), "rf-cutfd-"));
const prefix = `cutfd-${Date.now().toString(36)}/`;
const s3 = new S3Client({ endpoint: env.S3_ENDPOINT, region: env.AWS_REGION ?? "us-east-1", forcePathStyle: true });
await s3.send(new PutObjectCommand({ Bucket: env.S3_BUCKET, Key: `${prefix}obj.bin`, Body: randomFillSync(Buffer.alloc(4 << 20)) }));
const proxy = await startFaultProxy(env.S3_ENDPOINT!, (_n, req) => {
  const m = /bytes=(\d+)-/.exec(String(req.headers.range ?? ""));
  return m && Number(m[1]) >= 1 << 20 ? { kind: "error500" } : { kind: "pass" };
});
fs.writeFileSync(path.join(WORK, "c.json"), JSON.stringify({ origins: { s3: { url: `s3://${env.S3_BUCKET}/${prefix}`, endpoint: proxy.url, region: "us-east-1" } } }));
const args = ["serve", "--config", path.join(WORK, "c.json"), "--listen", "127.0.0.1:0", "--cache-dir", path.join(WORK, "cache"), "--block-bytes", "1MiB", "--origin-retries", "0", "--shm-dir", "off", "--memory-bytes", "2MiB"];
const srv = runtime === "node"
  ? spawn(process.execPath, ["--import", "tsx", "src/main.node.ts", ...args], { stdio: ["ignore", "pipe", "pipe"] })
  : spawn("node_modules/.bin/deno", ["run", "-A", "src/main.ts", ...args], { stdio: ["ignore", "pipe", "pipe"] });
let out = "";
srv.stdout!.on("data", (d) => (out += d));
srv.stderr!.on("data", (d) => (out += d));
for (let i = 0; !/listening on (\S+)/.test(out); i++) { if (i > 400 || srv.exitCode !== null) throw new Error(`server did not start:\n${out}`); await sleep(50); }
const url = /listening on (\S+)/.exec(out)![1];
const fds = () => fs.readdirSync(`/proc/${srv.pid}/fd`).length;
await (await fetch(`${url}/healthz`)).text();
await sleep(300);
const before = fds();
const outcomes: Record<string, number> = {};
const note = (k: string) => (outcomes[k] = (outcomes[k] ?? 0) + 1);
for (let i = 0; i < N; i++) {
  if (transport === "h1") {
    try {
      const r = await fetch(`${url}/v1/objects/s3/obj.bin`, { headers: { range: "bytes=0-3145727", connection: "close" } });
      const b = await r.arrayBuffer();
      note(`${r.status} ${b.byteLength}`);
    } catch (e) {
      note(`cut: ${(e as Error).cause ?? e}`.slice(0, 60));
    }
  } else {
    const s = http2.connect(url);
    s.on("error", () => {});
    await new Promise<void>((resolve) => {
      const st = s.request({ ":path": "/v1/objects/s3/obj.bin", range: "bytes=0-3145727" });
      let n = 0;
      st.on("response", (h) => note(`status ${h[":status"]}`));
      st.on("data", (c: Buffer) => (n += c.length));
      st.on("error", (e) => note(`cut ${e.message}`.slice(0, 60)));
      st.on("close", () => (note(`got ${n}`), resolve()));
    });
    s.close();
  }
}
await sleep(500);
const after = fds();
await sleep(5000);
const later = fds();
console.log(`${runtime} ${transport}: ${N} requests ${JSON.stringify(outcomes)}; server fds before ${before}, after ${after}, 5 s later ${later}`);
srv.kill("SIGTERM");
await new Promise((r) => srv.on("exit", r));
await proxy.close();
fs.rmSync(WORK, { recursive: true, force: true });
