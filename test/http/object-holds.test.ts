/**
 * Object readers that stop reading (Node server): each keeps the cached block it was being sent,
 * so the blocks they hold are bounded by --object-inflight-bytes, over HTTP/1.1 and over HTTP/2
 * streams of one session; a reader past the bound waits for room. (A block shared by readers
 * counts once: test/http/held-blocks.test.ts.)
 */
import * as http2 from "node:http2";
import { connect, type Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectSameBytes, makeWorkspace, patternBytes, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";

const MiB = 2 ** 20;
/** Objects larger than loopback's socket buffers hold for a reader that stops (~10 MiB). */
const SIZE = 24 * MiB;
const objects = [0, 1, 2, 3].map((i) => patternBytes(SIZE, 11 + i));

let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  for (let i = 0; i < objects.length; i++) await ws.put(`big${i}.bin`, objects[i]);
  // Two blocks of room: two stalled readers fill it.
  rf = await startServer(ws, ["--block-bytes", "1MiB", "--part-bytes", "1MiB", "--memory-bytes", "256MiB", "--object-inflight-bytes", "2MiB"]);
});
afterAll(async () => {
  await rf?.close();
  await ws?.remove();
});

/** A client that asks for an object over HTTP/1.1 and reads nothing of the answer. */
function stalledReader(path: string): Promise<Socket> {
  const { hostname, port } = new URL(rf.url);
  return new Promise((resolve, reject) => {
    const s = connect({ host: hostname, port: Number(port) }, () => {
      s.pause();
      s.write(`GET ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n`);
      resolve(s);
    });
    s.on("error", reject);
  });
}

const held = () => rf.metric("rackfeed_object_inflight_bytes");
const waiting = () => rf.metric("rackfeed_object_reads_waiting");

describe("object readers that stop reading", () => {
  it("hold at most --object-inflight-bytes of blocks; the next reader waits for room, then gets every byte", async () => {
    const a = await stalledReader("/v1/objects/data/big0.bin");
    const b = await stalledReader("/v1/objects/data/big1.bin");
    try {
      await waitFor(async () => (await held()) === 2 * MiB, "two stalled readers to hold a block each");
      expect(await rf.metric("rackfeed_object_inflight_blocks")).toBe(2);
      // A third reader of another object waits: the bound is full.
      const third = fetch(`${rf.url}/v1/objects/data/big2.bin`);
      await waitFor(async () => (await waiting()) === 1, "the third reader to wait for room");
      // One stalled reader leaves: its block goes back, and the third is answered in full.
      a.destroy();
      const res = await third;
      expect(res.status).toBe(200);
      expectSameBytes(new Uint8Array(await res.arrayBuffer()), objects[2]);
      expect(await held()).toBeLessThanOrEqual(2 * MiB);
    } finally {
      a.destroy();
      b.destroy();
    }
    await waitFor(async () => (await held()) === 0, "every block given back once the readers are gone");
  });

  it("gives back the block of a reader that left while it waited for room (its body is never read)", async () => {
    const a = await stalledReader("/v1/objects/data/big0.bin");
    const b = await stalledReader("/v1/objects/data/big1.bin");
    try {
      await waitFor(async () => (await held()) === 2 * MiB, "two stalled readers to hold a block each");
      const leaver = await stalledReader("/v1/objects/data/big2.bin");
      await waitFor(async () => (await waiting()) === 1, "the leaver to wait for room");
      leaver.destroy();
      await new Promise((r) => setTimeout(r, 100)); // the server sees it go
      a.destroy(); // room: the leaver's turn comes, and its response has nobody to go to
      await waitFor(async () => (await waiting()) === 0, "the leaver's turn");
      await waitFor(async () => (await held()) === MiB, "the leaver's block given back (b's alone held)");
    } finally {
      a.destroy();
      b.destroy();
    }
    await waitFor(async () => (await held()) === 0, "every block given back once the readers are gone");
  });

  it("bounds the blocks of HTTP/2 streams that stop reading, in one session", async () => {
    const session = http2.connect(rf.url);
    try {
      const stalled = [0, 1].map((i) => {
        const s = session.request({ ":path": `/v1/objects/data/big${i}.bin` });
        s.pause(); // reads nothing: the stream's flow-control window closes, and the server's write waits
        return s;
      });
      await waitFor(async () => (await held()) === 2 * MiB, "two stalled streams to hold a block each");
      const third = session.request({ ":path": "/v1/objects/data/big3.bin" });
      const chunks: Buffer[] = [];
      const done = new Promise<number>((resolve, reject) => {
        let status = 0;
        third.on("response", (h) => (status = Number(h[":status"])));
        third.on("data", (c: Buffer) => chunks.push(c));
        third.on("end", () => resolve(status));
        third.on("error", reject);
      });
      await waitFor(async () => (await waiting()) === 1, "the third stream to wait for room");
      stalled[0].close(http2.constants.NGHTTP2_CANCEL);
      expect(await done).toBe(200);
      expectSameBytes(new Uint8Array(Buffer.concat(chunks)), objects[3]);
      stalled[1].close(http2.constants.NGHTTP2_CANCEL);
    } finally {
      session.destroy();
    }
    await waitFor(async () => (await held()) === 0, "every block given back once the streams are gone");
  });
});

describe("a bound of one block", () => {
  it("serves blocks read back from the NVMe tier, a little larger than a block with their file header", async () => {
    const ws2 = await makeWorkspace();
    const body = patternBytes(64 * 65536, 5);
    await ws2.put("o.bin", body);
    // Memory for 16 of its 64 blocks: the others are evicted to the NVMe tier and read back from there.
    const rf2 = await startServer(ws2, ["--block-bytes", "64KiB", "--part-bytes", "64KiB", "--memory-bytes", "1MiB", "--object-inflight-bytes", "64KiB"]);
    try {
      const first = await fetch(`${rf2.url}/v1/objects/data/o.bin`);
      expectSameBytes(new Uint8Array(await first.arrayBuffer()), body);
      await waitFor(async () => (await rf2.metric("rackfeed_disk_writes_total", { result: "ok" })) >= 8, "blocks on the NVMe tier");
      const again = await fetch(`${rf2.url}/v1/objects/data/o.bin`);
      expect(again.status).toBe(200);
      expectSameBytes(new Uint8Array(await again.arrayBuffer()), body);
      expect(await rf2.metric("rackfeed_cache_hits_total", { tier: "disk" })).toBeGreaterThan(0);
      await waitFor(async () => (await rf2.metric("rackfeed_object_inflight_bytes")) === 0, "every block given back");
    } finally {
      await rf2.close();
      await ws2.remove();
    }
  });
});
