// Deno.test: the S3 origin under Deno (the AWS SDK on Deno's node:http), against the real RGW
// that scripts/s3/start-rgw.sh runs. Uses S3_ENDPOINT & co. from the environment when set
// (.ci/run exports them), else starts the gateway (reusing a running one) and stops it afterwards
// if it started it. A gateway that cannot start fails these tests, never skips them.

import assert from "node:assert/strict";
import { PutObjectCommand, S3Client } from "@aws-sdk/client-s3";
import { loadConfig } from "../../../src/config/load.ts";
import { listenDeno, s3FetchPoolDeno } from "../../../src/runtime/deno.ts";
import { createServer } from "../../../src/server.ts";
import { type Fault, onceEach, startFaultProxy } from "../../helpers/fault-proxy.ts";
import { selfSignedCert } from "../../helpers/tls.ts";

const ROOT = new URL("../../../", import.meta.url).pathname;
const RGW_DIR = Deno.env.get("RGW_DIR") ?? "/tmp/rackfeed-rgw";

interface S3Env {
  endpoint: string;
  bucket: string;
  region: string;
  started: boolean;
}

async function s3Env(): Promise<S3Env> {
  const e = Deno.env.toObject();
  if (e.S3_ENDPOINT && e.AWS_ACCESS_KEY_ID && e.AWS_SECRET_ACCESS_KEY && e.S3_BUCKET) {
    return { endpoint: e.S3_ENDPOINT, bucket: e.S3_BUCKET, region: e.AWS_REGION ?? "us-east-1", started: false };
  }
  let wasRunning = true;
  try {
    await Deno.stat(`${RGW_DIR}/pids`);
  } catch {
    wasRunning = false;
  }
  const out = await new Deno.Command("bash", {
    args: [`${ROOT}scripts/s3/start-rgw.sh`, "rackfeed-test"],
    env: { RGW_DIR },
    stdout: "piped",
    stderr: "piped",
  }).output();
  if (!out.success) {
    throw new Error(`scripts/s3/start-rgw.sh failed, so the S3 tests cannot run:\n${new TextDecoder().decode(out.stderr).slice(-3000)}`);
  }
  const vars = Object.fromEntries(
    new TextDecoder().decode(out.stdout).split("\n").map((l) => l.split("=", 2)).filter((kv) => kv.length === 2),
  );
  for (const k of ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"]) Deno.env.set(k, vars[k]);
  return { endpoint: vars.S3_ENDPOINT, bucket: vars.S3_BUCKET, region: vars.AWS_REGION, started: !wasRunning };
}

function pattern(n: number, seed: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = (i * 31 + (i >> 9) + seed) & 0xff;
  return out;
}

/** What an S3 test needs: the gateway (started if need be), a work directory, a key prefix and an SDK client; `done()` lets them go. */
async function s3Fixture(name: string) {
  Deno.env.set("AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED", "true");
  const s3 = await s3Env();
  const dir = await Deno.makeTempDir({ prefix: `rackfeed-deno-${name}-` });
  const prefix = `deno-${name}-${Date.now().toString(36)}/`;
  const client = new S3Client({ endpoint: s3.endpoint, region: s3.region, forcePathStyle: true });
  return {
    s3,
    dir,
    prefix,
    client,
    async done() {
      client.destroy();
      await Deno.remove(dir, { recursive: true });
      if (s3.started) {
        await new Deno.Command("bash", { args: [`${ROOT}scripts/s3/stop-rgw.sh`], env: { RGW_DIR }, stdout: "null" }).output();
      }
    },
  };
}

/**
 * A server (and its Deno listener) whose origins are `origins` (written to `dir/c.json`), with
 * 64 KiB blocks of 16 KiB parts and `args` added.
 */
async function serveOrigins(dir: string, origins: Record<string, unknown>, args: string[], s3FetchPool?: typeof s3FetchPoolDeno) {
  await Deno.writeTextFile(`${dir}/c.json`, JSON.stringify({ origins }));
  const config = loadConfig({
    args: [
      "--listen", "127.0.0.1:0", "--config", `${dir}/c.json`, "--cache-dir", `${dir}/cache`, "--block-bytes", "64KiB", "--part-bytes", "16KiB",
      ...args,
    ],
    env: {},
    readTextFile: (p) => Deno.readTextFileSync(p),
    cwd: dir,
  });
  const server = await createServer(config, { now: () => performance.now(), log: () => {}, ...(s3FetchPool ? { s3FetchPool } : {}) });
  return { server, listener: await listenDeno(server.fetch, config.listen) };
}

/** Asserts that bytes `a`..`b` of `obj.bin` from origin `s3` come back exactly. */
async function expectRange(url: string, data: Uint8Array, a: number, b: number, signal?: AbortSignal): Promise<void> {
  const res = await fetch(`${url}/v1/objects/s3/obj.bin`, { headers: { range: `bytes=${a}-${b}` }, signal });
  assert.equal(res.status, 206);
  const got = new Uint8Array(await res.arrayBuffer());
  assert.equal(got.length, b - a + 1);
  assert.ok(got.every((v, j) => v === data[a + j]), `bytes ${a}-${b} differ`);
}

Deno.test({
  name: "S3 origin on Deno: random ranges across blocks equal the original; a dead endpoint gives 502 quickly",
  // The SDK keeps sockets and timers in its pool until destroyed; server.close() destroys it.
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const fx = await s3Fixture("s3");
    const { s3, dir, prefix, client } = fx;
    const size = 700_001;
    const data = pattern(size, 3);
    try {
      await client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}obj.bin`, Body: data }));
      const { server, listener } = await serveOrigins(dir, {
        s3: { url: `s3://${s3.bucket}/${prefix}`, endpoint: s3.endpoint, region: s3.region },
        dead: { url: `s3://${s3.bucket}/${prefix}`, endpoint: "http://127.0.0.1:9", region: s3.region },
      }, ["--origin-retries", "2", "--origin-backoff", "10ms"]);
      try {
        let seed = 7;
        for (let i = 0; i < 25; i++) {
          seed = (seed * 1103515245 + 12345) % 2 ** 31;
          await expectRange(listener.url, data, seed % size, Math.min(size - 1, seed % size + (seed % 150_000)));
        }
        const t0 = performance.now();
        const dead = await fetch(`${listener.url}/v1/objects/dead/obj.bin`);
        assert.equal(dead.status, 502);
        const body = await dead.json();
        assert.match(body.message, /Origin "dead" failed stat "obj.bin".*\(3 attempts\)/);
        assert.ok(performance.now() - t0 < 2000, "502 within 2 s");
      } finally {
        await listener.close();
        await server.close();
      }
    } finally {
      await fx.done();
    }
  },
});

Deno.test({
  name: "S3 origin on Deno's fetch (--s3-http fetch, the Deno default) serves exact bytes through stalls, resets, trickles and SlowDown, never hanging, and closes its pool with the server",
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const fx = await s3Fixture("fetch");
    const { s3, dir, prefix, client } = fx;
    const size = 2_000_003;
    const data = pattern(size, 11);
    // A fault on the first sight of each ranged GET, drawn from a fixed sequence; retries pass.
    const kinds: Fault[] = [
      { kind: "stall", afterBytes: 100 },
      { kind: "reset", afterBytes: 1000 },
      { kind: "trickle", bytes: 512, everyMs: 50 },
      { kind: "slowdown" },
      { kind: "pass" },
    ];
    let drawn = 0;
    const proxy = await startFaultProxy(
      s3.endpoint,
      onceEach((req) => (req.method === "GET" && req.headers.range ? kinds[drawn++ % kinds.length] : undefined)),
    );
    // A port nothing listens on (taken, then let go).
    const free = Deno.listen({ hostname: "127.0.0.1", port: 0 });
    const deadPort = (free.addr as Deno.NetAddr).port;
    free.close();
    // An HTTPS endpoint whose self-signed certificate nothing trusts.
    const { key, cert } = selfSignedCert(dir, "untrusted");
    const untrusted = Deno.serve(
      { hostname: "127.0.0.1", port: 0, cert: await Deno.readTextFile(cert), key: await Deno.readTextFile(key), onListen() {} },
      () => new Response(""),
    );
    try {
      await client.send(new PutObjectCommand({ Bucket: s3.bucket, Key: `${prefix}obj.bin`, Body: data }));
      // As the Deno host builds it: each origin with a pool of its own.
      const { server, listener } = await serveOrigins(dir, {
        s3: { url: `s3://${s3.bucket}/${prefix}`, endpoint: proxy.url, region: s3.region },
        dead: { url: `s3://${s3.bucket}/${prefix}`, endpoint: `http://127.0.0.1:${deadPort}`, region: s3.region },
        untrusted: { url: `s3://${s3.bucket}/${prefix}`, endpoint: `https://127.0.0.1:${untrusted.addr.port}`, region: s3.region },
      }, [
        "--s3-http", "fetch", "--part-sizing", "fixed", "--origin-timeout", "300ms", "--origin-backoff", "10ms", "--origin-hedge", "0",
      ], s3FetchPoolDeno);
      try {
        let seed = 5;
        // 8 readers at once, so stalled, reset and trickling bodies overlap in the fetch pool.
        // A hang fails the test at 45 s instead of holding the suite.
        const stop = new AbortController();
        let hung: ReturnType<typeof setTimeout> | undefined;
        const deadline = new Promise<never>((_, reject) =>
          hung = setTimeout(() => {
            stop.abort();
            reject(new Error("reads still pending after 45 s"));
          }, 45_000)
        );
        const readers = Promise.all(Array.from({ length: 8 }, async () => {
          for (let i = 0; i < 6; i++) {
            seed = (seed * 1103515245 + 12345) % 2 ** 31;
            await expectRange(listener.url, data, seed % size, Math.min(size - 1, seed % size + (seed % 300_000)), stop.signal);
          }
        }));
        try {
          await Promise.race([readers, deadline]);
        } finally {
          clearTimeout(hung);
        }
        // fetch's own message is "fetch failed"; the 502 names the reason, from its cause.
        const dead = await fetch(`${listener.url}/v1/objects/dead/obj.bin`);
        assert.equal(dead.status, 502);
        assert.match((await dead.json()).message, /Origin "dead" failed stat "obj.bin": TypeError: fetch failed: .*Connection refused/);
        const bad = await fetch(`${listener.url}/v1/objects/untrusted/obj.bin`);
        assert.equal(bad.status, 502);
        assert.match((await bad.json()).message, /invalid peer certificate.*CA not trusted here; for a private CA set NODE_EXTRA_CA_CERTS, or DENO_CERT/);
        const metrics = await (await fetch(`${listener.url}/metrics`)).text();
        const timeouts = Number(/^rackfeed_origin_timeouts_total\{origin="s3"\} (\d+)/m.exec(metrics)?.[1]);
        assert.ok(proxy.counts.faults.stall > 0 && proxy.counts.faults.reset > 0 && proxy.counts.faults.trickle > 0, JSON.stringify(proxy.counts.faults));
        assert.ok(timeouts > 0, `timeouts counted: ${timeouts}`);
      } finally {
        // Bounded: after a hang, a response still waiting on a hung fill would hold a graceful close for good.
        const within = (p: Promise<void>) => Promise.race([p, new Promise<void>((r) => setTimeout(r, 5000))]);
        await within(listener.close());
        const pooled = proxy.counts.open;
        await within(server.close());
        // The origin's pool closes with it: no connection to the origin stays open.
        for (let i = 0; i < 100 && proxy.counts.open > 0; i++) await new Promise((r) => setTimeout(r, 20));
        assert.ok(pooled > 0, "idle connections were pooled");
        assert.equal(proxy.counts.open, 0, `connections to the origin still open after close: ${proxy.counts.open}`);
      }
    } finally {
      await proxy.close();
      await untrusted.shutdown();
      await fx.done();
    }
  },
});
