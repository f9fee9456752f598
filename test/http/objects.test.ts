import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectSameBytes, makeWorkspace, patternBytes, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";

// Small blocks so that "spans three blocks" needs only a few KiB.
const BLOCK = 4096;
const SIZE = 3 * BLOCK + 1000; // four blocks, the last one short
const body = patternBytes(SIZE, 7);

let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await ws.put("shard.bin", body);
  await ws.put("empty.bin", new Uint8Array(0));
  await ws.put("dir/with space/ü.bin", "unicode key");
  rf = await startServer(ws, ["--block-bytes", String(BLOCK), "--part-bytes", "4096"]);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

async function get(range?: string, path = "shard.bin", init: RequestInit = {}): Promise<Response> {
  const headers = new Headers(init.headers);
  if (range !== undefined) headers.set("range", range);
  return await fetch(`${rf.url}/v1/objects/data/${path}`, { ...init, headers });
}

async function expectRange(range: string, start: number, endExclusive: number): Promise<void> {
  const res = await get(range);
  expect(res.status).toBe(206);
  expect(res.headers.get("content-range")).toBe(`bytes ${start}-${endExclusive - 1}/${SIZE}`);
  expect(res.headers.get("content-length")).toBe(String(endExclusive - start));
  expectSameBytes(new Uint8Array(await res.arrayBuffer()), body.subarray(start, endExclusive));
}

describe("GET /v1/objects ranges", () => {
  it("serves the whole object with 200, validators and accept-ranges", async () => {
    const res = await get();
    expect(res.status).toBe(200);
    expect(res.headers.get("accept-ranges")).toBe("bytes");
    expect(res.headers.get("etag")).toMatch(/^"[^"]+"$/);
    expect(Date.parse(res.headers.get("last-modified") ?? "")).not.toBeNaN();
    expectSameBytes(new Uint8Array(await res.arrayBuffer()), body);
  });

  it("serves the first byte", () => expectRange("bytes=0-0", 0, 1));
  it("serves the last byte", () => expectRange(`bytes=${SIZE - 1}-${SIZE - 1}`, SIZE - 1, SIZE));
  it("serves a suffix range", () => expectRange("bytes=-1500", SIZE - 1500, SIZE));
  it("serves a suffix longer than the object as the whole object", () => expectRange(`bytes=-${SIZE * 2}`, 0, SIZE));
  it("serves an open-ended range", () => expectRange(`bytes=${BLOCK + 3}-`, BLOCK + 3, SIZE));
  it("clamps a last position beyond the end", () => expectRange(`bytes=10-${SIZE * 5}`, 10, SIZE));
  it("serves a range that spans two blocks", () => expectRange(`bytes=${BLOCK - 10}-${BLOCK + 9}`, BLOCK - 10, BLOCK + 10));
  it("serves a range that spans three blocks", () => expectRange(`bytes=${BLOCK - 1}-${2 * BLOCK}`, BLOCK - 1, 2 * BLOCK + 1));
  it("serves a range that ends exactly on a block boundary", () => expectRange(`bytes=0-${BLOCK - 1}`, 0, BLOCK));

  it("answers 416 with content-range */size for a range that starts beyond the end", async () => {
    const res = await get(`bytes=${SIZE}-`);
    expect(res.status).toBe(416);
    expect(res.headers.get("content-range")).toBe(`bytes */${SIZE}`);
    expect((await res.json()).message).toMatch(String(SIZE));
  });

  it("ignores a malformed or multi-part range and sends the whole object", async () => {
    for (const r of ["bytes=5-2", "items=0-1", "bytes=0-1,4-5", "bytes=abc"]) {
      const res = await get(r);
      expect(res.status, r).toBe(200);
      expect((await res.arrayBuffer()).byteLength, r).toBe(SIZE);
    }
  });

  it("serves an empty object with 200 and no bytes, and 416 for any range of it", async () => {
    const full = await get(undefined, "empty.bin");
    expect(full.status).toBe(200);
    expect(full.headers.get("content-length")).toBe("0");
    expect((await full.arrayBuffer()).byteLength).toBe(0);
    const ranged = await get("bytes=0-0", "empty.bin");
    expect(ranged.status).toBe(416);
    expect(ranged.headers.get("content-range")).toBe("bytes */0");
  });

  it("answers HEAD with the headers of GET and no body", async () => {
    const res = await get("bytes=100-199", "shard.bin", { method: "HEAD" });
    expect(res.status).toBe(206);
    expect(res.headers.get("content-length")).toBe("100");
    expect(res.headers.get("content-range")).toBe(`bytes 100-199/${SIZE}`);
    expect((await res.arrayBuffer()).byteLength).toBe(0);
  });

  it("answers 304 to If-None-Match with the current ETag, and 200 to a stale one", async () => {
    const etag = (await get(undefined, "shard.bin", { method: "HEAD" })).headers.get("etag")!;
    const hit = await get(undefined, "shard.bin", { headers: { "if-none-match": etag } });
    expect(hit.status).toBe(304);
    expect(hit.headers.get("etag")).toBe(etag);
    const star = await get(undefined, "shard.bin", { headers: { "if-none-match": "*" } });
    expect(star.status).toBe(304);
    const miss = await get(undefined, "shard.bin", { headers: { "if-none-match": '"stale"' } });
    expect(miss.status).toBe(200);
    await miss.arrayBuffer();
  });

  it("sends the whole object when If-Range names another version", async () => {
    const res = await get("bytes=0-9", "shard.bin", { headers: { "if-range": '"other"' } });
    expect(res.status).toBe(200);
    expect((await res.arrayBuffer()).byteLength).toBe(SIZE);
  });

  it("decodes percent-encoded key segments", async () => {
    const res = await fetch(`${rf.url}/v1/objects/data/dir/with%20space/%C3%BC.bin`);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("unicode key");
  });

  it("answers 404 naming the key for a missing object and the origins for an unknown origin", async () => {
    const missing = await get(undefined, "nope.bin");
    expect(missing.status).toBe(404);
    expect((await missing.json()).message).toContain("nope.bin");
    const origin = await fetch(`${rf.url}/v1/objects/elsewhere/a`);
    expect(origin.status).toBe(404);
    expect((await origin.json()).message).toContain("data");
  });

  it("answers 405 with Allow for a method a path has no route for, and 404 for a path with none", async () => {
    const cases: [string, string, string][] = [
      ["PUT", "/v1/objects/data/shard.bin", "GET, HEAD"],
      ["DELETE", "/v1/objects/data/shard.bin", "GET, HEAD"],
      ["POST", "/healthz", "GET, HEAD"],
      ["DELETE", "/v1/datasets/web", "GET, HEAD, PUT"],
      ["PUT", "/v1/telemetry", "POST"],
    ];
    for (const [method, path, allow] of cases) {
      const res = await fetch(`${rf.url}${path}`, { method });
      expect(res.status, `${method} ${path}`).toBe(405);
      expect(res.headers.get("allow")).toBe(allow);
      const body = await res.json();
      expect(body.error).toBe("METHOD_NOT_ALLOWED");
      expect(body.message).toContain(`${method} is not allowed on ${path}`);
    }
    // Unchanged where nothing of the path is served, and for the methods that are.
    const none = await fetch(`${rf.url}/v1/nothing-here`, { method: "DELETE" });
    expect(none.status).toBe(404);
    expect((await none.json()).error).toBe("NOT_FOUND");
    expect((await fetch(`${rf.url}/healthz`, { method: "HEAD" })).status).toBe(200);
  });

  it("counts served bytes and per-tier hits in /metrics", async () => {
    const before = await rf.metric("rackfeed_served_bytes_total", { transport: "http1" });
    const hitsBefore = await rf.metric("rackfeed_cache_hits_total", { tier: "memory" });
    await (await get("bytes=0-99")).arrayBuffer();
    expect(await rf.metric("rackfeed_served_bytes_total", { transport: "http1" })).toBe(before + 100);
    expect(await rf.metric("rackfeed_cache_hits_total", { tier: "memory" })).toBeGreaterThan(hitsBefore);
  });
});

describe("health and read token", () => {
  it("answers /healthz", async () => {
    const res = await fetch(`${rf.url}/healthz`);
    expect(res.status).toBe(200);
  });

  it("refuses object reads without the read token when one is configured, and serves them with it", async () => {
    const guarded = await startServer(ws, ["--read-token", "s3cret-token"]);
    try {
      const no = await fetch(`${guarded.url}/v1/objects/data/shard.bin`);
      expect(no.status).toBe(401);
      const wrong = await fetch(`${guarded.url}/v1/objects/data/shard.bin`, { headers: { authorization: "Bearer nope" } });
      expect(wrong.status).toBe(401);
      const ok = await fetch(`${guarded.url}/v1/objects/data/shard.bin`, {
        headers: { authorization: "Bearer s3cret-token", range: "bytes=0-3" },
      });
      expect(ok.status).toBe(206);
      // The answer depends on the token: no cache may reuse it for another one.
      expect(ok.headers.get("vary")).toMatch(/\bAuthorization\b/i);
      expectSameBytes(new Uint8Array(await ok.arrayBuffer()), body.subarray(0, 4));
      expect((await fetch(`${guarded.url}/healthz`)).status).toBe(200);
    } finally {
      await guarded.close();
    }
  });
});
