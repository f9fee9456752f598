import { readdir, readFile, stat, utimes, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { BlockCache, KEYS_KEPT } from "../../src/cache/block-cache.ts";
import { MemoryTier } from "../../src/cache/memory-tier.ts";
import { OriginError } from "../../src/errors.ts";
import { FsOrigin } from "../../src/origin/fs-origin.ts";
import { OriginGateway } from "../../src/origin/origin-gateway.ts";
import type { ObjectInfo, Origin } from "../../src/origin/origin.ts";
import { expectSameBytes, makeWorkspace, patternBytes, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";

const KiB = 1024;

let ws: Workspace;
const running: RunningServer[] = [];

beforeEach(async () => {
  ws = await makeWorkspace();
});
afterEach(async () => {
  for (const s of running.splice(0)) await s.close();
  await ws.remove();
});

async function start(args: string[], makeOrigin?: (root: string) => Origin): Promise<RunningServer> {
  const s = await startServer(ws, args, makeOrigin ? { makeOrigin: () => makeOrigin(ws.origin) } : {});
  running.push(s);
  return s;
}

async function bytesOf(res: Response): Promise<Uint8Array> {
  expect(res.ok, `HTTP ${res.status}`).toBe(true);
  return new Uint8Array(await res.arrayBuffer());
}

/** A memory-only cache of 64 KiB blocks read in one part each. */
function memoryCache(readAheadBlocks: number, maxReadAheadBlocks?: number): BlockCache {
  return new BlockCache({
    memory: new MemoryTier({ maxBytes: 16 * 2 ** 20 }),
    blockBytes: 64 * KiB,
    partBytes: 64 * KiB,
    readAheadBlocks,
    maxReadAheadBlocks,
    now: () => performance.now(),
  });
}

/** An fs origin whose reads at or beyond `holdFromOffset` wait until `release()`. */
class GatedOrigin extends FsOrigin {
  reads = 0;
  #open: Promise<void>;
  release!: () => void;
  constructor(root: string, readonly holdFromOffset = 0) {
    super({ name: "data", root });
    this.#open = new Promise((r) => (this.release = r));
  }
  override async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    this.reads++;
    if (offset >= this.holdFromOffset) await this.#open;
    return await super.read(key, info, offset, dest);
  }
}

/** An fs origin that is down: every read fails after `delayMs`, counted. */
class DownOrigin extends FsOrigin {
  reads = 0;
  constructor(root: string, readonly delayMs: number) {
    super({ name: "data", root });
  }
  override async read(): Promise<void> {
    this.reads++;
    await new Promise((r) => setTimeout(r, this.delayMs));
    throw new OriginError("ORIGIN_UNAVAILABLE", "the origin is down");
  }
}

describe("failed fills", () => {
  it("cancels the other parts of a block whose first part failed: they leave the origin's queue unread", async () => {
    await ws.put("down.bin", patternBytes(64 * KiB, 13));
    const origin = new DownOrigin(ws.origin, 20);
    // One slot: the block's four parts run one at a time, so three wait in the queue.
    const gw = new OriginGateway(origin, { concurrency: 1, maxQueue: 100, metadataTtl: 0 });
    const cache = new BlockCache({ memory: new MemoryTier({ maxBytes: 2 ** 20 }), blockBytes: 64 * KiB, partBytes: 16 * KiB, readAheadBlocks: 0, now: () => performance.now() });
    const info = await gw.stat("down.bin");
    await expect(cache.block(gw, "down.bin", info, 0)).rejects.toMatchObject({ code: "ORIGIN_UNAVAILABLE" });
    await new Promise((r) => setTimeout(r, 300)); // the three queued parts would have read by now
    expect(origin.reads).toBe(1);
    expect(gw.stats()).toMatchObject({ active: 0, queued: 0, errors: 1 });
    await cache.close();
  });
});

/** An fs origin that records the order of its reads (`key@offset`); all wait until `release()`. */
class RecordingOrigin extends FsOrigin {
  readonly order: string[] = [];
  #open: Promise<void>;
  release!: () => void;
  constructor(root: string) {
    super({ name: "data", root });
    this.#open = new Promise((r) => (this.release = r));
  }
  override async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    this.order.push(`${key}@${offset / (64 * KiB)}`);
    await this.#open;
    return await super.read(key, info, offset, dest);
  }
}

describe("prefetch priority", () => {
  it("moves a prefetch fill's queued origin read to the foreground when a reader joins it, and leaves an unjoined one behind", async () => {
    const busyBytes = patternBytes(5 * 64 * KiB, 21);
    const joinedBytes = patternBytes(64 * KiB, 22);
    await ws.put("busy.bin", busyBytes);
    await ws.put("joined.bin", joinedBytes);
    await ws.put("alone.bin", patternBytes(64 * KiB, 23));
    const origin = new RecordingOrigin(ws.origin);
    // One slot (nothing kept for foreground work): the queue order is the read order.
    const gw = new OriginGateway(origin, { concurrency: 1, maxQueue: 100, metadataTtl: 0 });
    const cache = memoryCache(0);
    const busy = await gw.stat("busy.bin");
    const joined = await gw.stat("joined.bin");
    const alone = await gw.stat("alone.bin");
    const reads: Promise<unknown>[] = [cache.block(gw, "busy.bin", busy, 0)]; // takes the slot
    expect(gw.stats()).toMatchObject({ active: 1, queued: 0 });
    reads.push(cache.prefetch(gw, "joined.bin", joined, 0, { tier: "memory", background: true }));
    reads.push(cache.prefetch(gw, "alone.bin", alone, 0, { tier: "memory", background: true }));
    reads.push(cache.block(gw, "busy.bin", busy, 1), cache.block(gw, "busy.bin", busy, 2));
    const reader = cache.block(gw, "joined.bin", joined, 0); // joins the prefetch fill
    reads.push(cache.block(gw, "busy.bin", busy, 3), cache.block(gw, "busy.bin", busy, 4));
    expect(gw.stats()).toMatchObject({ active: 1, queued: 6 });
    expect(cache.stats().coalesced).toBe(1);
    origin.release();
    expectSameBytes(await reader, joinedBytes, "joined block");
    await Promise.all(reads);
    // The joined fill's read went to the back of the foreground queue at the moment the reader
    // came: after busy 1 and 2, before busy 3 and 4. The prefetch nobody waits for stays last.
    expect(origin.order).toEqual(["busy.bin@0", "busy.bin@1", "busy.bin@2", "joined.bin@0", "busy.bin@3", "busy.bin@4", "alone.bin@0"]);
    await cache.close();
  });

  it("moves a prefetch fill's queued read to the foreground when dataset read-ahead warms its block", async () => {
    await ws.put("busy.bin", patternBytes(3 * 64 * KiB, 31));
    await ws.put("warmed.bin", patternBytes(64 * KiB, 32));
    const origin = new RecordingOrigin(ws.origin);
    const gw = new OriginGateway(origin, { concurrency: 1, maxQueue: 100, metadataTtl: 0 });
    const cache = memoryCache(0);
    const busy = await gw.stat("busy.bin");
    const warmed = await gw.stat("warmed.bin");
    const reads: Promise<unknown>[] = [cache.block(gw, "busy.bin", busy, 0)]; // takes the slot
    reads.push(cache.prefetch(gw, "warmed.bin", warmed, 0, { tier: "memory", background: true }));
    reads.push(cache.block(gw, "busy.bin", busy, 1));
    expect(cache.warm(gw, "warmed.bin", warmed, 0)).toBe(false); // already being filled: no second fill
    reads.push(cache.block(gw, "busy.bin", busy, 2));
    origin.release();
    await Promise.all(reads);
    expect(origin.order).toEqual(["busy.bin@0", "busy.bin@1", "warmed.bin@0", "busy.bin@2"]);
    await cache.close();
  });
});

describe("single-flight fills", () => {
  it("serves 100 concurrent requests for one cold block with exactly one origin read", async () => {
    const body = patternBytes(64 * KiB, 3);
    await ws.put("one-block.bin", body);
    let origin!: GatedOrigin;
    const rf = await start(["--block-bytes", "64KiB", "--part-bytes", "64KiB", "--read-ahead-blocks", "0"], (root) => {
      origin = new GatedOrigin(root);
      return origin;
    });
    const all = Array.from({ length: 100 }, () => fetch(`${rf.url}/v1/objects/data/one-block.bin`).then(bytesOf));
    // Let every request reach the cache while the one fill is held at the origin.
    await waitFor(async () => (await rf.metric("rackfeed_cache_coalesced_total")) >= 99, "99 coalesced lookups", 5000);
    origin.release();
    for (const got of await Promise.all(all)) expectSameBytes(got, body);
    expect(origin.reads).toBe(1);
    expect(await rf.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" })).toBe(1);
    expect(await rf.metric("rackfeed_origin_bytes_total", { origin: "data" })).toBe(64 * KiB);
    expect(await rf.metric("rackfeed_cache_misses_total")).toBe(1);
    expect(await rf.metric("rackfeed_cache_coalesced_total")).toBe(99);
  });

  it("streams the first parts of a block to waiters before the rest of the block has arrived", async () => {
    const body = patternBytes(64 * KiB, 4);
    await ws.put("parts.bin", body);
    let origin!: GatedOrigin;
    const rf = await start(["--block-bytes", "64KiB", "--part-bytes", "16KiB", "--read-ahead-blocks", "0"], (root) => {
      origin = new GatedOrigin(root, 16 * KiB); // part 0 flows, parts 1..3 are held
      return origin;
    });
    const res = await fetch(`${rf.url}/v1/objects/data/parts.bin`);
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const first = await reader.read();
    expect(first.done).toBe(false);
    expect(first.value!.length).toBeGreaterThan(0);
    expectSameBytes(first.value!, body.subarray(0, first.value!.length));
    // The block is still being filled: the origin has not answered parts 1..3 yet.
    expect(await rf.metric("rackfeed_cache_misses_total")).toBe(1);
    expect(await rf.metric("rackfeed_origin_bytes_total", { origin: "data" })).toBe(16 * KiB);
    origin.release();
    const rest: Uint8Array[] = [first.value!];
    for (;;) {
      const r = await reader.read();
      if (r.done) break;
      rest.push(r.value);
    }
    expectSameBytes(Buffer.concat(rest), body);
  });
});

describe("the NVMe tier", () => {
  const args = ["--block-bytes", "64KiB", "--part-bytes", "64KiB"];

  it("keeps its warm cache across a restart: no origin reads afterwards", async () => {
    const body = patternBytes(5 * 64 * KiB + 123, 5);
    await ws.put("warm.bin", body);
    const a = await start(args);
    expectSameBytes(await bytesOf(await fetch(`${a.url}/v1/objects/data/warm.bin`)), body);
    expect(await a.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" })).toBe(6);
    await running.pop()!.close(); // flushes pending disk writes

    const b = await start(args);
    expect(await b.metric("rackfeed_cache_blocks", { tier: "disk" })).toBe(6);
    expectSameBytes(await bytesOf(await fetch(`${b.url}/v1/objects/data/warm.bin`)), body);
    expect(await b.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" })).toBe(0);
    expect(await b.metric("rackfeed_origin_bytes_total", { origin: "data" })).toBe(0);
    expect(await b.metric("rackfeed_cache_hits_total", { tier: "disk" })).toBe(6);
  });

  it("detects a corrupted block file, never serves it, and refetches the block from the origin", async () => {
    const body = patternBytes(3 * 64 * KiB, 6);
    await ws.put("c.bin", body);
    const a = await start(args);
    await bytesOf(await fetch(`${a.url}/v1/objects/data/c.bin`));
    await running.pop()!.close();

    const files = await blockFiles(ws.cache);
    expect(files.length).toBe(3);
    // Flip one payload byte near the end of one file (the header stays valid).
    const victim = files[1];
    const raw = await readFile(victim);
    raw[raw.length - 100] ^= 0xff;
    await writeFile(victim, raw);

    const b = await start(args);
    expectSameBytes(await bytesOf(await fetch(`${b.url}/v1/objects/data/c.bin`)), body);
    expect(await b.metric("rackfeed_cache_corrupt_blocks_total")).toBe(1);
    expect(await b.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" })).toBe(1);
    expect(await b.metric("rackfeed_cache_hits_total", { tier: "disk" })).toBe(2);
  });

  it("drops torn block files and stray temporary files at start-up", async () => {
    await ws.put("t.bin", patternBytes(64 * KiB, 8));
    const a = await start(args);
    await bytesOf(await fetch(`${a.url}/v1/objects/data/t.bin`));
    await running.pop()!.close();
    const [file] = await blockFiles(ws.cache);
    await writeFile(file, (await readFile(file)).subarray(0, 30)); // torn inside the header
    await writeFile(join(ws.cache, "tmp", "leftover.tmp"), "half a block");

    const b = await start(args);
    expect(await b.metric("rackfeed_cache_blocks", { tier: "disk" })).toBe(0);
    expect(await b.metric("rackfeed_cache_corrupt_blocks_total")).toBe(1);
    expect(await readdir(join(ws.cache, "tmp"))).toEqual([]);
    expectSameBytes(await bytesOf(await fetch(`${b.url}/v1/objects/data/t.bin`)), patternBytes(64 * KiB, 8));
  });

  it("drops block files of the older SHA-256 format at start-up and refetches their blocks", async () => {
    const body = patternBytes(2 * 64 * KiB, 9);
    await ws.put("old.bin", body);
    const a = await start(args);
    await bytesOf(await fetch(`${a.url}/v1/objects/data/old.bin`));
    await running.pop()!.close();
    const files = await blockFiles(ws.cache);
    expect(files.length).toBe(2);
    const raw = await readFile(files[0]);
    expect(new TextDecoder().decode(raw.subarray(0, 8))).toBe("RFBLK002");
    raw[7] = "1".charCodeAt(0); // format 1: the same file is no longer a block this version reads
    await writeFile(files[0], raw);

    const b = await start(args);
    expect(await b.metric("rackfeed_cache_blocks", { tier: "disk" })).toBe(1);
    expect(await b.metric("rackfeed_cache_corrupt_blocks_total")).toBe(1);
    expectSameBytes(await bytesOf(await fetch(`${b.url}/v1/objects/data/old.bin`)), body);
    expect(await b.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" })).toBe(1);
  });

  it("keeps both tiers within their byte budgets while serving more than fits", async () => {
    const objects = Array.from({ length: 6 }, (_, i) => patternBytes(512 * KiB, 10 + i)); // 3 MiB in all
    for (const [i, o] of objects.entries()) await ws.put(`e/${i}.bin`, o);
    const rf = await start([...args, "--memory-bytes", "1MiB", "--disk-bytes", "2MiB"]);
    for (let round = 0; round < 2; round++) {
      for (const [i, o] of objects.entries()) {
        expectSameBytes(await bytesOf(await fetch(`${rf.url}/v1/objects/data/e/${i}.bin`)), o);
        expect(await rf.metric("rackfeed_cache_bytes", { tier: "memory" })).toBeLessThanOrEqual(1024 * KiB);
        expect(await rf.metric("rackfeed_cache_bytes", { tier: "disk" })).toBeLessThanOrEqual(2048 * KiB);
      }
    }
    await rf.server.cache.close(); // let pending writes land before measuring the directory
    const onDisk = await Promise.all((await blockFiles(ws.cache)).map(async (f) => (await stat(f)).size));
    expect(onDisk.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(2048 * KiB);
    expect(await rf.metric("rackfeed_cache_evictions_total", { tier: "memory" })).toBeGreaterThan(0);
    expect(await rf.metric("rackfeed_cache_evictions_total", { tier: "disk" })).toBeGreaterThan(0);
  });
});

describe("block keys", () => {
  it("keeps each block's key for reuse, tells versions and objects apart, and starts over past its bound", async () => {
    await ws.put("k.bin", patternBytes(256 * KiB, 3));
    const gw = new OriginGateway(new FsOrigin({ name: "data", root: ws.origin }), { concurrency: 4, maxQueue: 100, metadataTtl: 0 });
    const cache = memoryCache(0);
    const info = await gw.stat("k.bin");
    const k = cache.keyOf(gw, "k.bin", info, 3);
    expect(k).toBe(`data\nk.bin\n${info.version}\n${64 * KiB}\n3`);
    expect(cache.stats().keysKept).toBe(1);
    expect(cache.keyOf(gw, "k.bin", info, 3)).toBe(k);
    expect(cache.stats().keysKept).toBe(1); // the kept key, not a new one
    const newer: ObjectInfo = { ...info, version: `${info.version}-2` };
    expect(cache.keyOf(gw, "k.bin", newer, 3)).not.toBe(k);
    // The same info object used for another key (never done by the server) still gets that key's block keys.
    expect(cache.keyOf(gw, "other.bin", info, 3)).toBe(`data\nother.bin\n${info.version}\n${64 * KiB}\n3`);
    expect(cache.stats().keysKept).toBe(3);
    // Lookups through kept keys find the blocks: a read fills block 1, then it is in memory.
    await cache.block(gw, "k.bin", info, 1);
    await waitFor(() => cache.inMemory(gw, "k.bin", info, 1), "block 1 in the memory tier");
    expect(cache.inMemory(gw, "k.bin", newer, 1)).toBe(false);
    // Keys of many blocks (a huge object) stay within the bound: they start over, and still find the block.
    for (let i = 0; i < KEYS_KEPT + 10; i++) cache.keyOf(gw, "k.bin", info, 1000 + i);
    expect(cache.stats().keysKept).toBeLessThanOrEqual(KEYS_KEPT);
    expect(cache.stats().keysKept).toBeLessThan(20);
    expect(cache.keyOf(gw, "k.bin", info, 1)).toBe(`data\nk.bin\n${info.version}\n${64 * KiB}\n1`);
    expect(cache.inMemory(gw, "k.bin", info, 1)).toBe(true);
  });
});

describe("versioning", () => {
  it("never serves a changed file mixed with blocks of its old version", async () => {
    const v1 = patternBytes(3 * 64 * KiB, 20);
    const v2 = patternBytes(3 * 64 * KiB, 21);
    await ws.put("v.bin", v1);
    const rf = await start(["--block-bytes", "64KiB", "--part-bytes", "64KiB", "--metadata-ttl", "0"]);
    // Cache only the first block of v1.
    const head = await fetch(`${rf.url}/v1/objects/data/v.bin`, { headers: { range: "bytes=0-99" } });
    expectSameBytes(await bytesOf(head), v1.subarray(0, 100));
    const etag1 = head.headers.get("etag");

    await ws.put("v.bin", v2); // same size, new content
    const later = new Date(Date.now() + 60_000);
    await utimes(join(ws.origin, "v.bin"), later, later); // a new mtime even on coarse clocks

    const res = await fetch(`${rf.url}/v1/objects/data/v.bin`);
    expect(res.headers.get("etag")).not.toBe(etag1);
    expectSameBytes(await bytesOf(res), v2);
  });

  it("fails a read rather than mixing versions when the file changes behind a cached stat", async () => {
    const v1 = patternBytes(3 * 64 * KiB, 30);
    const v2 = patternBytes(3 * 64 * KiB, 31);
    await ws.put("w.bin", v1);
    const rf = await start(["--block-bytes", "64KiB", "--part-bytes", "64KiB", "--metadata-ttl", "1h", "--read-ahead-blocks", "0"]);
    expectSameBytes(await bytesOf(await fetch(`${rf.url}/v1/objects/data/w.bin`, { headers: { range: "bytes=0-9" } })), 
      v1.subarray(0, 10),
    );
    await ws.put("w.bin", v2);
    const later = new Date(Date.now() + 60_000);
    await utimes(join(ws.origin, "w.bin"), later, later);

    // The stat is still trusted (1 h), block 0 is cached from v1, block 1 must come from the
    // origin: the origin sees the new version on the open file and refuses.
    const mixed = await fetch(`${rf.url}/v1/objects/data/w.bin`).then(
      async (r) => ({ status: r.status, body: new Uint8Array(await r.arrayBuffer()) }),
      (e: unknown) => ({ status: -1, body: new Uint8Array(0), error: e }),
    ).catch((e: unknown) => ({ status: -2, body: new Uint8Array(0), error: e }));
    if (mixed.status === 200) expectSameBytes(mixed.body, v1); // only ever a whole old version
    else expect(mixed.body.length).toBeLessThan(v1.length);
    expect(await rf.metric("rackfeed_cache_fill_errors_total")).toBeGreaterThanOrEqual(1);

    // The change invalidated the stat: the next request sees v2, whole.
    expectSameBytes(await bytesOf(await fetch(`${rf.url}/v1/objects/data/w.bin`)), v2);
  });
});

async function blockFiles(cacheDir: string): Promise<string[]> {
  const out: string[] = [];
  for (const sub of await readdir(join(cacheDir, "blocks"))) {
    for (const f of await readdir(join(cacheDir, "blocks", sub))) out.push(join(cacheDir, "blocks", sub, f));
  }
  return out.sort();
}

/** An fs origin whose every read takes `delayMs` (a distant origin), counting reads in flight. */
class DistantOrigin extends FsOrigin {
  inFlight = 0;
  maxInFlight = 0;
  constructor(root: string, readonly delayMs: number) {
    super({ name: "data", root });
  }
  override async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array): Promise<void> {
    this.maxInFlight = Math.max(this.maxInFlight, ++this.inFlight);
    try {
      await new Promise((r) => setTimeout(r, this.delayMs));
      return await super.read(key, info, offset, dest);
    } finally {
      this.inFlight--;
    }
  }
}

describe("adaptive stream read-ahead", () => {
  it("deepens read-ahead when the reader catches up with a slow origin, up to twice the origin concurrency, with correct bytes", async () => {
    const body = patternBytes(64 * 64 * KiB, 9); // 64 blocks of 64 KiB
    await ws.put("far.bin", body);
    let origin!: DistantOrigin;
    // One part per block, 8 origin slots: read-ahead may grow from 1 to 16 blocks.
    const rf = await start(["--block-bytes", "64KiB", "--part-bytes", "64KiB", "--read-ahead-blocks", "1", "--origin-concurrency", "8"], (root) => {
      origin = new DistantOrigin(root, 25);
      return origin;
    });
    expectSameBytes(await bytesOf(await fetch(`${rf.url}/v1/objects/data/far.bin`)), body);
    expect(await rf.metric("rackfeed_stream_readahead_stalls_total")).toBeGreaterThanOrEqual(3);
    // A fixed depth of 1 never has more than 2 reads in flight; the grown depth fills every slot.
    expect(origin.maxInFlight).toBe(8);
    expect(await rf.metric("rackfeed_origin_requests_total", { origin: "data", op: "read" })).toBe(64);
  });

  it("closes while a fill still waits on an origin that stopped answering, after its grace period", async () => {
    await ws.put("hung.bin", patternBytes(64 * KiB, 12));
    const origin = new GatedOrigin(ws.origin); // every read waits until release()
    const gw = new OriginGateway(origin, { concurrency: 8, maxQueue: 100, metadataTtl: 0 });
    const cache = memoryCache(0);
    const info = await gw.stat("hung.bin");
    const waiting = cache.block(gw, "hung.bin", info, 0);
    waiting.catch(() => {});
    await waitFor(() => origin.reads > 0, "the fill to reach the origin");
    expect(cache.stats().inFlight).toBe(1);
    await cache.close(50); // returns although the origin never answered
    origin.release();
    expectSameBytes(await waiting, patternBytes(64 * KiB, 12)); // the abandoned fill still completes for whoever waits
  });

  it("keeps the configured depth for a reader slower than the origin", async () => {
    const body = patternBytes(16 * 64 * KiB, 10);
    await ws.put("near.bin", body);
    const origin = new DistantOrigin(ws.origin, 2);
    const gw = new OriginGateway(origin, { concurrency: 8, maxQueue: 100, metadataTtl: 0 });
    const cache = memoryCache(2, 16);
    const info = await gw.stat("near.bin");
    const chunks: Uint8Array[] = [];
    for await (const chunk of cache.readRange(gw, "near.bin", info, 0, info.size)) {
      chunks.push(chunk.slice());
      // Consuming a block takes longer than fetching one: the reader goes on only once every
      // fill it started has landed (waiting on the fills, not on a timer, so a loaded machine
      // cannot make the origin look slower than the reader).
      await waitFor(() => cache.stats().inFlight === 0, "the read-ahead fills to land");
    }
    expectSameBytes(Buffer.concat(chunks), body);
    expect(cache.stats().streamStalls).toBe(0);
    expect(origin.maxInFlight).toBeLessThanOrEqual(3); // the block being read + the 2 ahead
    await cache.close();
  });
});
