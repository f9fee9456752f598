// Deno.test smoke suite: the shared server code under Deno's own HTTP server and file APIs.
// Run with `deno test -A test/runtime/deno/` (part of `npm test`).

import assert from "node:assert/strict";
import { Buffer } from "node:buffer";
import { loadConfig } from "../../../src/config/load.ts";
import { clientGoneDeno, denoBody, listenDeno, oneChunkStream, whenDoneDeno } from "../../../src/runtime/deno.ts";
import { createServer, type ServerEnv } from "../../../src/server.ts";
import type { ListenLimits } from "../../../src/runtime/listener.ts";
import { pausedStream } from "../../helpers/h2-streams.ts";

async function waitUntil(cond: () => Promise<boolean>, what: string, timeoutMs = 10_000): Promise<void> {
  const t0 = Date.now();
  while (!(await cond())) {
    if (Date.now() - t0 > timeoutMs) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((ok) => setTimeout(ok, 10));
  }
}

/** This process's sockets on 127.0.0.1:`port` in a state, through the native library (which must be built). */
async function tcpSocketFds(port: number, state: "listen" | "established"): Promise<number[]> {
  const { loadNativeTcp } = await import("../../../src/runtime/native-tcp-deno.ts");
  const tcp = loadNativeTcp();
  assert.ok(tcp, "native/build/librackfeed.so is built and loads");
  return tcp.list("127.0.0.1", port).filter((s) => s.state === state).map((s) => s.fd);
}

function pattern(n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = (i * 31 + (i >> 8)) & 0xff;
  return out;
}

async function withServer(
  args: string[],
  fn: (url: string, dir: string) => Promise<void>,
  env: Partial<ServerEnv> = {},
  tls?: (dir: string) => { cert: string; key: string },
  limits?: ListenLimits,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-" });
  await Deno.mkdir(`${dir}/origin`);
  await Deno.writeFile(`${dir}/origin/shard.bin`, pattern(200_000));
  const config = loadConfig({
    args: ["--listen", "127.0.0.1:0", "--origin", `data=${dir}/origin`, "--cache-dir", `${dir}/cache`, ...args],
    env: {},
    readTextFile: (p) => Deno.readTextFileSync(p),
    cwd: dir,
  });
  const server = await createServer(config, { now: () => performance.now(), log: () => {}, wrapBody: oneChunkStream, ...env });
  const listener = await listenDeno(server.fetch, config.listen, tls?.(dir), limits);
  try {
    await fn(listener.url, dir);
  } finally {
    await listener.close();
    await server.close();
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("serves a range spanning three blocks with 206 and content-range", async () => {
  await withServer(["--block-bytes", "64KiB"], async (url) => {
    const res = await fetch(`${url}/v1/objects/data/shard.bin`, { headers: { range: "bytes=65535-131072" } });
    assert.equal(res.status, 206);
    assert.equal(res.headers.get("content-range"), "bytes 65535-131072/200000");
    const got = new Uint8Array(await res.arrayBuffer());
    assert.deepEqual(got, pattern(200_000).subarray(65535, 131073));
  });
});

Deno.test("serves one-block bodies as uncopied stream chunks without damaging the cached block", async () => {
  await withServer(["--block-bytes", "64KiB"], async (url) => {
    for (let round = 0; round < 3; round++) {
      const res = await fetch(`${url}/v1/objects/data/shard.bin`, { headers: { range: "bytes=70000-80000" } });
      assert.equal(res.status, 206);
      assert.equal(res.headers.get("content-length"), "10001");
      assert.deepEqual(new Uint8Array(await res.arrayBuffer()), pattern(200_000).subarray(70000, 80001), `round ${round}`);
    }
  });
});

Deno.test("answers 416 beyond the end and 304 for a matching If-None-Match", async () => {
  await withServer([], async (url) => {
    const beyond = await fetch(`${url}/v1/objects/data/shard.bin`, { headers: { range: "bytes=200000-" } });
    assert.equal(beyond.status, 416);
    await beyond.body?.cancel();
    const first = await fetch(`${url}/v1/objects/data/shard.bin`, { method: "HEAD" });
    const etag = first.headers.get("etag")!;
    const again = await fetch(`${url}/v1/objects/data/shard.bin`, { headers: { "if-none-match": etag } });
    assert.equal(again.status, 304);
    await again.body?.cancel();
  });
});

Deno.test("refuses a Host header that carries part of a path (Deno builds the request's URL from it)", async () => {
  await withServer([], async (url) => {
    const { hostname, port } = new URL(url);
    const raw = async (host: string, target: string) => {
      const conn = await Deno.connect({ hostname, port: Number(port) });
      await conn.write(new TextEncoder().encode(`GET ${target} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`));
      const text = new TextDecoder("latin1").decode(await new Response(conn.readable).arrayBuffer());
      return { status: Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1] ?? 0), text };
    };
    const sneaky = await raw(`${hostname}/v1/objects/data`, "/shard.bin");
    assert.equal(sneaky.status, 400, sneaky.text.slice(0, 200));
    assert.match(sneaky.text, /Invalid Host header/);
    assert.equal((await raw(`${hostname}:${port}`, "/v1/objects/data/shard.bin")).status, 200);
    // Hosts Node's server refuses, and Deno served: both runtimes answer them 400 now.
    for (const host of ["a:b", "[::1", ":80", "127.0.0.1:99999", "", "[1]", "[:]", "[1.2.3.4]", "999.1.1.1"]) {
      const r = await raw(host, "/healthz");
      assert.equal(r.status, 400, `${JSON.stringify(host)}: ${r.text.slice(0, 200)}`);
      assert.match(r.text, /Invalid Host header/);
    }
    for (const host of ["bücher.de", "LOCALHOST:80", "my_service:8080", "[::1]:80"]) assert.equal((await raw(host, "/healthz")).status, 200, host);
  });
});

Deno.test("refuses an HTTP/2 authority with a user part (Deno gives HTTP/2 requests no Host header)", async () => {
  const http2 = await import("node:http2");
  await withServer([], async (url) => {
    const session = http2.connect(url);
    const status = (authority: string) =>
      new Promise<number>((resolve, reject) => {
        const req = session.request({ ":path": "/healthz", ":authority": authority });
        req.on("response", (h) => resolve(Number(h[":status"])));
        req.on("error", reject);
        req.resume();
        req.end();
      });
    try {
      assert.equal(await status("u@x"), 400);
      assert.equal(await status("x:1"), 200);
    } finally {
      session.close();
    }
  });
});

Deno.test("keeps the warm cache across a restart on Deno's file APIs", async () => {
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-warm-" });
  try {
    await Deno.mkdir(`${dir}/origin`);
    await Deno.writeFile(`${dir}/origin/a.bin`, pattern(150_000));
    const config = loadConfig({
      args: ["--origin", `data=${dir}/origin`, "--cache-dir", `${dir}/cache`, "--block-bytes", "64KiB"],
      env: {},
      readTextFile: (p) => Deno.readTextFileSync(p),
      cwd: dir,
    });
    for (const round of [0, 1]) {
      const server = await createServer(config, { now: () => performance.now(), log: () => {} });
      const res = await server.fetch(new Request("http://x/v1/objects/data/a.bin"));
      assert.deepEqual(new Uint8Array(await res.arrayBuffer()), pattern(150_000));
      const reads = server.origins.get("data")!.stats().requests.read;
      assert.equal(reads, round === 0 ? 3 : 0, `origin reads in round ${round}`);
      await server.close();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the client SDK reads objects and iterates batches on Deno", async () => {
  const { RackfeedClient } = await import("../../../src/client/mod.ts");
  const { encodeIndex } = await import("../../../src/dataset/mod.ts");
  await withServer(["--admin-token", "deno-admin-token"], async (url, dir) => {
    const lengths = Array.from({ length: 50 }, (_, i) => 100 + i * 7);
    const tokens = lengths.reduce((a, b) => a + b, 0);
    await Deno.writeFile(`${dir}/origin/t.idx`, encodeIndex({ dtypeCode: 8, lengths }));
    await Deno.writeFile(`${dir}/origin/t.bin`, new Uint8Array(new Uint16Array(tokens).map((_, i) => i % 5000).buffer));
    const put = await fetch(`${url}/v1/datasets/t`, {
      method: "PUT",
      headers: { authorization: "Bearer deno-admin-token" },
      body: JSON.stringify({ sources: [{ prefix: "data/t" }], seq_length: 32, seed: 1, split: "100,0,0", split_index: 0, num_samples: 100 }),
    });
    assert.equal(put.status, 201);
    const c = new RackfeedClient({ url });
    assert.deepEqual(await c.readObject("data", "shard.bin", { start: 1, end: 4 }), pattern(200_000).subarray(1, 4));
    const steps: number[] = [];
    for await (const b of c.batches("t", { rank: 0, world: 1, microBatch: 4, endStep: 5 })) {
      steps.push(b.step);
      assert.equal(b.tokens.length, 4 * 33);
    }
    assert.deepEqual(steps, [0, 1, 2, 3, 4]);
    await c.close();
  });
});

Deno.test("versions a file as Node does: inode, size and the modification time in whole milliseconds", async () => {
  const { FsOrigin } = await import("../../../src/origin/fs-origin.ts");
  const { utimesSync } = await import("node:fs");
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-version-" });
  try {
    await Deno.writeFile(`${dir}/v.bin`, new Uint8Array(1000));
    utimesSync(`${dir}/v.bin`, 1_700_000_000.123456, 1_700_000_000.123456);
    const st = Deno.statSync(`${dir}/v.bin`);
    const info = await new FsOrigin({ name: "data", root: dir }).stat("v.bin");
    // The same string test/origin/fs-origin.test.ts expects on Node for the same times.
    assert.equal(info.version, `${st.ino!.toString(36)}-${(1000).toString(36)}-${(1_700_000_000_123 * 1000).toString(36)}`);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the SDK's createClient gives up an HTTP/2 connection that went silent once an attempt timed out", async () => {
  const { createClient } = await import("../../../src/client/deno.ts");
  const { selfSignedCert } = await import("../../helpers/tls.ts");
  const { startSilentProxy } = await import("../../helpers/silent-proxy.ts");
  let ca = "";
  const tls = (dir: string) => {
    const files = selfSignedCert(dir, "silent", { endEntity: true });
    ca = Deno.readTextFileSync(files.cert);
    return { cert: ca, key: Deno.readTextFileSync(files.key) };
  };
  await withServer([], async (url) => {
    // The first connection stops after 30 KB from the server (the object is 200 KB), open and silent.
    const proxy = await startSilentProxy(Number(new URL(url).port), 30_000);
    const c = createClient({ url: `https://${proxy.hostPort}`, ca, shm: false, timeoutMs: 1000, retryForMs: 8000, backoffMs: 5 });
    try {
      for (let i = 0; i < 3; i++) assert.deepEqual(await c.readObject("data", "shard.bin"), pattern(200_000));
      assert.equal(proxy.silenced, true);
      assert.ok(c.retried > 0);
      assert.ok(proxy.connections > 1, `connections through the proxy: ${proxy.connections}`);
    } finally {
      await c.close();
      await proxy.close();
    }
  }, {}, tls);
});

/** Admin token of the servers that `registerBatchDataset` registers a dataset with. */
const BATCH_ADMIN = "deno-admin-token";

/**
 * Writes token dataset `p` (300 synthetic documents, seed 9) to the origin of the server at `url`
 * (directory `dir`) and registers it, 16 000 samples, with admin token `BATCH_ADMIN`.
 */
async function registerBatchDataset(url: string, dir: string): Promise<void> {
  const { syntheticDataset } = await import("../../helpers/token-data.ts");
  const { idx, bin } = syntheticDataset(300, 500, 6000, 9);
  await Deno.writeFile(`${dir}/origin/p.idx`, idx);
  await Deno.writeFile(`${dir}/origin/p.bin`, bin);
  const put = await fetch(`${url}/v1/datasets/p`, {
    method: "PUT",
    headers: { authorization: `Bearer ${BATCH_ADMIN}` },
    body: JSON.stringify({ sources: [{ prefix: "data/p" }], seq_length: 4096, seed: 2, split: "100,0,0", split_index: 0, num_samples: 16_000 }),
  });
  assert.equal(put.status, 201);
}

/** The value of an unlabelled metric of the server at `url`; -1 when it is not there. */
async function gaugeOf(url: string, name: string): Promise<number> {
  return Number(new RegExp(`^${name} (\\d+)$`, "m").exec(await (await fetch(`${url}/metrics`)).text())?.[1] ?? -1);
}

Deno.test("holds HTTP batch bodies in flight until Deno has completed their responses and never reuses one; concurrent slow and fast readers get exact bytes", async () => {
  const path = (step: number, mb: number) => `/v1/datasets/p/batches/${step}?rank=0&world=1&micro_batch=${mb}`;
  const jobs = Array.from({ length: 60 }, (_, i) => ({ step: (i * 5) % 11, mb: [8, 24, 300][i % 3], slow: i % 4 === 0 }));
  const want = new Map<string, Uint8Array>();
  const BIG = 2048; // ~16 MiB: more than the socket buffers hold for a reader that stops
  await withServer(["--admin-token", BATCH_ADMIN, "--batch-pool-bytes", "0"], async (url, dir) => {
    await registerBatchDataset(url, dir);
    for (const j of [...jobs, { step: 1, mb: BIG }, { step: 2, mb: BIG }]) {
      const k = `${j.step}/${j.mb}`;
      if (want.has(k)) continue;
      const res = await fetch(`${url}${path(j.step, j.mb)}`);
      assert.equal(res.status, 200, `reference ${k}`);
      want.set(k, new Uint8Array(await res.arrayBuffer()));
    }
  });
  // A stalled reader of a big batch, with room in flight for one such batch only. denoBody sends
  // the pool's memory itself (a stream chunk), so the body must stay leased until the reader is
  // done: out of the pool (else the next batch of that size would be assembled into bytes the
  // reader has not received yet), and counted in flight (else Deno would hold it, or a copy of
  // it, outside the bound: the next big batch must wait instead of being assembled).
  // Its waiters are served in order; one whose client left is skipped.
  const bigBytes = BIG * 4097 * 2;
  await withServer(["--admin-token", BATCH_ADMIN, "--batch-pool-bytes", "64MiB", "--max-batch-bytes", "24MiB", "--batch-inflight-bytes", "24MiB"], async (url, dir) => {
    await registerBatchDataset(url, dir);
    const gauge = (name: string) => gaugeOf(url, name);
    const { port } = new URL(url);
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(port) });
    let read = false;
    try {
      await conn.write(new TextEncoder().encode(`GET ${path(1, BIG)} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
      // Waits on the server, not a fixed pause: on a loaded machine a cold 16 MiB batch can
      // take longer than any pause to be leased, assembled and answered.
      await waitUntil(async () => (await gauge("rackfeed_batch_inflight_bytes")) === bigBytes, "the server to lease the stalled batch's body");
      // A client that leaves while its batch waits for room: its batch is not assembled when its
      // turn comes (Deno aborts the request's signal), and the one behind it goes next.
      const leaver = await Deno.connect({ hostname: "127.0.0.1", port: Number(port) });
      await leaver.write(new TextEncoder().encode(`GET ${path(1, BIG)} HTTP/1.1\r\nHost: x\r\n\r\n`));
      await waitUntil(async () => (await gauge("rackfeed_batch_waiting")) === 1, "the leaver's batch to wait for room");
      leaver.close();
      const second = fetch(`${url}${path(2, BIG)}`);
      await waitUntil(async () => (await gauge("rackfeed_batch_waiting")) === 2, "the second big batch to wait for room");
      await new Promise((ok) => setTimeout(ok, 300)); // time to wrongly give the stalled body back
      assert.equal(await gauge("rackfeed_batch_body_pool_bytes"), 0, "the stalled response's body is in the pool");
      assert.equal(await gauge("rackfeed_batch_waiting"), 2, "the big batches did not wait for the stalled one");
      const raw = new Uint8Array(await new Response(conn.readable).arrayBuffer()); // closes conn
      read = true;
      let head = 0;
      while (!(raw[head] === 13 && raw[head + 1] === 10 && raw[head + 2] === 13 && raw[head + 3] === 10)) head++;
      const text = new TextDecoder().decode(raw.subarray(0, head));
      assert.match(text, /^HTTP\/1\.1 200/);
      assert.match(text, new RegExp(`content-length: ${bigBytes}`, "i"));
      assert.ok(Buffer.compare(raw.subarray(head + 4), want.get(`1/${BIG}`)!) === 0, "the stalled reader's batch was overwritten");
      const res2 = await second;
      assert.equal(res2.status, 200);
      assert.ok(Buffer.compare(new Uint8Array(await res2.arrayBuffer()), want.get(`2/${BIG}`)!) === 0, "the second big batch differs from the reference");
    } finally {
      // A failed check must not leave the stalled connection holding the server's shutdown.
      if (!read) {
        try {
          conn.close();
        } catch {
          // already closed by reading it to the end
        }
      }
    }
    await waitUntil(async () => (await gauge("rackfeed_batch_inflight_bytes")) === 0, "the body out of flight once read");
    // Not back in the pool: over HTTP/2, Deno may still send a body it reports complete.
    assert.equal(await gauge("rackfeed_batch_body_pool_bytes"), 0);
    assert.equal(await gauge("rackfeed_batch_abandoned_total"), 1, "the leaver's batch was assembled although its client had left");
  }, { whenDone: whenDoneDeno, clientGone: clientGoneDeno, wrapBody: denoBody });
  await withServer(["--admin-token", BATCH_ADMIN, "--batch-pool-bytes", "64MiB"], async (url, dir) => {
    await registerBatchDataset(url, dir);
    const read = async (j: (typeof jobs)[number]) => {
      const res = await fetch(`${url}${path(j.step, j.mb)}`);
      assert.equal(res.status, 200);
      const reader = res.body!.getReader();
      const parts: Uint8Array[] = [];
      for (;;) {
        const r = await reader.read();
        if (r.done) break;
        parts.push(r.value);
        if (j.slow) await new Promise((ok) => setTimeout(ok, 2));
      }
      return new Uint8Array(Buffer.concat(parts));
    };
    for (let round = 0; round < 2; round++) {
      const got = await Promise.all(jobs.map(read));
      for (const [i, j] of jobs.entries()) {
        const w = want.get(`${j.step}/${j.mb}`)!;
        assert.equal(got[i].length, w.length, `job ${i} length`);
        assert.ok(got[i].every((b, k) => b === w[k]), `round ${round} job ${i} (step ${j.step} × ${j.mb}${j.slow ? ", slow" : ""}) differs from the reference`);
      }
    }
    const metrics = await (await fetch(`${url}/metrics`)).text();
    const reused = Number(/rackfeed_batch_bodies_total\{source="pool"\} (\d+)/.exec(metrics)?.[1] ?? 0);
    assert.equal(reused, 0, `bodies reused: ${reused}`);
  }, { whenDone: whenDoneDeno, wrapBody: denoBody });
});

Deno.test("the SDK retries a refused connection for a dataset whose name holds \"cert\" (Deno's error names the URL)", async () => {
  const { RackfeedClient } = await import("../../../src/client/mod.ts");
  const probe = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const port = (probe.addr as Deno.NetAddr).port;
  probe.close(); // nothing listens there now: every attempt is refused
  const c = new RackfeedClient({ url: `http://127.0.0.1:${port}`, retries: 3, backoffMs: 1, maxBackoffMs: 5 });
  const err = await c.describe("concerts").then(() => undefined, (e) => e as Error & { code?: string });
  assert.equal(err?.code, "UNAVAILABLE");
  assert.equal(c.retried, 3);
});

Deno.test("bounds the cached blocks that stalled object readers hold; a reader past the bound waits for room, then gets every byte", async () => {
  const MiB = 2 ** 20;
  const SIZE = 24 * MiB; // more than loopback's socket buffers hold for a reader that stops
  const objects = [0, 1, 2].map((i) => {
    const b = pattern(SIZE);
    b[i] ^= 0xff; // three different objects
    return b;
  });
  await withServer(["--block-bytes", "1MiB", "--part-bytes", "1MiB", "--memory-bytes", "256MiB", "--object-inflight-bytes", "2MiB"], async (url, dir) => {
    for (let i = 0; i < objects.length; i++) await Deno.writeFile(`${dir}/origin/big${i}.bin`, objects[i]);
    const gauge = (name: string) => gaugeOf(url, name);
    const { port } = new URL(url);
    const stalled = await Promise.all([0, 1].map(async (i) => {
      const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(port) });
      await conn.write(new TextEncoder().encode(`GET /v1/objects/data/big${i}.bin HTTP/1.1\r\nHost: x\r\n\r\n`));
      return conn; // and reads nothing
    }));
    const open = new Set(stalled);
    try {
      await waitUntil(async () => (await gauge("rackfeed_object_inflight_bytes")) === 2 * MiB, "two stalled readers to hold a block each");
      const third = fetch(`${url}/v1/objects/data/big2.bin`);
      await waitUntil(async () => (await gauge("rackfeed_object_reads_waiting")) === 1, "the third reader to wait for room");
      stalled[0].close();
      open.delete(stalled[0]);
      const res = await third;
      assert.equal(res.status, 200);
      assert.ok(Buffer.compare(new Uint8Array(await res.arrayBuffer()), objects[2]) === 0, "the third object's bytes differ");
      assert.ok((await gauge("rackfeed_object_inflight_bytes")) <= 2 * MiB);
    } finally {
      for (const c of open) c.close();
    }
    await waitUntil(async () => (await gauge("rackfeed_object_inflight_bytes")) === 0, "every block given back once the readers are gone");
  }, { whenDone: whenDoneDeno, clientGone: clientGoneDeno, wrapBody: denoBody });
});

Deno.test("gives back the block of an object reader that stopped reading once the kernel drops its connection (Deno.serve times out none)", async () => {
  const MiB = 2 ** 20;
  const object = pattern(24 * MiB);
  await withServer(["--block-bytes", "1MiB", "--part-bytes", "1MiB", "--memory-bytes", "256MiB", "--object-inflight-bytes", "2MiB"], async (url, dir) => {
    await Deno.writeFile(`${dir}/origin/big.bin`, object);
    const gauge = (name: string) => gaugeOf(url, name);
    const conn = await Deno.connect({ hostname: "127.0.0.1", port: Number(new URL(url).port) });
    try {
      await conn.write(new TextEncoder().encode("GET /v1/objects/data/big.bin HTTP/1.1\r\nHost: x\r\n\r\n"));
      // Reads nothing and stays open: the server's bytes stay unacknowledged past the listener's idle time (1.5 s here).
      await waitUntil(async () => (await gauge("rackfeed_object_inflight_bytes")) === MiB, "the stalled reader to hold a block");
      await waitUntil(async () => (await gauge("rackfeed_object_inflight_bytes")) === 0, "its block given back, the client still connected", 20_000);
      const res = await fetch(`${url}/v1/objects/data/big.bin`);
      assert.ok(Buffer.compare(new Uint8Array(await res.arrayBuffer()), object) === 0, "the next reader's bytes differ");
    } finally {
      conn.close();
    }
  }, { whenDone: whenDoneDeno, clientGone: clientGoneDeno, wrapBody: denoBody }, undefined, { idleMs: 1500 });
});

Deno.test("bounds the cached blocks of HTTP/2 streams that stop reading, in one session", async () => {
  const http2 = await import("node:http2");
  const MiB = 2 ** 20;
  const SIZE = 24 * MiB;
  const objects = [0, 1, 2].map((i) => {
    const b = pattern(SIZE);
    b[i] ^= 0xff;
    return b;
  });
  await withServer(["--block-bytes", "1MiB", "--part-bytes", "1MiB", "--memory-bytes", "256MiB", "--object-inflight-bytes", "2MiB"], async (url, dir) => {
    for (let i = 0; i < objects.length; i++) await Deno.writeFile(`${dir}/origin/big${i}.bin`, objects[i]);
    const gauge = (name: string) => gaugeOf(url, name);
    const session = http2.connect(url);
    try {
      const stalled = [0, 1].map((i) => {
        const s = session.request({ ":path": `/v1/objects/data/big${i}.bin` });
        s.on("error", () => {});
        s.pause(); // reads nothing: the stream's window closes, and the server's writes wait
        return s;
      });
      await waitUntil(async () => (await gauge("rackfeed_object_inflight_bytes")) === 2 * MiB, "two stalled streams to hold a block each");
      const third = session.request({ ":path": "/v1/objects/data/big2.bin" });
      const chunks: Uint8Array[] = [];
      const done = new Promise<number>((resolve, reject) => {
        let status = 0;
        third.on("response", (h) => (status = Number(h[":status"])));
        third.on("data", (c: Uint8Array) => chunks.push(c));
        third.on("end", () => resolve(status));
        third.on("error", reject);
      });
      await waitUntil(async () => (await gauge("rackfeed_object_reads_waiting")) === 1, "the third stream to wait for room");
      stalled[0].close(http2.constants.NGHTTP2_CANCEL);
      assert.equal(await done, 200);
      assert.ok(Buffer.compare(Buffer.concat(chunks), objects[2]) === 0, "the third object's bytes differ");
      stalled[1].close(http2.constants.NGHTTP2_CANCEL);
    } finally {
      session.destroy();
    }
    await waitUntil(async () => (await gauge("rackfeed_object_inflight_bytes")) === 0, "every block given back once the streams are gone");
  }, { whenDone: whenDoneDeno, clientGone: clientGoneDeno, wrapBody: denoBody });
});

Deno.test("holds a batch back while HTTP/2 streams that do not read hold the bodies in flight (one session), and serves every one exact once they read", async () => {
  const http2 = await import("node:http2");
  const BIG = 2048; // ~16 MiB: more than a stream window and the socket buffers hold
  const bigBytes = BIG * 4097 * 2;
  const path = (step: number) => `/v1/datasets/p/batches/${step}?rank=0&world=1&micro_batch=${BIG}`;
  await withServer(["--admin-token", BATCH_ADMIN, "--max-batch-bytes", "17MiB", "--batch-inflight-bytes", "34MiB"], async (url, dir) => {
    await registerBatchDataset(url, dir);
    const want = new Map<number, Uint8Array>();
    for (const step of [1, 2, 3]) want.set(step, new Uint8Array(await (await fetch(`${url}${path(step)}`)).arrayBuffer()));
    const gauge = (name: string) => gaugeOf(url, name);
    const session = http2.connect(url, { settings: { initialWindowSize: 65_535 } });
    session.on("error", () => {});
    try {
      const streams = [1, 2, 3].map((step) => pausedStream(session, path(step)));
      await waitUntil(async () => (await gauge("rackfeed_batch_inflight_bytes")) === 2 * bigBytes, "two unread bodies in flight");
      await waitUntil(async () => (await gauge("rackfeed_batch_waiting")) === 1, "the third batch to wait for room");
      await new Promise((ok) => setTimeout(ok, 300));
      assert.equal(await gauge("rackfeed_batch_inflight_bytes"), 2 * bigBytes, "a third body was assembled past the bound");
      for (const s of streams) s.req.resume();
      const bodies = await Promise.all(streams.map((s) => s.body));
      for (const [i, step] of [1, 2, 3].entries()) assert.ok(Buffer.compare(bodies[i], want.get(step)!) === 0, `batch ${step} over h2 differs from its HTTP/1.1 body`);
    } finally {
      session.destroy();
    }
    await waitUntil(async () => (await gauge("rackfeed_batch_inflight_bytes")) === 0, "nothing in flight once read");
    assert.equal(await gauge("rackfeed_batch_refused_total"), 0);
  }, { whenDone: whenDoneDeno, clientGone: clientGoneDeno, wrapBody: denoBody });
});

Deno.test("sets TCP_NODELAY and TCP_USER_TIMEOUT on the connections Deno.serve accepts, over TLS too (small responses waited ~44 ms for a delayed ACK)", async () => {
  const { selfSignedCert } = await import("../../helpers/tls.ts");
  const { loadNativeTcp, TCP_NODELAY, TCP_USER_TIMEOUT } = await import("../../../src/runtime/native-tcp-deno.ts");
  const tcp = loadNativeTcp()!;
  const { IDLE_CONNECTION_MS } = await import("../../../src/runtime/listener.ts");
  let ca = "";
  const tls = (dir: string) => {
    const files = selfSignedCert(dir, "nodelay", { endEntity: true });
    ca = Deno.readTextFileSync(files.cert);
    return { cert: ca, key: Deno.readTextFileSync(files.key) };
  };
  const options = (fds: number[]) => fds.map((fd) => [tcp.option(fd, TCP_NODELAY), tcp.option(fd, TCP_USER_TIMEOUT)]);
  await withServer([], async (url) => {
    const port = Number(new URL(url).port);
    assert.deepEqual(options(await tcpSocketFds(port, "listen")), [[1, IDLE_CONNECTION_MS]]);
    // A keep-alive connection stays open after its responses: the server's end of it is checked.
    const client = Deno.createHttpClient({ caCerts: [ca], http2: false });
    try {
      for (let i = 0; i < 3; i++) {
        const res = await fetch(`${url}/v1/objects/data/shard.bin`, { client, headers: { range: "bytes=0-4095" } });
        assert.deepEqual(new Uint8Array(await res.arrayBuffer()), pattern(4096));
      }
      const accepted = await tcpSocketFds(port, "established");
      assert.ok(accepted.length >= 1, "the server's end of the connection found");
      assert.deepEqual(options(accepted), accepted.map(() => [1, IDLE_CONNECTION_MS]));
    } finally {
      client.close();
    }
  }, {}, tls);
});

Deno.test("drops a connection whose client stopped reading a response, and keeps one that reads slowly (Deno.serve times out neither)", async () => {
  const net = await import("node:net");
  const body = new Uint8Array(64 << 20); // far more than loopback's socket buffers
  let completed = 0;
  const listener = await listenDeno((_req, env) => {
    (env as { completed: Promise<void> }).completed.then(() => completed++, () => completed++);
    return new Response(oneChunkStream(body));
  }, { hostname: "127.0.0.1", port: 0 }, undefined, { idleMs: 1500 });
  const port = Number(new URL(listener.url).port);
  const open = (): Promise<import("node:net").Socket> =>
    new Promise((resolve, reject) => {
      const s = net.connect(port, "127.0.0.1", () => {
        s.write("GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
        resolve(s);
      });
      s.on("error", () => {});
      s.once("error", reject);
    });
  const stalled = await open();
  stalled.pause(); // reads nothing: its receive window closes, and the server's sent bytes stay unacknowledged
  const slow = await open();
  slow.pause();
  let slowBytes = 0;
  slow.on("data", (c: Uint8Array) => {
    slowBytes += c.length;
    slow.pause();
  });
  // Takes one chunk every 300 ms: slowly, but it acknowledges what it takes.
  const reader = setInterval(() => slow.resume(), 300);
  try {
    const t0 = performance.now();
    while (completed < 1 && performance.now() - t0 < 30_000) await new Promise((r) => setTimeout(r, 100));
    assert.equal(completed, 1, "the stalled reader's response is over (dropped by the kernel)");
    assert.equal((await tcpSocketFds(port, "established")).length, 1, "the slow reader's connection is kept");
    const before = slowBytes;
    await new Promise((r) => setTimeout(r, 1000));
    assert.ok(slowBytes > before, `the slow reader still reads (${before} then ${slowBytes} bytes)`);
  } finally {
    clearInterval(reader);
    stalled.destroy();
    slow.destroy();
    await listener.close();
  }
});

Deno.test("closes connections with nothing going on for the idle time: silent, trickling headers, idle after a response; keeps busy ones (Deno.serve closes none)", async () => {
  const net = await import("node:net");
  const listener = await listenDeno(async (req) => {
    if (new URL(req.url).pathname === "/slow") await new Promise((r) => setTimeout(r, 2500));
    return new Response("ok");
  }, { hostname: "127.0.0.1", port: 0 }, undefined, { idleMs: 1000 });
  const port = Number(new URL(listener.url).port);
  /** A client connection that records what it read and when the server closed it. */
  const connect = () =>
    new Promise<{ socket: import("node:net").Socket; read: () => string; closedAt: () => number | undefined }>((resolve, reject) => {
      let text = "";
      let closedAt: number | undefined;
      const socket = net.connect(port, "127.0.0.1", () => resolve({ socket, read: () => text, closedAt: () => closedAt }));
      socket.on("data", (c: Uint8Array) => (text += new TextDecoder().decode(c)));
      socket.on("end", () => (closedAt ??= performance.now()));
      socket.on("close", () => (closedAt ??= performance.now()));
      socket.on("error", () => {});
      socket.once("error", reject);
    });
  const get = (path: string) => `GET ${path} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n`;
  const t0 = performance.now();
  const silent = await connect();
  const idleAfter = await connect();
  idleAfter.socket.write(get("/"));
  const trickler = await connect();
  const trickle = setInterval(() => trickler.socket.write("G"), 200);
  const busy = await connect();
  const requests = setInterval(() => busy.socket.write(get("/")), 300);
  const slow = await connect();
  slow.socket.write(get("/slow"));
  try {
    const until = async (cond: () => boolean, what: string) => {
      while (!cond()) {
        if (performance.now() - t0 > 15_000) throw new Error(`Timed out waiting for ${what}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    await until(() => silent.closedAt() !== undefined, "the silent connection closed");
    await until(() => idleAfter.closedAt() !== undefined, "the connection idle after its response closed");
    await until(() => trickler.closedAt() !== undefined, "the connection trickling headers closed");
    assert.match(idleAfter.read(), /^HTTP\/1.1 200/);
    assert.ok(silent.closedAt()! - t0 >= 1000, `closed after the idle time, not before (${silent.closedAt()! - t0} ms)`);
    await until(() => /ok$/.test(slow.read()), "the slow answer");
    await new Promise((r) => setTimeout(r, 500));
    assert.equal(slow.closedAt(), undefined, "the connection the server was slow to answer stays open");
    assert.equal(busy.closedAt(), undefined, "the connection making requests stays open");
    assert.ok((busy.read().match(/HTTP\/1.1 200/g) ?? []).length >= 8, "every request on the busy connection answered");
  } finally {
    clearInterval(trickle);
    clearInterval(requests);
    for (const c of [silent, idleAfter, trickler, busy, slow]) c.socket.destroy();
    await listener.close();
  }
});

Deno.test("keeps a connection whose response is still being read though its window stays shut past the idle time (a reader draining what it holds)", async () => {
  const net = await import("node:net");
  const body = new Uint8Array(256 << 20);
  const listener = await listenDeno(() => new Response(oneChunkStream(body)), { hostname: "127.0.0.1", port: 0 }, undefined, { idleMs: 1500 });
  const port = Number(new URL(listener.url).port);
  let got = 0;
  let closed = false;
  const s = net.connect(port, "127.0.0.1", () => s.write("GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"));
  s.on("error", () => {});
  s.on("close", () => (closed = true));
  // Takes 16 MiB at full speed (the kernel's buffers grow), then one chunk every 250 ms.
  s.on("data", (c: Uint8Array) => {
    got += c.length;
    if (got > 16 << 20) s.pause();
  });
  const slow = setInterval(() => {
    if (got > 16 << 20) {
      s.resume();
      setTimeout(() => s.pause(), 1);
    }
  }, 250);
  try {
    const t0 = performance.now();
    while (got <= 16 << 20 && performance.now() - t0 < 10_000) await new Promise((r) => setTimeout(r, 20));
    const before = got;
    await new Promise((r) => setTimeout(r, 5000)); // over three idle times of slow reading
    assert.equal(closed, false, "the slow reader's connection is kept");
    assert.ok(got > before, `it still reads (${before} then ${got} bytes)`);
  } finally {
    clearInterval(slow);
    s.destroy();
    await listener.close();
  }
});

Deno.test("the idle sweep keeps a connection while its peer's request is handled or just answered, and cuts it once nothing has moved for the idle time", async () => {
  const { IdleConnectionSweeper } = await import("../../../src/runtime/tcp-listener-deno.ts");
  const net = await import("node:net");
  // A bare Deno.serve (no sweep of its own), swept by hand on a clock of the test's.
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, () => new Response("ok"));
  let now = 0;
  const sweeper = new IdleConnectionSweeper("127.0.0.1", server.addr.port, 1000, () => now);
  let closed = false;
  const s = await new Promise<import("node:net").Socket>((resolve) => {
    const c = net.connect(server.addr.port, "127.0.0.1", () => resolve(c));
  });
  s.on("error", () => {});
  s.on("data", () => {}); // reads the answer, so that the server's close reaches 'end'
  s.on("close", () => (closed = true));
  try {
    s.write("GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n");
    await new Promise((r) => setTimeout(r, 1200)); // its last byte sent over the idle time ago, in real time
    const peer = s.localPort!;
    sweeper.began(peer);
    assert.equal(sweeper.sweep(), 0); // first seen now
    now += 5000;
    assert.equal(sweeper.sweep(), 0, "being handled: kept");
    sweeper.answered(peer);
    assert.equal(sweeper.sweep(), 0, "just answered: kept");
    now += 5000;
    // Its handler answered long ago, and nothing sent or queued in the kernel for the idle time
    // (an HTTP/2 stream whose window its client keeps shut looks so too).
    assert.equal(sweeper.sweep(), 1, "nothing moved for the idle time: cut");
    const t0 = performance.now();
    while (!closed && performance.now() - t0 < 5000) await new Promise((r) => setTimeout(r, 20));
    assert.equal(closed, true, "the client sees its connection closed");
  } finally {
    s.destroy();
    await server.shutdown();
  }
});

Deno.test("the idle sweep leaves alone a socket of the process on the listener's port at another address", async () => {
  const net = await import("node:net");
  const listener = await listenDeno(() => new Response("ok"), { hostname: "127.0.0.1", port: 0 }, undefined, { idleMs: 1000 });
  const port = Number(new URL(listener.url).port);
  // Another server of this process, on 127.0.0.2 and the same port, slower to answer than the idle time.
  const other = Deno.serve({ hostname: "127.0.0.2", port, onListen: () => {} }, async () => {
    await new Promise((r) => setTimeout(r, 2500));
    return new Response("slow but whole");
  });
  let closedEarly = false;
  const silent = net.connect(port, "127.0.0.2");
  silent.on("error", () => {});
  silent.on("close", () => (closedEarly = true));
  try {
    const client = Deno.createHttpClient({});
    try {
      const res = await fetch(`http://127.0.0.2:${port}/`, { client });
      assert.equal(await res.text(), "slow but whole");
    } finally {
      client.close();
    }
    assert.equal(closedEarly, false, "a silent connection to the other server is not the listener's to close");
  } finally {
    silent.destroy();
    await other.shutdown();
    await listener.close();
  }
});

Deno.test("the idle sweep keeps a response the server sends slowly, each pause shorter than the idle time", async () => {
  const net = await import("node:net");
  const listener = await listenDeno(() =>
    new Response(new ReadableStream({
      async start(c) {
        for (let i = 0; i < 6; i++) {
          await new Promise((r) => setTimeout(r, 600)); // 3.6 s in all, each pause under the idle time
          c.enqueue(new TextEncoder().encode(`part${i};`));
        }
        c.close();
      },
    })), { hostname: "127.0.0.1", port: 0 }, undefined, { idleMs: 1000 });
  let text = "";
  let closed = false;
  const s = net.connect(Number(new URL(listener.url).port), "127.0.0.1", () => s.write("GET / HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n"));
  s.on("error", () => {});
  s.on("data", (c: Uint8Array) => (text += new TextDecoder().decode(c)));
  s.on("close", () => (closed = true));
  try {
    const t0 = performance.now();
    while (!text.includes("part5;") && !closed && performance.now() - t0 < 10_000) await new Promise((r) => setTimeout(r, 20));
    assert.match(text, /part0;[\s\S]*part5;/);
  } finally {
    s.destroy();
    await listener.close();
  }
});

Deno.test("closes an HTTP/2 session whose client keeps a stream's window shut (nothing queued in the kernel: flow control holds the bytes)", async () => {
  const http2 = await import("node:http2");
  const body = new Uint8Array(64 << 20);
  const listener = await listenDeno(() => new Response(oneChunkStream(body)), { hostname: "127.0.0.1", port: 0 }, undefined, { idleMs: 1000 });
  const session = http2.connect(listener.url);
  let closedAt: number | undefined;
  session.on("error", () => {});
  session.on("close", () => (closedAt ??= performance.now()));
  try {
    const stream = session.request({ ":path": "/" });
    stream.on("error", () => {});
    await new Promise<void>((resolve) => stream.once("data", () => resolve()));
    stream.pause(); // its window closes: the server holds the rest back
    const t0 = performance.now();
    while (closedAt === undefined && performance.now() - t0 < 15_000) await new Promise((r) => setTimeout(r, 50));
    assert.ok(closedAt !== undefined, "the session is closed");
  } finally {
    session.destroy();
    await listener.close();
  }
});
