/**
 * Soak of the S3 origin path under injected faults: a real rackfeed process (Node or Deno) with an
 * s3:// origin reached through bench/soak/fault-proxy-standalone.ts in front of the test RGW,
 * small tiers (eviction in both), and concurrent readers (HTTP/1.1 via undici, h2c via
 * node:http2) doing random Range and whole-object GETs whose every byte is compared with a local
 * copy, while the proxy goes through phases: clean, latency, faults (resets, stalls, SlowDown,
 * 500, trickles; one object overwritten mid-phase), throttle, refuse (origin down ~20 s, then
 * back), blackhole (origin silent ~20 s, then back), idle. After each phase and at idle it prints
 * the origin gauges/counters, the server's fds and RSS; at the end it sends SIGTERM and times the exit.
 *
 *   set -a; . /tmp/rackfeed-rgw.env; set +a          # RGW: scripts/s3/start-rgw.sh (README, Tests)
 *   node --import tsx bench/soak/s3-origin-faults.ts node|deno [READERS=24] [SCALE=1] [SEED=1]
 *
 * SCALE multiplies every phase's length (1 = about 4 minutes of load). Exit code 0 when no
 * wrong bytes, no undocumented status, no hang, gauges back to 0 at idle and SIGTERM exits 0;
 * 1 otherwise (the reasons are printed). Env: SOAK_BIG_MIB (64) size of the 3 big objects,
 * SOAK_KEEP=1 keeps the work directory (server log: WORK/server.log).
 */
import { PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { spawn } from "node:child_process";
import { createHash, randomFillSync } from "node:crypto";
import * as fs from "node:fs";
import * as http2 from "node:http2";
import * as os from "node:os";
import * as path from "node:path";
import { Agent, request as undiciRequest } from "undici";

const [runtime = "node", readersArg = "24", scaleArg = "1", seedArg = "1"] = process.argv.slice(2);
if (runtime !== "node" && runtime !== "deno") {
  console.error("usage: s3-origin-faults.ts node|deno [READERS] [SCALE] [SEED]");
  process.exit(2);
}
const READERS = Number(readersArg);
const SCALE = Number(scaleArg);
const { S3_ENDPOINT, S3_BUCKET, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY } = process.env;
const REGION = process.env.AWS_REGION ?? "us-east-1";
if (!S3_ENDPOINT || !S3_BUCKET || !AWS_ACCESS_KEY_ID || !AWS_SECRET_ACCESS_KEY) {
  console.error("S3_ENDPOINT, S3_BUCKET, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY must be set (set -a; . /tmp/rackfeed-rgw.env; set +a)");
  process.exit(2);
}
process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED = "true";

const MiB = 2 ** 20;
const BIG = Number(process.env.SOAK_BIG_MIB ?? 64) * MiB;
/** A request slower than this is a hang (the documented bound per origin request is ~8.4 s here). */
const HANG_MS = 90_000;
const ORIGIN_TIMEOUT_MS = 2000;
const ORIGIN_RETRIES = 3;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const t00 = performance.now();
const stamp = () => `[${((performance.now() - t00) / 1000).toFixed(1).padStart(6)}s]`;
const log = (...a: unknown[]) => console.log(stamp(), ...a);

let seed = Number(seedArg) >>> 0 || 1;
const rnd = () => {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 2 ** 32;
};
const int = (n: number) => Math.floor(rnd() * n);

// ---- objects: upload, keep local copies of every version ----
const WORK = fs.mkdtempSync(path.join(os.tmpdir(), "rf-s3soak-"));
const prefix = `soak-${Date.now().toString(36)}-${Math.random().toString(36).slice(2, 6)}/`;
const s3 = new S3Client({
  endpoint: S3_ENDPOINT,
  region: REGION,
  forcePathStyle: true,
  credentials: { accessKeyId: AWS_ACCESS_KEY_ID, secretAccessKey: AWS_SECRET_ACCESS_KEY },
});
/** key -> ETag (unquoted) -> bytes. */
const versions = new Map<string, Map<string, Buffer>>();
const sizes = new Map<string, number>();
const randomBytes = (n: number) => randomFillSync(Buffer.allocUnsafe(n));
async function upload(key: string, bytes: Buffer): Promise<string> {
  // RGW's ETag of a single PUT is the MD5: registered before the PUT, so a reader that sees the
  // new version while the PUT is still being acknowledged can check it.
  const md5 = createHash("md5").update(bytes).digest("hex");
  let m = versions.get(key);
  if (!m) versions.set(key, (m = new Map()));
  m.set(md5, bytes);
  const out = await s3.send(new PutObjectCommand({ Bucket: S3_BUCKET, Key: prefix + key, Body: bytes }));
  const etag = (out.ETag ?? "").replace(/"/g, "");
  if (etag !== md5) throw new Error(`ETag of ${key} is ${etag}, expected the MD5 ${md5}`);
  sizes.set(key, bytes.length);
  return etag;
}
const BIGS = ["big-0.bin", "big-1.bin", "big-2.bin"];
const SMALLS: [string, number][] = [
  ["small-empty.bin", 0],
  ["small-1.bin", 1],
  ["small-1000.bin", 1000],
  ["small-64k.bin", 65536],
  ["small-1m-minus.bin", MiB - 1],
  ["small-1m-plus.bin", MiB + 1],
  ["small-3m.bin", 3 * MiB + 17],
  ["small-5m.bin", 5 * MiB],
];
log(`uploading 3 x ${BIG / MiB} MiB + ${SMALLS.length} small objects under s3://${S3_BUCKET}/${prefix}`);
for (const k of BIGS) await upload(k, randomBytes(BIG));
for (const [k, n] of SMALLS) await upload(k, randomBytes(n));

// ---- the proxy and the server ----
const proxy = spawn(process.execPath, ["--import", "tsx", "bench/soak/fault-proxy-standalone.ts", S3_ENDPOINT, "0", seedArg], {
  stdio: ["pipe", "pipe", "inherit"],
});
let proxyOut = "";
const proxyUrl = await new Promise<string>((resolve, reject) => {
  proxy.stdout!.on("data", (d: Buffer) => {
    proxyOut += d;
    const m = /fault proxy listening on (\S+)/.exec(proxyOut);
    if (m) resolve(m[1]);
  });
  proxy.on("exit", (c) => reject(new Error(`proxy exited ${c}: ${proxyOut}`)));
});
const proxyPhase = async (name: string) => {
  const n0 = proxyOut.length;
  proxy.stdin!.write(`${name}\n`);
  for (let i = 0; i < 100 && !proxyOut.slice(n0).includes(name === "stats" ? "stats " : `phase ${name}`); i++) await sleep(20);
  return proxyOut.slice(n0).trim();
};

fs.writeFileSync(
  path.join(WORK, "config.json"),
  JSON.stringify({ origins: { s3: { url: `s3://${S3_BUCKET}/${prefix}`, endpoint: proxyUrl, region: REGION } } }),
);
const args = [
  "serve",
  "--config", path.join(WORK, "config.json"),
  "--listen", "127.0.0.1:0",
  "--cache-dir", path.join(WORK, "cache"),
  "--memory-bytes", "48MiB",
  "--disk-bytes", "96MiB",
  "--block-bytes", "1MiB",
  "--part-bytes", "256KiB",
  "--origin-timeout", `${ORIGIN_TIMEOUT_MS}ms`,
  "--origin-retries", String(ORIGIN_RETRIES),
  "--metadata-ttl", "1s",
  "--shm-dir", "off",
  "--shutdown-grace", "10s",
];
const serverLog = fs.createWriteStream(path.join(WORK, "server.log"));
const srv = runtime === "node"
  ? spawn(process.execPath, ["--import", "tsx", "src/main.node.ts", ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, UV_THREADPOOL_SIZE: "32" },
  })
  : spawn("node_modules/.bin/deno", ["run", "-A", "src/main.ts", ...args], { stdio: ["ignore", "pipe", "pipe"] });
let srvOut = "";
const onSrv = (d: Buffer) => {
  srvOut += d;
  serverLog.write(d);
};
srv.stdout!.on("data", onSrv);
srv.stderr!.on("data", onSrv);
const exited = new Promise<number | null>((r) => srv.on("exit", (c) => r(c)));
const url = await Promise.race([
  new Promise<string>((resolve) => {
    const iv = setInterval(() => {
      const m = /listening on (\S+)/.exec(srvOut);
      if (m) {
        clearInterval(iv);
        resolve(m[1]);
      }
    }, 50);
  }),
  exited.then((c) => {
    throw new Error(`server exited ${c} before listening:\n${srvOut}`);
  }),
]);
log(`${runtime} server pid ${srv.pid} on ${url}, origin through ${proxyUrl}; work dir ${WORK}`);

// ---- probes ----
const fds = () => fs.readdirSync(`/proc/${srv.pid}/fd`).length;
/** The server's fds by kind, and its TCP connections to the proxy (the origin's keep-alive pool) and from clients. */
function fdKinds(): { text: string; toOrigin: number } {
  const kinds: Record<string, number> = {};
  const inodes = new Set<string>();
  for (const f of fs.readdirSync(`/proc/${srv.pid}/fd`)) {
    let t: string;
    try {
      t = fs.readlinkSync(`/proc/${srv.pid}/fd/${f}`);
    } catch {
      continue;
    }
    const k = t.startsWith("socket:") ? "socket" : t.startsWith("anon_inode:") ? t.slice(11) : t.startsWith("pipe:") ? "pipe" : "file";
    if (k === "socket") inodes.add(t.slice(8, -1));
    kinds[k] = (kinds[k] ?? 0) + 1;
  }
  const proxyPort = Number(new URL(proxyUrl).port).toString(16).toUpperCase().padStart(4, "0");
  const serverPort = Number(new URL(url).port).toString(16).toUpperCase().padStart(4, "0");
  let toOrigin = 0, fromClients = 0, other = 0;
  for (const line of fs.readFileSync("/proc/net/tcp", "utf8").split("\n").slice(1)) {
    const f = line.trim().split(/\s+/);
    if (f.length < 10 || !inodes.has(f[9])) continue;
    if (f[2].endsWith(`:${proxyPort}`)) toOrigin++;
    else if (f[1].endsWith(`:${serverPort}`)) fromClients++;
    else other++;
  }
  return { text: `${JSON.stringify(kinds)}; TCP to origin ${toOrigin}, from clients ${fromClients}, other ${other}`, toOrigin };
}
const rssMiB = () => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${srv.pid}/status`, "utf8"))?.[1] ?? 0) / 1024;
const cpuSeconds = () => {
  const f = fs.readFileSync(`/proc/${srv.pid}/stat`, "utf8").split(") ")[1].split(" ");
  return (Number(f[11]) + Number(f[12])) / 100; // utime + stime, in clock ticks (100 per second on Linux)
};
async function metrics(): Promise<Map<string, number>> {
  const text = await (await fetch(`${url}/metrics`, { signal: AbortSignal.timeout(10_000) })).text();
  const out = new Map<string, number>();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const sp = line.lastIndexOf(" ");
    out.set(line.slice(0, sp), Number(line.slice(sp + 1)));
  }
  return out;
}
const M = (m: Map<string, number>, name: string, labels = '{origin="s3"}') => m.get(name + labels) ?? m.get(name) ?? 0;
const SHOWN: [string, string][] = [
  ["inflight", "rackfeed_origin_inflight_requests"],
  ["queued", "rackfeed_origin_queued_requests"],
  ["limit", "rackfeed_origin_concurrency_limit"],
  ["errors", "rackfeed_origin_errors_total"],
  ["retries", "rackfeed_origin_retries_total"],
  ["timeouts", "rackfeed_origin_timeouts_total"],
  ["throttled", "rackfeed_origin_throttled_total"],
];
async function snapshot(what: string): Promise<{ fds: number; rss: number; m: Map<string, number> }> {
  const m = await metrics();
  const f = fds();
  const r = rssMiB();
  const reqs = M(m, "rackfeed_origin_requests_total", '{origin="s3",op="read"}') + M(m, "rackfeed_origin_requests_total", '{origin="s3",op="stat"}');
  log(
    `${what}: fds ${f}, RSS ${r.toFixed(0)} MiB, origin ${SHOWN.map(([k, n]) => `${k} ${M(m, n)}`).join(", ")}, origin requests ${reqs}, ` +
      `fill errors ${M(m, "rackfeed_cache_fill_errors_total", "")}, mem ${(M(m, "rackfeed_cache_bytes", '{tier="memory"}') / MiB).toFixed(0)} MiB, disk ${(M(m, "rackfeed_cache_bytes", '{tier="disk"}') / MiB).toFixed(0)} MiB, evictions mem ${M(m, "rackfeed_cache_evictions_total", '{tier="memory"}')} disk ${M(m, "rackfeed_cache_evictions_total", '{tier="disk"}')}`,
  );
  return { fds: f, rss: r, m };
}

// ---- readers ----
interface Stats {
  requests: number;
  bytesChecked: number;
  byStatus: Record<string, number>;
  slowest: { ms: number; what: string };
  slowestOk: number;
  problems: string[];
  cut: number;
  errorSamples: Map<string, string>;
  versionsSeen: Record<string, number>;
}
const newStats = (): Stats => ({
  requests: 0,
  bytesChecked: 0,
  byStatus: {},
  slowest: { ms: 0, what: "" },
  slowestOk: 0,
  problems: [],
  cut: 0,
  errorSamples: new Map(),
  versionsSeen: {},
});
const total = newStats();
let phaseStats = newStats();
const inc = (s: Stats, k: string) => (s.byStatus[k] = (s.byStatus[k] ?? 0) + 1);
const problem = (msg: string) => {
  for (const s of [total, phaseStats]) if (s.problems.length < 50) s.problems.push(msg);
  log(`PROBLEM ${msg}`);
};

/** One planned request: method, key, headers, and what a correct answer covers. */
interface Plan {
  method: "GET" | "HEAD";
  key: string;
  headers: Record<string, string>;
  desc: string;
  /** Expected [start, end) for 206, computed from the object's size at answer time (sizes may change). */
  expect: (size: number) => { status: 200 | 206 | 416; start: number; end: number };
  conditional?: boolean;
}
function plan(): Plan {
  const x = rnd();
  const big = BIGS[int(BIGS.length)];
  const small = SMALLS[int(SMALLS.length)][0];
  if (x < 0.5) {
    const len = [1 + int(65536), 1 + int(2 * MiB), 1 + int(9 * MiB)][int(3)];
    const a = int(BIG - 1);
    const b = Math.min(BIG - 1, a + len - 1);
    return { method: "GET", key: big, headers: { range: `bytes=${a}-${b}` }, desc: `${big} ${a}-${b}`, expect: (n) => (a >= n ? { status: 416, start: 0, end: 0 } : { status: 206, start: a, end: Math.min(b + 1, n) }) };
  }
  if (x < 0.6) {
    const a = BIG - 1 - int(8 * MiB);
    return { method: "GET", key: big, headers: { range: `bytes=${a}-` }, desc: `${big} ${a}-`, expect: (n) => ({ status: 206, start: a, end: n }) };
  }
  if (x < 0.65) {
    const k = rnd() < 0.5 ? big : small;
    const s = 1 + int(3 * MiB);
    return { method: "GET", key: k, headers: { range: `bytes=-${s}` }, desc: `${k} -${s}`, expect: (n) => (n === 0 ? { status: 416, start: 0, end: 0 } : { status: 206, start: Math.max(0, n - s), end: n }) };
  }
  if (x < 0.82) return { method: "GET", key: small, headers: {}, desc: `${small} whole`, expect: (n) => ({ status: 200, start: 0, end: n }) };
  if (x < 0.84) return { method: "GET", key: big, headers: {}, desc: `${big} whole`, expect: (n) => ({ status: 200, start: 0, end: n }) };
  if (x < 0.88) {
    const k = rnd() < 0.5 ? big : small;
    return { method: "HEAD", key: k, headers: {}, desc: `HEAD ${k}`, expect: (n) => ({ status: 200, start: 0, end: n }) };
  }
  if (x < 0.91) {
    const k = rnd() < 0.5 ? big : small;
    const etags = [...versions.get(k)!.keys()];
    const tag = etags[etags.length - 1];
    return { method: "GET", key: k, headers: { "if-none-match": `"${tag}"` }, desc: `${k} if-none-match`, expect: (n) => ({ status: 200, start: 0, end: n }), conditional: true };
  }
  if (x < 0.95) {
    const k = rnd() < 0.5 ? big : small;
    const a = (sizes.get(k) ?? 0) + int(1000);
    return { method: "GET", key: k, headers: { range: `bytes=${a}-${a + 10}` }, desc: `${k} past end ${a}`, expect: (n) => (a >= n ? { status: 416, start: 0, end: 0 } : { status: 206, start: a, end: Math.min(a + 11, n) }) };
  }
  const missing = `missing-${int(5)}.bin`;
  return { method: "GET", key: missing, headers: {}, desc: `${missing}`, expect: () => ({ status: 200, start: 0, end: 0 }) };
}

const DOCUMENTED_ERRORS = new Set([502, 503, 504]);

/** Checks headers and streams the body through `check`; returns what happened. */
async function runOne(
  send: (p: Plan, signal: AbortSignal) => Promise<{ status: number; headers: Record<string, string | string[] | undefined>; body: AsyncIterable<Uint8Array> }>,
  transport: string,
): Promise<string> {
  const p = plan();
  const t0 = performance.now();
  const ctl = new AbortController();
  const hang = setTimeout(() => ctl.abort(new Error("hang")), HANG_MS);
  const ps = phaseStats;
  const what = `${transport} ${p.desc} [${phaseName}]`;
  let outcome = "";
  try {
    const res = await send(p, ctl.signal);
    const h = (n: string) => {
      const v = res.headers[n];
      return Array.isArray(v) ? v[0] : v;
    };
    const status = res.status;
    outcome = String(status);
    if (p.key.startsWith("missing-")) {
      if (status !== 404 && !DOCUMENTED_ERRORS.has(status)) problem(`${what}: status ${status} for a missing key`);
      let buf = "";
      for await (const c of res.body) buf += Buffer.from(c).toString();
      if (status !== 404) noteError(status, res, what, ps, 0, buf);
      return outcome;
    }
    if (DOCUMENTED_ERRORS.has(status)) {
      let buf = "";
      for await (const c of res.body) buf += Buffer.from(c).toString();
      noteError(status, { headers: res.headers }, what, ps, 0, p.method === "HEAD" ? undefined : buf);
      return outcome;
    }
    const etag = (h("etag") ?? "").replace(/"/g, "");
    const known = versions.get(p.key);
    const bytes = known?.get(etag);
    if (status === 304) {
      for await (const _ of res.body);
      if (!p.conditional || !bytes) problem(`${what}: 304 (etag ${etag})`);
      return outcome;
    }
    if (status === 416 && etag === "" && known) {
      // A 416 carries no ETag: its Content-Range must name the size of a version, and the range must start past it.
      const size = Number(/^bytes \*\/(\d+)$/.exec(h("content-range") ?? "")?.[1]);
      const v = [...known.values()].find((b) => b.length === size);
      if (!v || p.expect(size).status !== 416) problem(`${what}: 416 with content-range ${h("content-range")}`);
      for await (const _ of res.body);
      return outcome;
    }
    if (!bytes) {
      problem(`${what}: status ${status} with unknown ETag "${etag}" (known: ${[...(known?.keys() ?? [])].join(", ")})`);
      for await (const _ of res.body);
      return outcome;
    }
    ps.versionsSeen[`${p.key}@${etag.slice(0, 6)}`] = (ps.versionsSeen[`${p.key}@${etag.slice(0, 6)}`] ?? 0) + 1;
    const exp = p.expect(bytes.length);
    if (status !== exp.status) {
      problem(`${what}: status ${status}, expected ${exp.status} (size ${bytes.length}, etag ${etag.slice(0, 8)})`);
      for await (const _ of res.body);
      return outcome;
    }
    const clen = Number(h("content-length"));
    if (status === 416) {
      if (h("content-range") !== `bytes */${bytes.length}`) problem(`${what}: 416 with content-range ${h("content-range")}`);
      for await (const _ of res.body);
      return outcome;
    }
    if (status === 206 && h("content-range") !== `bytes ${exp.start}-${exp.end - 1}/${bytes.length}`) {
      problem(`${what}: content-range ${h("content-range")}, expected bytes ${exp.start}-${exp.end - 1}/${bytes.length}`);
    }
    if (clen !== exp.end - exp.start) problem(`${what}: content-length ${clen}, expected ${exp.end - exp.start}`);
    if (p.method === "HEAD") {
      for await (const _ of res.body);
      return outcome;
    }
    let at = exp.start;
    let bad = false;
    try {
      for await (const c of res.body) {
        if (bad) continue;
        if (at + c.length > exp.end) {
          problem(`${what}: body longer than expected (${at - exp.start + c.length} > ${exp.end - exp.start})`);
          bad = true;
          continue;
        }
        const want = bytes.subarray(at, at + c.length);
        if (!want.equals(c)) {
          let i = 0;
          while (i < c.length && c[i] === want[i]) i++;
          const others = [...known!.entries()].filter(([t]) => t !== etag).filter(([, b]) => b.subarray(at, at + c.length).equals(c)).map(([t]) => t.slice(0, 8));
          problem(`${what}: WRONG BYTES at offset ${at + i} (etag ${etag.slice(0, 8)}; chunk of ${c.length} matches other version: ${others.join(",") || "none"})`);
          bad = true;
          continue;
        }
        at += c.length;
        ps.bytesChecked += c.length;
        total.bytesChecked += c.length;
      }
    } catch (e) {
      if (ctl.signal.aborted) throw e;
      // A body cut short after its headers: documented when a later block's fill fails mid-stream.
      outcome = `${status}-cut`;
      ps.cut++;
      total.cut++;
      const msg = (e as Error)?.message ?? String(e);
      if (!ps.errorSamples.has(outcome)) ps.errorSamples.set(outcome, `${what}: after ${at - exp.start} of ${exp.end - exp.start} bytes: ${msg}`);
      return outcome;
    }
    if (!bad && at !== exp.end) {
      outcome = `${status}-short`;
      problem(`${what}: body ended after ${at - exp.start} of ${exp.end - exp.start} bytes without an error`);
    }
  } catch (e) {
    if (ctl.signal.aborted) {
      outcome = "HANG";
      problem(`${what}: no complete answer after ${HANG_MS} ms`);
    } else {
      outcome = "neterr";
      const msg = `${(e as { code?: string }).code ?? ""} ${(e as Error)?.message ?? String(e)}`;
      if (!ps.errorSamples.has("neterr")) ps.errorSamples.set("neterr", `${what}: ${msg}`);
    }
  } finally {
    clearTimeout(hang);
    const ms = performance.now() - t0;
    for (const s of [ps, total]) {
      s.requests++;
      inc(s, outcome);
      if (ms > s.slowest.ms) s.slowest = { ms, what: `${what} -> ${outcome}` };
      if ((outcome === "200" || outcome === "206") && ms > s.slowestOk) s.slowestOk = ms;
    }
  }
  return outcome;
}

function noteError(status: number, res: { headers: Record<string, unknown> }, what: string, ps: Stats, _n: number, body?: string): void {
  let code = "";
  if (body !== undefined) {
    try {
      const j = JSON.parse(body);
      code = j.error;
      if (!j.message) problem(`${what}: ${status} without a message: ${body.slice(0, 200)}`);
    } catch {
      problem(`${what}: ${status} whose body is not JSON: ${body.slice(0, 200)}`);
    }
  }
  if (status === 503 && !res.headers["retry-after"]) problem(`${what}: 503 without Retry-After (${code})`);
  const k = `${status} ${code}`;
  if (!ps.errorSamples.has(k)) ps.errorSamples.set(k, `${what}: ${body?.slice(0, 300) ?? ""}`);
}

const agent = new Agent({ connections: 64, headersTimeout: HANG_MS * 2, bodyTimeout: HANG_MS * 2 });
const sendH1 = async (p: Plan, signal: AbortSignal) => {
  const r = await undiciRequest(`${url}/v1/objects/s3/${p.key}`, { method: p.method, headers: p.headers, dispatcher: agent, signal });
  return { status: r.statusCode, headers: r.headers as Record<string, string>, body: r.body as AsyncIterable<Uint8Array> };
};
const h2Sessions = new Set<http2.ClientHttp2Session>();
function h2Sender() {
  let session: http2.ClientHttp2Session | undefined;
  return (p: Plan, signal: AbortSignal) =>
    new Promise<{ status: number; headers: Record<string, string>; body: AsyncIterable<Uint8Array> }>((resolve, reject) => {
      if (!session || session.destroyed || session.closed) {
        // Windows as large as the server's (8 MiB): with the default 64 KiB, a busy client (it checks
        // every byte) throttles its own streams to a WINDOW_UPDATE per event-loop turn.
        session = http2.connect(url, { settings: { initialWindowSize: 8 * MiB } });
        session.on("connect", (s) => s.setLocalWindowSize(32 * MiB));
        session.on("error", () => {});
        h2Sessions.add(session);
        const sess = session;
        session.on("close", () => h2Sessions.delete(sess));
      }
      const st = session.request({ ":method": p.method, ":path": `/v1/objects/s3/${p.key}`, ...p.headers }, { endStream: true, signal });
      st.on("error", reject);
      st.on("response", (hdrs) => {
        resolve({ status: Number(hdrs[":status"]), headers: hdrs as Record<string, string>, body: st });
      });
    });
}

let stopReaders = false;
async function reader(i: number): Promise<void> {
  const h2 = i % 2 === 1;
  const send = h2 ? h2Sender() : sendH1;
  while (!stopReaders) {
    const outcome = await runOne(send, h2 ? "h2c" : "h1");
    // After an error, back off a little (a real client would): bounded load when the origin is down.
    if (/^5|neterr|cut/.test(outcome)) await sleep(20 + int(80));
    else if (rnd() < 0.05) await sleep(int(50));
  }
}

// ---- phases ----
const phaseLog: { name: string; stats: Stats; snap: Awaited<ReturnType<typeof snapshot>> }[] = [];
let phaseName = "start";
async function phase(name: string, proxyRule: string, seconds: number, during?: () => void | Promise<void>): Promise<void> {
  phaseStats = newStats();
  phaseName = name;
  log(`phase ${name}: ${await proxyPhase(proxyRule)} for ${Math.round(seconds * SCALE)} s`);
  const end = performance.now() + seconds * SCALE * 1000;
  if (during) await during();
  while (performance.now() < end) await sleep(Math.min(1000, end - performance.now()));
  const snap = await snapshot(`after ${name}`);
  const s = phaseStats;
  log(
    `  ${name}: ${s.requests} requests, ${(s.bytesChecked / MiB).toFixed(0)} MiB checked, statuses ${JSON.stringify(s.byStatus)}, ` +
      `slowest ${(s.slowest.ms / 1000).toFixed(2)} s (${s.slowest.what}), slowest 200/206 ${(s.slowestOk / 1000).toFixed(2)} s` +
      (Object.keys(s.versionsSeen).some((k) => k.startsWith("big-2") || k.startsWith("small-3m")) ? `, versions ${JSON.stringify(s.versionsSeen)}` : ""),
  );
  for (const [k, v] of s.errorSamples) log(`    e.g. ${k}: ${v}`);
  phaseLog.push({ name, stats: s, snap });
}

const base = await snapshot("start (idle, before load)");
const baseKinds = fdKinds();
const cpu0 = cpuSeconds();
const readers = Array.from({ length: READERS }, (_, i) => reader(i));
if (process.env.SOAK_PHASES) {
  // e.g. SOAK_PHASES=faults:30,clean:5 — a subset of the phases (rule:seconds), for chasing one finding.
  for (const spec of process.env.SOAK_PHASES.split(",")) {
    const [rule, secs] = spec.split(":");
    await phase(rule, rule, Number(secs));
  }
} else {
await phase("clean", "clean", 25);
await phase("latency", "latency", 25);
await phase("faults", "faults", 60, () => {
  void (async () => {
    await sleep(25_000 * SCALE);
    log("overwriting big-2.bin (same size) and small-3m.bin (new size)");
    await upload("big-2.bin", randomBytes(BIG));
    await upload("small-3m.bin", randomBytes(2 * MiB + 5));
    log("overwritten");
  })();
});
await phase("throttle", "throttle", 20);
await phase("refuse (origin down)", "refuse", 20);
await phase("recovery after refuse", "clean", 20);
await phase("blackhole (origin silent)", "blackhole", 20);
await phase("recovery after blackhole", "faults", 25);
await phase("clean again", "clean", 15);
}
if (process.env.SOAK_TERM_BUSY) {
  // SIGTERM with the readers still running (and whatever the last phase's origin does): the exit must
  // come within --shutdown-grace (10 s) + a little, 0 if everything drained, 1 if origin work was abandoned.
  const tTerm = performance.now();
  srv.kill("SIGTERM");
  const killer = setTimeout(() => srv.kill("SIGKILL"), 30_000);
  const code = await exited;
  clearTimeout(killer);
  const termS = (performance.now() - tTerm) / 1000;
  stopReaders = true;
  await Promise.all(readers);
  log(`SIGTERM under load -> exit ${code} after ${termS.toFixed(2)} s; last server lines:\n${srvOut.trim().split("\n").filter((l) => !/^\s/.test(l)).slice(-4).join("\n")}`);
  log(`while shutting down: statuses ${JSON.stringify(phaseStats.byStatus)}, problems ${total.problems.length}`);
  proxy.stdin!.end();
  process.exit(termS > 12 || (code !== 0 && code !== 1) || total.problems.length ? 1 : 0);
}
stopReaders = true;
const tStop = performance.now();
await Promise.all(readers);
log(`readers stopped (${((performance.now() - tStop) / 1000).toFixed(1)} s to finish their last requests)`);
const cpuLoad = cpuSeconds() - cpu0;

// ---- idle ----
const failures: string[] = [];
let idle = await snapshot("idle +0 s");
const tIdle = performance.now();
while (performance.now() - tIdle < 30_000 && (M(idle.m, "rackfeed_origin_inflight_requests") !== 0 || M(idle.m, "rackfeed_origin_queued_requests") !== 0)) {
  await sleep(1000);
  idle = await snapshot(`idle +${((performance.now() - tIdle) / 1000).toFixed(0)} s`);
}
await sleep(5000);
await agent.close();
for (const s of h2Sessions) s.close();
await sleep(2000);
idle = await snapshot("idle, clients closed");
const idleKinds = fdKinds();
if (process.env.SOAK_FD_DUMP) {
  const { execSync } = await import("node:child_process");
  const known = new Set<string>();
  for (const t of ["tcp", "tcp6", "udp", "udp6", "unix", "raw", "netlink"]) {
    for (const line of fs.readFileSync(`/proc/net/${t}`, "utf8").split("\n").slice(1)) {
      const f = line.trim().split(/\s+/);
      const ino = t === "unix" ? f[6] : t === "netlink" ? f[8] : f[9];
      if (ino) known.add(ino);
    }
  }
  const unknown = fs.readdirSync(`/proc/${srv.pid}/fd`).map((f) => { try { return fs.readlinkSync(`/proc/${srv.pid}/fd/${f}`); } catch { return ""; } })
    .filter((t) => t.startsWith("socket:[") && !known.has(t.slice(8, -1)));
  log(`socket fds in no /proc/net table (closed but still open in the process): ${unknown.length}`);
  log(execSync(`ls -l /proc/${srv.pid}/fd | tail -n +2 | awk '{print $NF}' | sort | head -200; ss -tanpe | grep "pid=${srv.pid}," | head -80; ss -xanp | grep "pid=${srv.pid}," | head -20`).toString());
}
log(`server fds at start: ${baseKinds.text}; at idle: ${idleKinds.text}`);
const status = await (await fetch(`${url}/v1/status`)).json().catch(() => undefined);
if (M(idle.m, "rackfeed_origin_inflight_requests") !== 0) failures.push(`origin in-flight gauge ${M(idle.m, "rackfeed_origin_inflight_requests")} at idle`);
if (M(idle.m, "rackfeed_origin_queued_requests") !== 0) failures.push(`origin queued gauge ${M(idle.m, "rackfeed_origin_queued_requests")} at idle`);
// Idle keep-alive connections to the origin are the pool working (bounded by its size), not a leak.
if (idle.fds - idleKinds.toOrigin > base.fds - baseKinds.toOrigin + 5) failures.push(`fds ${base.fds} at start, ${idle.fds} at idle (${idleKinds.text})`);
log(`fills in flight per /v1/status: ${JSON.stringify(status?.cache?.inFlight ?? status?.fillsInFlight ?? "(n/a)")}`);

// ---- SIGTERM ----
const tTerm = performance.now();
srv.kill("SIGTERM");
const killer = setTimeout(() => srv.kill("SIGKILL"), 30_000);
const code = await exited;
clearTimeout(killer);
const termS = (performance.now() - tTerm) / 1000;
log(`SIGTERM -> exit ${code} after ${termS.toFixed(2)} s`);
if (code !== 0) failures.push(`SIGTERM exit code ${code}`);
if (termS > 5) failures.push(`SIGTERM took ${termS.toFixed(1)} s`);
log(`proxy: ${await proxyPhase("stats")}`);
proxy.stdin!.end();
const serverNoise = srvOut.split("\n").filter((l) => /Unhandled|unhandled|TypeError|RangeError|panicked|Uncaught|FATAL|heap/i.test(l));

// ---- report ----
console.log("\n==== summary", runtime, "====");
console.log(`requests ${total.requests}, bytes checked ${(total.bytesChecked / MiB).toFixed(0)} MiB (${total.bytesChecked}), statuses ${JSON.stringify(total.byStatus)}`);
console.log(`slowest response ${(total.slowest.ms / 1000).toFixed(2)} s (${total.slowest.what}); slowest 200/206 ${(total.slowestOk / 1000).toFixed(2)} s`);
console.log(`server: fds ${base.fds} -> ${idle.fds}, RSS ${base.rss.toFixed(0)} -> ${idle.rss.toFixed(0)} MiB (peak during phases ${Math.max(...phaseLog.map((p) => p.snap.rss)).toFixed(0)} MiB), CPU ${cpuLoad.toFixed(0)} s under load`);
console.log(`origin counters at idle: ${SHOWN.map(([k, n]) => `${k} ${M(idle.m, n)}`).join(", ")}`);
console.log(`SIGTERM exit ${code} in ${termS.toFixed(2)} s; server log lines that look like crashes: ${serverNoise.length}`);
for (const l of serverNoise.slice(0, 10)) console.log(`  ${l.slice(0, 300)}`);
for (const p of total.problems) failures.push(p);
console.log(failures.length ? `FAILURES (${failures.length}):\n  ${failures.join("\n  ")}` : "no failures");
if (process.env.SOAK_KEEP) console.log(`work dir kept: ${WORK}`);
else fs.rmSync(WORK, { recursive: true, force: true });
process.exit(failures.length ? 1 : 0);
