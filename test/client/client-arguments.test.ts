import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RackfeedClient, RackfeedError } from "../../src/client/mod.ts";
import { createClient } from "../../src/client/node.ts";
import { startFaultProxy } from "../helpers/fault-proxy.ts";
import { expectSameBytes, makeWorkspace, patternBytes, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { selfSignedCert } from "../helpers/tls.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 128, seed: 5, split: "100,0,0", split_index: 0, num_samples: 2000 };
const OBJ = patternBytes(100_000, 3);
let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 1500, 50, 600);
  await ws.put("obj.bin", OBJ);
  rf = await startServer(ws, [...(await datasetFlags(ws, "d", REG)), "--block-bytes", "16KiB"]);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

/** An HTTP server on 127.0.0.1:0 that answers every request 200 with `body`, whatever its Range (as a cache in front might). */
async function ignoringRange(body: Uint8Array): Promise<{ url: string; server: Server }> {
  const server = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length });
    res.end(body);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server };
}

describe("RackfeedClient arguments", () => {
  it("readObject() refuses negative, fractional and inverted ranges with a RangeError, and reads start === end as empty", async () => {
    const proxy = await startFaultProxy(rf.url);
    try {
      const c = new RackfeedClient({ url: proxy.url });
      for (const range of [{ start: -10 }, { start: 1.5, end: 9 }, { start: 0, end: 2.5 }, { start: 10, end: 5 }, { end: -1 }, { start: Number.NaN }]) {
        const err = await c.readObject("data", "obj.bin", range).then((b) => `${b.length} bytes`, (e) => e);
        expect(err, JSON.stringify(range)).toBeInstanceOf(RangeError);
      }
      expect(proxy.counts.requests).toBe(0); // refused before any request
      expect((await c.readObject("data", "obj.bin", { start: 5, end: 5 })).length).toBe(0);
      expect((await c.readObject("data", "obj.bin", { start: 0, end: 0 })).length).toBe(0);
      expectSameBytes(await c.readObject("data", "obj.bin", { start: 5, end: 10 }), OBJ.subarray(5, 10)); // a real range still reads
    } finally {
      await proxy.close();
    }
  });

  it("readObject() never returns a whole object for a ranged read, even from a server that ignores Range", async () => {
    const { url, server } = await ignoringRange(OBJ);
    try {
      const c = new RackfeedClient({ url });
      // From 0: the head of the whole answer is the range.
      expectSameBytes(await c.readObject("data", "obj.bin", { start: 0, end: 10 }), OBJ.subarray(0, 10), "bytes 0-9");
      // From elsewhere: an error, never bytes from the wrong offset.
      const err = await c.readObject("data", "obj.bin", { start: 5, end: 10 }).then((b) => `${b.length} bytes`, (e) => e);
      expect(err).toBeInstanceOf(RackfeedError);
      expect(err.code).toBe("BAD_RESPONSE");
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it("batches() refuses a bad prefetch, rank, world, microBatch or step range (NaN, Infinity, 0, prefetch over 64, start past end) with a RangeError at the call, before any request", async () => {
    const proxy = await startFaultProxy(rf.url);
    try {
      const c = new RackfeedClient({ url: proxy.url });
      const ok = { rank: 0, world: 1, microBatch: 4, endStep: 3 };
      const bad = [
        { prefetch: Number.NaN }, { prefetch: Infinity }, { prefetch: 0 }, { prefetch: 65 }, { prefetch: 1.5 }, { prefetch: -1 },
        { rank: Number.NaN }, { rank: -1 }, { rank: 1 }, { rank: 0.5 },
        { world: 0 }, { world: Number.NaN }, { world: Infinity },
        { microBatch: 0 }, { microBatch: Number.NaN }, { microBatch: Infinity },
        { startStep: 10, endStep: 5 }, { startStep: -1 }, { endStep: 2.5 },
      ];
      for (const b of bad) {
        // Thrown by the call itself, not by the first next(): a trainer sees it where it asked.
        expect(() => c.batches("d", { ...ok, ...b }), JSON.stringify(b, (_k, v) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v))).toThrow(RangeError);
      }
      expect(proxy.counts.requests).toBe(0);
      // The bounds themselves are fine.
      const steps: number[] = [];
      for await (const b of c.batches("d", { ...ok, prefetch: 64 })) steps.push(b.step);
      expect(steps).toEqual([0, 1, 2]);
    } finally {
      await proxy.close();
    }
  });

  it("batches() raises 416 for a startStep past the dataset's last step, without an endStep, as HTTP does for its batch (not an empty epoch)", async () => {
    const c = new RackfeedClient({ url: rf.url });
    const steps = Math.floor(2000 / 4);
    const err = await c.batches("d", { rank: 0, world: 1, microBatch: 4, startStep: steps + 1 }).next().then(() => "yielded", (e) => e);
    expect(err).toBeInstanceOf(RackfeedError);
    expect(err.status).toBe(416);
    expect(err.message).toMatch(new RegExp(`startStep ${steps + 1} is beyond dataset "d": it has ${steps} steps`));
    // At the end exactly: a finished epoch, nothing to read.
    const none: number[] = [];
    for await (const b of c.batches("d", { rank: 0, world: 1, microBatch: 4, startStep: steps })) none.push(b.step);
    expect(none).toEqual([]);
  });

  it("batches() raises 416 when the dataset has no full step for the world and micro-batch (a wrong setting, not an empty epoch)", async () => {
    const c = new RackfeedClient({ url: rf.url });
    // 2000 samples: world 3 × micro-batch 700 needs 2100 for one step.
    const err = await c.batches("d", { rank: 1, world: 3, microBatch: 700 }).next().then(() => "yielded", (e) => e);
    expect(err).toBeInstanceOf(RackfeedError);
    expect(err.status).toBe(416);
    expect(err.message).toMatch(/Dataset "d" has no full step for world=3, micro_batch=700: it has 2000 samples, fewer than world × micro_batch = 2100/);
  });

  it("refuses a token a header cannot carry in the constructor, and a port fetch blocks at once: neither is retried", async () => {
    for (const token of ["abc\ndef", "with space", "naïve-token"]) {
      expect(() => new RackfeedClient({ url: rf.url, token }), JSON.stringify(token)).toThrow(/Invalid token: expected visible ASCII characters only/);
    }
    // Port 1 is on the Fetch standard's list of blocked ports: every attempt would fail the same way.
    const c = new RackfeedClient({ url: "http://127.0.0.1:1", retryForMs: 60_000 });
    const t0 = performance.now();
    const err = await c.readObject("data", "obj.bin").then(() => "read", (e) => e);
    expect(err).toBeInstanceOf(RackfeedError);
    expect(err.code).toBe("FETCH_FAILED");
    expect(err.message).toMatch(/bad port/);
    expect(c.retried).toBe(0);
    expect(performance.now() - t0).toBeLessThan(5000);
  });

  it("refuses a url with a query or fragment, a socket-only client with shm off, and a backoff over its cap, in the constructor", () => {
    for (const url of [`${rf.url}/?x=1`, `${rf.url}/#frag`]) expect(() => new RackfeedClient({ url }), url).toThrow(/a query or fragment cannot be followed by a path/);
    expect(() => new RackfeedClient({ socket: "/tmp/none.sock", local: {} as never, shm: false })).toThrow(/needs a url, or a socket path with a local transport \(and shm not switched off\)/);
    expect(() => new RackfeedClient({ url: rf.url, backoffMs: 5000, maxBackoffMs: 10 })).toThrow(/Invalid backoffMs 5000: expected at most maxBackoffMs \(10\)/);
  });

  it("readObject() refuses a key with a . or .. segment, which a URL would fold into another object's", async () => {
    const c = new RackfeedClient({ url: rf.url });
    for (const key of ["tok/../tok/d.idx", "./obj.bin", "a/./b", ".."]) {
      const err = await c.readObject("data", key).then(() => "read", (e) => e);
      expect(err, key).toBeInstanceOf(RangeError);
      expect(String(err.message)).toMatch(/a "\." or "\.\." segment cannot travel in a URL/);
    }
    expect((await c.readObject("data", "obj.bin", { start: 0, end: 4 })).length).toBe(4); // dots inside a name are fine
  });

  it("fails at once with BAD_RESPONSE when the url answers 200 with something that is not rackfeed's (a wrong port, a proxy page)", async () => {
    const page = new TextEncoder().encode("<!doctype html><p>Grafana</p>");
    const { url, server } = await ignoringRange(page);
    try {
      const c = new RackfeedClient({ url, retryForMs: 60_000 });
      const described = await c.describe("d").then(() => "described", (e) => e);
      expect(described).toBeInstanceOf(RackfeedError);
      expect(described.code).toBe("BAD_RESPONSE");
      expect(described.message).toMatch(/is .* a rackfeed server\?/);
      const batch = await c.batch("d", 0, { rank: 0, world: 1, microBatch: 4 }).then(() => "batch", (e) => e);
      expect(batch).toBeInstanceOf(RackfeedError);
      expect(batch.code).toBe("BAD_RESPONSE");
      expect(c.retried).toBe(0);
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it("refuses a url without an http(s) scheme in the constructor", () => {
    for (const url of ["localhost:8080", "127.0.0.1:8080", "ftp://127.0.0.1:8080"]) {
      expect(() => new RackfeedClient({ url }), url).toThrow(RangeError);
    }
    expect(() => new RackfeedClient({ url: "http://localhost:8080" })).not.toThrow();
  });

  it("fails at once on an untrusted TLS certificate, without retries, naming the cause", async () => {
    const { key, cert } = selfSignedCert(ws.dir, "self");
    const tls = await startServer(ws, ["--tls-cert", cert, "--tls-key", key, "--cache-dir", join(ws.dir, "c-tls")]);
    try {
      for (const c of [createClient({ url: tls.url, shm: false }), new RackfeedClient({ url: tls.url })]) { // no `ca`
        const err = await c.readObject("data", "obj.bin").then((b) => `${b.length} bytes`, (e) => e);
        expect(err).toBeInstanceOf(RackfeedError);
        expect(err.message).toMatch(/SELF_SIGNED|CERT/);
        expect(c.retried).toBe(0);
      }
    } finally {
      await tls.close();
    }
  });
});
