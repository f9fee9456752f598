// The S3 origin against a real S3 server (Ceph RGW from test/setup/s3-server.ts): bytes through
// rackfeed equal the originals for many random ranges across block boundaries, objects that
// change never mix versions, listing pages through continuation tokens.

import type { S3Client } from "@aws-sdk/client-s3";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { OriginError } from "../../src/errors.ts";
import type { ObjectInfo } from "../../src/origin/origin.ts";
import { S3Origin, type S3OriginOptions } from "../../src/origin/s3-origin.ts";
import { startFaultProxy } from "../helpers/fault-proxy.ts";
import { expectSameBytes, makeWorkspace, patternBytes, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { put, s3Client, s3ConfigFile, s3Server, uniquePrefix } from "../helpers/s3.ts";
import type { S3TestServer } from "../setup/s3-server.ts";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";

// A full collection on demand, for the test that chunks are let go of.
setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

const BLOCK = 256 * 1024;
const PART = 64 * 1024;

let s3: S3TestServer;
let client: S3Client;
let ws: Workspace;
let rf: RunningServer;
let prefix: string;

/** Starts rackfeed with origin `s3` at bucket/prefix; `args` are more serve flags. */
async function startS3Server(args: string[] = [], endpoint?: string): Promise<RunningServer> {
  const cfg = join(ws.dir, `s3-${Math.random().toString(36).slice(2)}.json`);
  await writeFile(cfg, s3ConfigFile("s3", s3, prefix, endpoint));
  return await startServer(ws, ["--config", cfg, "--block-bytes", String(BLOCK), "--part-bytes", String(PART), ...args]);
}

async function getRange(url: string, key: string, start: number, end: number): Promise<{ status: number; bytes: Uint8Array; etag: string | null }> {
  const res = await fetch(`${url}/v1/objects/s3/${key}`, { headers: { range: `bytes=${start}-${end}` } });
  const bytes = new Uint8Array(await res.arrayBuffer());
  return { status: res.status, bytes, etag: res.headers.get("etag") };
}

// A server that cannot start fails every test here (never skips them), with the reason.
let setupError: unknown;
beforeAll(async () => {
  try {
    s3 = s3Server();
    client = s3Client(s3);
    prefix = uniquePrefix("objects");
    ws = await makeWorkspace();
    rf = await startS3Server(["--metadata-ttl", "0"]);
  } catch (e) {
    setupError = e;
  }
});

beforeEach(() => {
  if (setupError) throw setupError;
});

afterAll(async () => {
  await rf?.close();
  await ws?.remove();
  client?.destroy();
});

describe("S3 origin through rackfeed (real RGW)", () => {
  it("serves many random ranges, across block and part boundaries, byte-identical to the original", async () => {
    const size = 5 * BLOCK + 12_345;
    const data = patternBytes(size, 7);
    await put(client, s3.bucket, `${prefix}big.bin`, data);
    let seed = 99;
    const rnd = (n: number) => {
      seed = (seed * 1103515245 + 12345) % 2 ** 31;
      return seed % n;
    };
    const ranges: [number, number][] = [[0, size - 1], [BLOCK - 1, BLOCK], [size - 1, size - 1], [PART - 3, 3 * BLOCK + 7]];
    for (let i = 0; i < 60; i++) {
      const a = rnd(size);
      ranges.push([a, Math.min(size - 1, a + rnd(i % 3 === 0 ? 2 * BLOCK : 9000))]);
    }
    // In parallel: overlapping fills of the same blocks coalesce, and all must come out right.
    await Promise.all(ranges.map(async ([a, b]) => {
      const r = await getRange(rf.url, "big.bin", a, b);
      expect(r.status).toBe(206);
      expectSameBytes(r.bytes, data.subarray(a, b + 1), `bytes ${a}-${b}`);
    }));
    // The whole object, then again from the cache.
    const whole = await fetch(`${rf.url}/v1/objects/s3/big.bin`);
    expect(whole.status).toBe(200);
    expect(whole.headers.get("content-length")).toBe(String(size));
    expectSameBytes(new Uint8Array(await whole.arrayBuffer()), data, "whole object");
    expect(await rf.metric("rackfeed_origin_bytes_total", { origin: "s3" })).toBeGreaterThanOrEqual(size);
    expect(await rf.metric("rackfeed_cache_hits_total", { tier: "memory" })).toBeGreaterThan(0);
    expect(await rf.metric("rackfeed_origin_errors_total", { origin: "s3" })).toBe(0);
  });

  it("answers HEAD with the S3 ETag and size, 404 for a missing key, 416 beyond the end", async () => {
    const etag = await put(client, s3.bucket, `${prefix}small.txt`, "hello, rack");
    const head = await fetch(`${rf.url}/v1/objects/s3/small.txt`, { method: "HEAD" });
    expect(head.status).toBe(200);
    expect(head.headers.get("etag")).toBe(etag);
    expect(head.headers.get("content-length")).toBe("11");
    const missing = await fetch(`${rf.url}/v1/objects/s3/nope/missing.bin`);
    expect(missing.status).toBe(404);
    expect((await missing.json()).error).toBe("OBJECT_NOT_FOUND");
    const beyond = await fetch(`${rf.url}/v1/objects/s3/small.txt`, { headers: { range: "bytes=11-" } });
    expect(beyond.status).toBe(416);
    await beyond.body?.cancel();
    const empty = await put(client, s3.bucket, `${prefix}empty.bin`, new Uint8Array(0));
    const e = await fetch(`${rf.url}/v1/objects/s3/empty.bin`);
    expect([e.status, e.headers.get("etag"), (await e.arrayBuffer()).byteLength]).toEqual([200, empty, 0]);
  });

  it("serves the new version after an object changes, never a mix (new ETag, new blocks)", async () => {
    const size = 3 * BLOCK + 100;
    const v1 = patternBytes(size, 1);
    const v2 = patternBytes(size, 2);
    const e1 = await put(client, s3.bucket, `${prefix}changing.bin`, v1);
    const r1 = await getRange(rf.url, "changing.bin", 0, size - 1);
    expectSameBytes(r1.bytes, v1, "version 1");
    expect(r1.etag).toBe(e1);
    const e2 = await put(client, s3.bucket, `${prefix}changing.bin`, v2);
    expect(e2).not.toBe(e1);
    // Blocks of version 1 are in the cache; a read must not serve them for version 2.
    const r2 = await getRange(rf.url, "changing.bin", BLOCK - 10, 2 * BLOCK + 10);
    expect(r2.etag).toBe(e2);
    expectSameBytes(r2.bytes, v2.subarray(BLOCK - 10, 2 * BLOCK + 11), "version 2");
  });

  it("never mixes versions while the object is overwritten during reads (each answer is one version, a 503, or an aborted body)", async () => {
    const size = 4 * BLOCK;
    const versions = [patternBytes(size, 11), patternBytes(size, 12), patternBytes(size, 13)];
    const etags: string[] = [];
    for (const v of versions) etags.push(await put(client, s3.bucket, `${prefix}racing.bin`, v));
    await put(client, s3.bucket, `${prefix}racing.bin`, versions[0]);
    let writing = true;
    const writer = (async () => {
      for (let i = 1; writing; i++) {
        await put(client, s3.bucket, `${prefix}racing.bin`, versions[i % 3]);
        // Some reads fall between writes (206, one version), others across one (503 or one version).
        await new Promise((r) => setTimeout(r, 5 + (i % 4) * 20));
      }
    })();
    const statuses: Record<number, number> = {};
    try {
      for (let round = 0; round < 12; round++) {
        await Promise.all([0, 1, 2, 3].map(async (k) => {
          const a = (round * 7919 + k * 104_729) % (size - 2 * BLOCK);
          const b = a + BLOCK + 5000;
          // A change noticed after the first bytes went out can only abort the body (the status
          // is sent): the client sees a truncated, failed response — a refusal, never a mix.
          const r = await getRange(rf.url, "racing.bin", a, b).catch((e: Error) => ({ status: -1, error: e, etag: undefined, bytes: new Uint8Array(0) }));
          statuses[r.status] = (statuses[r.status] ?? 0) + 1;
          if (r.status === -1) return;
          if (r.status !== 206) {
            expect(r.status).toBe(503);
            return;
          }
          const which = etags.indexOf(r.etag!);
          expect(which, `ETag ${r.etag} is one of the uploaded versions`).toBeGreaterThanOrEqual(0);
          expectSameBytes(r.bytes, versions[which].subarray(a, b + 1), `bytes ${a}-${b} of version ${which}`);
        }));
      }
    } finally {
      writing = false;
      await writer;
    }
    expect(statuses[206] ?? 0, JSON.stringify(statuses)).toBeGreaterThan(0);
  });
});

/** An S3Origin on a stand-in S3 client, for what no real server does on cue (ignore aborts, fail with a given error). */
function originOn(client: unknown, over: Partial<S3OriginOptions> = {}): S3Origin {
  return new S3Origin({
    name: "t",
    bucket: "bucket",
    prefix: "",
    region: "us-east-1",
    client: client as S3Client,
    concurrency: 1,
    timeoutMs: 1000,
    retry: { retries: 0, baseMs: 1, capMs: 1 },
    hedgeFactor: 0,
    ...over,
  });
}

/** What a stat says of a stand-in object of `size` bytes. */
const infoOf = (size: number): ObjectInfo => ({ size, etag: '"e"', version: '"e"', lastModified: new Date(0) });

describe("S3Origin", () => {
  it("list() pages through continuation tokens, strips the origin prefix, stops at the limit", async () => {
    const p = uniquePrefix("list");
    const keys = Array.from({ length: 7 }, (_, i) => `shards/s-${String(i).padStart(2, "0")}.bin`);
    await Promise.all(keys.map((k, i) => put(client, s3.bucket, `${p}${k}`, new Uint8Array(i + 1))));
    await put(client, s3.bucket, `${p}other/x.bin`, "x");
    const origin = new S3Origin({
      name: "t",
      bucket: s3.bucket,
      prefix: p,
      endpoint: s3.endpoint,
      region: s3.region,
      concurrency: 2,
      timeoutMs: 5000,
      retry: { retries: 1, baseMs: 10, capMs: 50 },
      hedgeFactor: 0,
      listPageSize: 3,
    });
    try {
      const all = await origin.list("shards/", 100);
      expect(all).toEqual(keys.map((key, i) => ({ key, size: i + 1 })));
      expect((await origin.list("shards/", 5)).map((o) => o.key)).toEqual(keys.slice(0, 5));
      expect(await origin.list("nothing-here/", 10)).toEqual([]);
      expect((await origin.list("", 100)).length).toBe(8);
    } finally {
      await origin.close();
    }
  });

  // Deno's fetch, aborted while a body stalled, left the body's read pending for good: reads hung
  // past every timeout until the stall timeout stopped waiting on the client's cooperation.
  it("ends a read at its stall timeout even when the HTTP client ignores the abort of a stalled body", async () => {
    let cancelled = 0;
    let attempts = 0;
    // An S3 client whose GET answers headers, one chunk, then nothing, and whose body never
    // reacts to the request's abort signal: only a cancel of its reader ends it.
    const deaf = {
      send: () => {
        attempts++;
        let sent = false;
        return Promise.resolve({
          ContentRange: "bytes 0-99/100",
          ETag: '"e"',
          Body: new ReadableStream<Uint8Array>({
            pull: (ctl) => {
              if (!sent) {
                sent = true;
                ctl.enqueue(new Uint8Array(10));
                return;
              }
              return new Promise<void>(() => {});
            },
            cancel: () => void cancelled++,
          }),
        });
      },
      destroy: () => {},
    };
    const origin = originOn(deaf, { concurrency: 2, timeoutMs: 100, retry: { retries: 1, baseMs: 1, capMs: 1 } });
    const dest = new Uint8Array(100);
    const t0 = performance.now();
    const err = await origin.read("k", infoOf(100), 0, dest).catch((e) => e);
    expect(err).toBeInstanceOf(OriginError);
    expect((err as OriginError).code).toBe("ORIGIN_TIMEOUT");
    expect((err as Error).message).toMatch(/no answer within 100 ms \(2 attempts\)/);
    expect(performance.now() - t0).toBeLessThan(2000);
    expect(attempts).toBe(2);
    // Each abandoned body was cancelled, so its connection is not left open.
    expect(cancelled).toBe(2);
    await origin.close();
  });

  for (const http of ["node", "fetch"] as const) {
    it(`reuses the connection of a body read to its end, and cuts one abandoned mid-body (${http})`, async () => {
      const p = uniquePrefix("keepalive");
      const body = patternBytes(4 * 1024 * 1024, 9);
      await put(client, s3.bucket, `${p}obj.bin`, body);
      const proxy = await startFaultProxy(s3.endpoint);
      const origin = new S3Origin({
        name: "t",
        bucket: s3.bucket,
        prefix: p,
        endpoint: proxy.url,
        region: s3.region,
        http,
        concurrency: 1,
        timeoutMs: 5000,
        retry: { retries: 0, baseMs: 1, capMs: 1 },
        hedgeFactor: 0,
      });
      try {
        const info = await origin.stat("obj.bin");
        let afterTwo = 0;
        for (let i = 0; i < 5; i++) {
          const dest = new Uint8Array(100_000);
          await origin.read("obj.bin", info, i * 100_000, dest);
          expectSameBytes(dest, body.subarray(i * 100_000, (i + 1) * 100_000), `read ${i}`);
          if (i === 1) afterTwo = proxy.counts.connections;
        }
        // Reads 3 to 5 found a connection in the pool. (Node's fetch also closes the connection
        // of a HEAD, and may open a second one while the first goes back to its pool.)
        expect(proxy.counts.connections).toBe(afterTwo);
        if (http === "node") expect(proxy.counts.connections).toBe(1);
        // A 4 MiB answer whose size no longer matches is dropped after its headers: its connection
        // still carries the rest of the body, so node:http must close it, not hand it to the next
        // read. (Node's fetch decides for itself when to let such a connection go.)
        const open = proxy.counts.open;
        const err = await origin.read("obj.bin", { ...info, size: info.size + 1 }, 0, new Uint8Array(info.size)).catch((e) => e);
        expect((err as Error).message).toMatch(/changed/);
        if (http === "node") {
          for (let i = 0; i < 50 && proxy.counts.open >= open; i++) await new Promise((r) => setTimeout(r, 10));
          expect(proxy.counts.open).toBe(open - 1);
        }
        const dest = new Uint8Array(1000);
        await origin.read("obj.bin", info, 5000, dest);
        expectSameBytes(dest, body.subarray(5000, 6000), "read after the cut");
      } finally {
        await origin.close();
        await proxy.close();
      }
    });
  }

  it("lets go of each chunk once it is copied, while the read goes on", async () => {
    // Chunks are tracked by weak references: once copied into the block they must be collectable.
    // (Racing each read against one long-lived abort promise kept them all reachable until the end.)
    const chunks: WeakRef<Uint8Array>[] = [];
    let stalled: () => void = () => {};
    const atStall = new Promise<void>((r) => (stalled = r));
    const client = {
      send: () =>
        Promise.resolve({
          ContentRange: "bytes 0-4194303/4194304",
          ETag: '"e"',
          Body: new ReadableStream<Uint8Array>({
            pull: (ctl) => {
              if (chunks.length === 63) {
                stalled();
                return new Promise<void>(() => {});
              }
              const c = new Uint8Array(64 * 1024);
              chunks.push(new WeakRef(c));
              ctl.enqueue(c);
            },
          }, { highWaterMark: 0 }),
        }),
      destroy: () => {},
    };
    const origin = originOn(client, { timeoutMs: 60_000 });
    const ctl = new AbortController();
    const read = origin.read("k", infoOf(4 * 1024 * 1024), 0, new Uint8Array(4 * 1024 * 1024), ctl.signal).catch((e) => e);
    await atStall;
    await new Promise((r) => setTimeout(r, 50));
    gc();
    await new Promise((r) => setTimeout(r, 50));
    gc();
    const alive = chunks.filter((w) => w.deref() !== undefined).length;
    ctl.abort(new Error("test over"));
    expect((await read) as Error).toBeInstanceOf(Error);
    // The last chunk or two may still be referenced by the stream's own queue.
    expect(alive).toBeLessThanOrEqual(2);
    await origin.close();
  });

  it("tells a refused TLS certificate from a connection error whose URL merely holds the word", async () => {
    /** An S3Origin whose every request fails with `error`; returns the read's message and the attempts made. */
    const failWith = async (error: Error) => {
      let attempts = 0;
      const client = { send: () => (attempts++, Promise.reject(error)), destroy: () => {} };
      const origin = originOn(client, { retry: { retries: 1, baseMs: 1, capMs: 1 } });
      const err = (await origin.stat("k").catch((e) => e)) as Error;
      await origin.close();
      return { message: err.message, attempts };
    };
    // Deno's fetch names the URL in its message: a key under "certificates/" refused is retried.
    const refused = await failWith(new TypeError("fetch failed", {
      cause: new Error("error sending request for url (https://s3.local/bucket/certificates/a.bin): client error (Connect): tcp connect error: Connection refused (os error 111)"),
    }));
    expect(refused.attempts).toBe(2);
    expect(refused.message).toMatch(/Connection refused.*\(2 attempts\)$/);
    const unknownIssuer = await failWith(new TypeError("fetch failed", {
      cause: new Error("error sending request for url (https://s3.local/bucket/k): client error (Connect): invalid peer certificate: UnknownIssuer"),
    }));
    expect(unknownIssuer.attempts).toBe(1);
    expect(unknownIssuer.message).toMatch(/UnknownIssuer \(the endpoint's TLS certificate is refused: .*DENO_CERT/);
    const wrongName = await failWith(Object.assign(new Error("Hostname/IP does not match certificate's altnames"), { code: "ERR_TLS_CERT_ALTNAME_INVALID" }));
    expect(wrongName.attempts).toBe(1);
    expect(wrongName.message).toMatch(/does not name its host: check the endpoint, and use path-style addressing/);
    const expired = await failWith(Object.assign(new Error("certificate has expired"), { code: "CERT_HAS_EXPIRED" }));
    expect(expired.attempts).toBe(1);
    expect(expired.message).toMatch(/certificate is refused: expired/);
  });

  it("rejects an unknown http client", () => {
    expect(() => originOn(undefined, { http: "curl" as never })).toThrow(/http must be "node" or "fetch", received "curl"/);
  });
});
