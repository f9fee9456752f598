// bench/fill — cold fill from S3 through rackfeed, against the origin's own capacity, same run.
//
// Origin: the real S3 server of the tests (Ceph RGW, scripts/s3/start-rgw.sh) behind the
// loopback fault proxy (test/helpers/fault-proxy.ts) adding BENCH_LATENCY_MS (20) to every
// request and, with BENCH_CONN_MBPS > 0, capping each response at that many MB/s (a model of
// S3's per-connection bandwidth; 0 = no cap) and, with BENCH_LINK_MBPS > 0, all responses together
// at that many MB/s (a model of the origin's link, shared by every connection: what "the origin's
// capacity" means for a real S3 bucket seen from one host). Data: one 1 GiB object and 16 × 64 MiB shards.
//
// Per repetition, interleaved (so drift and neighbours hit all alike), for each data set:
//   single  one connection, plain SDK GETs of the whole object(s), one after another;
//   origin  a plain SDK client with BENCH_PARALLEL (32) 8 MiB range GETs in flight: the capacity;
//   node / deno  rackfeed as a child process with an empty cache (new cache dir): the large
//           object as ONE client GET (the server's read-ahead fans out), the shards as 4
//           concurrent client GETs; every byte counted, lengths checked.
// Figures: MB/s (1e6 bytes/s), median (min–max) over BENCH_REPS (3); ratios per repetition.
//
// BENCH_PIN=1 splits the box as a deployment splits machines: the origin (RGW's processes and
// the proxy, in a child process) on CPU 0, the consumers (this process's clients, rackfeed and
// its client) on CPU 1, so the capacity measured is the origin's and rackfeed's own CPU cost
// shows instead of the two sides starving each other. RGW is unpinned at the end.
//
// Run from the repo root (root needed to start RGW the first time):
//   node --import tsx bench/fill/run.ts            # prints a Markdown table, saves bench/.out/fill.md
// Knobs: BENCH_PIN BENCH_SRC (rackfeed sources to run, default this checkout) BENCH_REPS BENCH_LATENCY_MS BENCH_CONN_MBPS BENCH_LINK_MBPS BENCH_PARALLEL BENCH_RUNTIMES=node,deno
//        BENCH_ARGS="--origin-concurrency 32" (extra rackfeed serve flags)
//        BENCH_NODE_FLAGS="--cpu-prof --cpu-prof-dir=/tmp/prof" (extra node flags of the Node server)

import { GetObjectCommand, HeadObjectCommand, PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { spawn, spawnSync } from "node:child_process";
import { randomFillSync } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { latency, startFaultProxy } from "../../test/helpers/fault-proxy.ts";

process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED = "true";
const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const REPS = Number(process.env.BENCH_REPS ?? 3);
const LATENCY = Number(process.env.BENCH_LATENCY_MS ?? 20);
const CONN_MBPS = Number(process.env.BENCH_CONN_MBPS ?? 0);
const LINK_MBPS = Number(process.env.BENCH_LINK_MBPS ?? 0);
const PARALLEL = Number(process.env.BENCH_PARALLEL ?? 32);
const RUNTIMES = (process.env.BENCH_RUNTIMES ?? "node,deno").split(",").filter(Boolean);
const EXTRA = (process.env.BENCH_ARGS ?? "").split(" ").filter(Boolean);
const PIN = process.env.BENCH_PIN === "1";
const NODE_FLAGS = (process.env.BENCH_NODE_FLAGS ?? "").split(" ").filter(Boolean);
const MiB = 2 ** 20;
// rackfeed's sources (BENCH_SRC: e.g. a `git archive HEAD` snapshot, so edits in the working
// tree during a long run cannot change what is measured).
const SRC = process.env.BENCH_SRC ? process.env.BENCH_SRC.replace(/\/?$/, "/") : ROOT;
// Children die with the bench, however it ends.
const children = new Set<ReturnType<typeof spawn>>();
for (const sig of ["SIGINT", "SIGTERM"] as const) {
  process.on(sig, () => {
    for (const c of children) c.kill("SIGKILL");
    process.exit(130);
  });
}
const PREFIX = "bench-fill/";

interface Obj {
  key: string;
  size: number;
}
const LARGE: Obj[] = [{ key: "large.bin", size: 1024 * MiB }];
const SHARDS: Obj[] = Array.from({ length: 16 }, (_, i) => ({ key: `shards/shard-${String(i).padStart(2, "0")}.bin`, size: 64 * MiB }));

function s3Env(): Record<string, string> {
  const r = spawnSync("bash", [`${ROOT}scripts/s3/start-rgw.sh`, "rackfeed-bench"], { encoding: "utf8", stdio: ["ignore", "pipe", "inherit"] });
  if (r.status !== 0) throw new Error("scripts/s3/start-rgw.sh failed");
  return Object.fromEntries(r.stdout.split("\n").map((l) => l.split("=", 2)).filter((kv) => kv.length === 2));
}

const env = s3Env();
for (const k of ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"]) process.env[k] = env[k];
const bucket = env.S3_BUCKET;
const direct = new S3Client({ endpoint: env.S3_ENDPOINT, region: env.AWS_REGION, forcePathStyle: true });

async function ensureUploaded(objs: Obj[]): Promise<void> {
  const chunk = new Uint8Array(64 * MiB);
  randomFillSync(chunk);
  for (const o of objs) {
    try {
      const h = await direct.send(new HeadObjectCommand({ Bucket: bucket, Key: PREFIX + o.key }));
      if (h.ContentLength === o.size) continue;
    } catch { /* not there yet */ }
    const body = new Uint8Array(o.size);
    for (let at = 0; at < o.size; at += chunk.length) body.set(chunk.subarray(0, Math.min(chunk.length, o.size - at)), at);
    body.set(new TextEncoder().encode(o.key), 0);
    const t0 = performance.now();
    await direct.send(new PutObjectCommand({ Bucket: bucket, Key: PREFIX + o.key, Body: body }));
    console.error(`uploaded ${o.key} (${o.size / MiB} MiB) in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  }
}

async function drain(body: AsyncIterable<Uint8Array>): Promise<number> {
  let n = 0;
  for await (const c of body) n += c.length;
  return n;
}

/** One connection, whole objects one after another. */
async function single(endpoint: string, objs: Obj[]): Promise<number> {
  const c = new S3Client({ endpoint, region: env.AWS_REGION, forcePathStyle: true, requestHandler: { httpAgent: { keepAlive: true, maxSockets: 1 } } });
  let bytes = 0;
  const t0 = performance.now();
  for (const o of objs) {
    const out = await c.send(new GetObjectCommand({ Bucket: bucket, Key: PREFIX + o.key }));
    bytes += await drain(out.Body as AsyncIterable<Uint8Array>);
  }
  const s = (performance.now() - t0) / 1000;
  c.destroy();
  check(bytes, objs);
  return bytes / s / 1e6;
}

/** A plain client with PARALLEL range GETs of 8 MiB in flight over all objects: the origin's capacity. */
async function origin(endpoint: string, objs: Obj[]): Promise<{ mbps: number; cpu: number }> {
  const c = new S3Client({ endpoint, region: env.AWS_REGION, forcePathStyle: true, requestHandler: { httpAgent: { keepAlive: true, maxSockets: PARALLEL } } });
  const ranges = objs.flatMap((o) => Array.from({ length: Math.ceil(o.size / (8 * MiB)) }, (_, i) => [o.key, i * 8 * MiB, Math.min(o.size, (i + 1) * 8 * MiB) - 1] as const));
  let next = 0;
  let bytes = 0;
  const own0 = process.cpuUsage();
  const t0 = performance.now();
  await Promise.all(Array.from({ length: PARALLEL }, async () => {
    while (next < ranges.length) {
      const [key, a, b] = ranges[next++];
      const out = await c.send(new GetObjectCommand({ Bucket: bucket, Key: PREFIX + key, Range: `bytes=${a}-${b}` }));
      const n = await drain(out.Body as AsyncIterable<Uint8Array>);
      bytes += n;
    }
  }));
  const s = (performance.now() - t0) / 1000;
  const own = process.cpuUsage(own0);
  c.destroy();
  check(bytes, objs);
  return { mbps: bytes / s / 1e6, cpu: (own.user + own.system) / 1e6 / (bytes / 1e9) };
}

function check(bytes: number, objs: Obj[]): void {
  const want = objs.reduce((s, o) => s + o.size, 0);
  if (bytes !== want) throw new Error(`read ${bytes} bytes, expected ${want}`);
}

/** rackfeed with an empty cache in a child process; the client reads every byte through it. */
async function rackfeed(runtime: string, endpoint: string, objs: Obj[], clients: number): Promise<{ mbps: number; metrics: string; serverCpu: number; clientCpu: number }> {
  const dir = mkdtempSync(join(tmpdir(), "rackfeed-fill-"));
  const cfg = join(dir, "c.json");
  writeFileSync(cfg, JSON.stringify({ origins: { s3: { url: `s3://${bucket}/${PREFIX}`, endpoint, region: env.AWS_REGION } } }));
  const args = ["serve", "--listen", "127.0.0.1:0", "--config", cfg, "--cache-dir", join(dir, "cache"), "--memory-bytes", "3GiB", "--disk-bytes", "4GiB", ...EXTRA];
  const cmd = runtime === "deno" ? [`${ROOT}node_modules/.bin/deno`, "run", "-A", `${SRC}src/main.ts`, ...args] : [process.execPath, ...NODE_FLAGS, "--import", "tsx", `${SRC}src/main.node.ts`, ...args];
  const proc = spawn(cmd[0], cmd.slice(1), { cwd: SRC, stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, NO_COLOR: "1", DENO_NO_UPDATE_CHECK: "1" } });
  children.add(proc);
  proc.on("exit", () => children.delete(proc));
  let out = "";
  const url = await new Promise<string>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`rackfeed did not start:\n${out}`)), 60_000);
    const on = (d: Buffer) => {
      out += d;
      const m = /listening on (http:\/\/\S+)/.exec(out);
      if (m) {
        clearTimeout(t);
        resolve(m[1]);
      }
    };
    proc.stdout.on("data", on);
    proc.stderr.on("data", on);
    proc.on("exit", (code) => reject(new Error(`rackfeed exited ${code}:\n${out}`)));
  });
  try {
    let next = 0;
    let bytes = 0;
    const cpu0 = cpuSecondsOf(proc.pid!);
    const own0 = process.cpuUsage();
    const t0 = performance.now();
    await Promise.all(Array.from({ length: clients }, async () => {
      while (next < objs.length) {
        const o = objs[next++];
        const res = await fetch(`${url}/v1/objects/s3/${o.key}`, { signal: AbortSignal.timeout(180_000) });
        if (res.status !== 200) throw new Error(`GET ${o.key}: ${res.status} ${await res.text()}`);
        const n = await drain(res.body as unknown as AsyncIterable<Uint8Array>);
        bytes += n;
      }
    }));
    const s = (performance.now() - t0) / 1000;
    const own = process.cpuUsage(own0);
    const serverCpu = cpuSecondsOf(proc.pid!) - cpu0;
    check(bytes, objs);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    // CPU seconds per GB moved: the server's, and this process's (the client reading it).
    return { mbps: bytes / s / 1e6, metrics, serverCpu: serverCpu / (bytes / 1e9), clientCpu: (own.user + own.system) / 1e6 / (bytes / 1e9) };
  } finally {
    proc.kill("SIGTERM");
    await new Promise((r) => proc.once("exit", r));
    rmSync(dir, { recursive: true, force: true });
  }
}

/** User + system CPU seconds a process has used so far (Linux /proc; fields 14 and 15, in clock ticks of 1/100 s). */
function cpuSecondsOf(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8").replace(/^.*\) /, "").split(" ");
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

function metric(text: string, name: string, label = 'origin="s3"'): number {
  const line = text.split("\n").find((l) => l.startsWith(name) && l.includes('origin="s3"') && l.includes(label));
  return line ? Number(line.split(" ").pop()) : 0;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1];
const fmt = (xs: number[], d = 0) => `${median(xs).toFixed(d)} (${Math.min(...xs).toFixed(d)}–${Math.max(...xs).toFixed(d)})`;

/** Pins every thread of `pid` to the CPUs of `mask` (taskset, util-linux). */
function pin(pid: number, mask: string): void {
  const r = spawnSync("taskset", ["-a", "-p", mask, String(pid)], { encoding: "utf8" });
  if (r.status !== 0) throw new Error(`taskset -a -p ${mask} ${pid} failed: ${r.stderr}`);
}
const rgwPids = () =>
  spawnSync("pgrep", ["-f", "^(ceph-mon|ceph-osd|radosgw) -c /tmp/rackfeed-rgw"], { encoding: "utf8" }).stdout.split("\n").filter(Boolean).map(Number);

/** The proxy: in this process, or pinned with the origin in a child (BENCH_PIN). */
async function startProxy(): Promise<{ url: string; close: () => Promise<void> }> {
  if (!PIN) {
    return await startFaultProxy(env.S3_ENDPOINT, latency(LATENCY, CONN_MBPS > 0 ? CONN_MBPS * 1e6 : undefined), LINK_MBPS > 0 ? { linkBytesPerSec: LINK_MBPS * 1e6 } : {});
  }
  const child = spawn("taskset", ["-c", "0", process.execPath, "--import", "tsx", `${ROOT}bench/fill/proxy.ts`, env.S3_ENDPOINT, String(LATENCY), String(CONN_MBPS), String(LINK_MBPS)], { cwd: ROOT, stdio: ["ignore", "pipe", "inherit"] });
  children.add(child);
  const url = await new Promise<string>((resolve, reject) => {
    let out = "";
    child.stdout!.on("data", (d: Buffer) => {
      out += d;
      if (out.includes("\n")) resolve(out.trim());
    });
    child.once("exit", (code) => reject(new Error(`fault proxy exited with ${code}`)));
  });
  return { url, close: () => Promise.resolve(void child.kill("SIGKILL")) };
}

await ensureUploaded([...LARGE, ...SHARDS]);
if (PIN) {
  const pids = rgwPids();
  if (pids.length !== 3) throw new Error(`BENCH_PIN: expected RGW's 3 processes (ceph-mon, ceph-osd, radosgw), found ${pids.length}`);
  for (const p of pids) pin(p, "0x1");
  pin(process.pid, "0x2"); // children spawned from now on (rackfeed) inherit CPU 1
  process.on("exit", () => {
    for (const p of rgwPids()) spawnSync("taskset", ["-a", "-p", "0xffffffff", String(p)]);
  });
}
const proxy = await startProxy();
console.error(`proxy ${proxy.url}: +${LATENCY} ms per request${CONN_MBPS ? `, ${CONN_MBPS} MB/s per response` : ""}${LINK_MBPS ? `, ${LINK_MBPS} MB/s for all responses together` : ""}`);
const sets = [["1 GiB object", LARGE, 1], ["16 × 64 MiB shards", SHARDS, 4]] as const;
const results: Record<string, Record<string, number[]>> = {};
const notes: string[] = [];
for (let rep = 0; rep < REPS; rep++) {
  for (const [name, objs, clients] of sets) {
    const r = (results[name] ??= {});
    const add = (k: string, v: number) => (r[k] ??= []).push(v);
    add("single", await single(proxy.url, objs));
    const capacity = await origin(proxy.url, objs);
    add("origin", capacity.mbps);
    add("origin cpu", capacity.cpu);
    for (const rt of RUNTIMES) {
      const { mbps, metrics, serverCpu, clientCpu } = await rackfeed(rt, proxy.url, objs, clients);
      add(rt, mbps);
      add(`${rt} cpu`, serverCpu);
      add(`${rt} client cpu`, clientCpu);
      add(`${rt}/origin`, mbps / r.origin[rep]);
      add(`${rt}/single`, mbps / r.single[rep]);
      // Bytes fetched beyond those served are hedges' and retries' waste: CPU on this box.
      const fetched = metric(metrics, "rackfeed_origin_bytes_total") / objs.reduce((a, o) => a + o.size, 0);
      notes.push(`rep ${rep} ${name} ${rt}: ${metric(metrics, "rackfeed_origin_requests_total", 'op="read"').toFixed(0)} origin requests, ${metric(metrics, "rackfeed_origin_hedged_requests_total")} hedged, origin bytes ${fetched.toFixed(2)}× the data`);
      const errors = metric(metrics, "rackfeed_origin_errors_total");
      if (errors > 0) notes.push(`rep ${rep} ${name} ${rt}: ${errors} origin errors, ${metric(metrics, "rackfeed_origin_retries_total")} retries`);
    }
    notes.push(`rep ${rep} ${name}: load average ${loadavg().map((x) => x.toFixed(1)).join(" ")}`);
    console.error(`rep ${rep} ${name}: ${Object.entries(r).map(([k, v]) => `${k} ${v[rep].toFixed(k.includes("/") || k.includes("cpu") ? 2 : 0)}`).join(", ")}`);
  }
}
await proxy.close();
direct.destroy();

const lines = [
  `Origin: Ceph RGW 16 (memstore) on loopback behind the fault proxy, +${LATENCY} ms per request` +
  (CONN_MBPS ? `, each response capped at ${CONN_MBPS} MB/s` : ", no per-response cap") +
  (LINK_MBPS ? `, all responses together at ${LINK_MBPS} MB/s (the origin's link)` : ", no link cap") +
  (PIN ? "; origin (RGW + proxy) pinned to CPU 0, clients and rackfeed to CPU 1" : "") +
  `; rackfeed flags: defaults${EXTRA.length ? ` + ${EXTRA.join(" ")}` : ""}; ${REPS} repetitions, median (min–max), MB/s = 1e6 B/s.`,
  "",
  `| data | single stream | origin capacity (${PARALLEL} × 8 MiB ranges) | ${RUNTIMES.map((r) => `rackfeed ${r} cold`).join(" | ")} | ${RUNTIMES.map((r) => `${r} ÷ capacity | ${r} ÷ single`).join(" | ")} |`,
  `|---|---|---|${RUNTIMES.map(() => "---|").join("")}${RUNTIMES.map(() => "---|---|").join("")}`,
  ...sets.map(([name]) => {
    const r = results[name];
    return `| ${name} | ${fmt(r.single)} | ${fmt(r.origin)} | ${RUNTIMES.map((rt) => fmt(r[rt])).join(" | ")} | ${RUNTIMES.map((rt) => `${fmt(r[`${rt}/origin`], 2)} | ${fmt(r[`${rt}/single`], 2)}`).join(" | ")} |`;
  }),
  "",
  "CPU seconds per GB moved (median): the plain capacity client's; rackfeed's server process and the client reading it.",
  "",
  `| data | capacity client | ${RUNTIMES.map((r) => `rackfeed ${r} server | its client`).join(" | ")} |`,
  `|---|---|${RUNTIMES.map(() => "---|---|").join("")}`,
  ...sets.map(([name]) => {
    const r = results[name];
    return `| ${name} | ${fmt(r["origin cpu"], 2)} | ${RUNTIMES.map((rt) => `${fmt(r[`${rt} cpu`], 2)} | ${fmt(r[`${rt} client cpu`], 2)}`).join(" | ")} |`;
  }),
  ...(notes.length ? ["", ...notes.map((n) => `- ${n}`)] : []),
];
mkdirSync(`${ROOT}bench/.out`, { recursive: true });
writeFileSync(`${ROOT}bench/.out/fill.md`, lines.join("\n") + "\n");
console.log(lines.join("\n"));
