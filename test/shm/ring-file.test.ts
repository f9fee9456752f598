import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { decodeRingHeader, ringLayout } from "../../src/shm/protocol.ts";
import { RingFile } from "../../src/shm/ring-file.ts";
import { connectUnix } from "../../src/client/node.ts";
import { encodeFrame, FrameDecoder, SHM_PROTOCOL_VERSION } from "../../src/shm/protocol.ts";
import { makeWorkspace, startServer } from "../helpers/rackfeed.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

let dir: string;
beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "rackfeed-ring-"));
});
afterAll(() => rmSync(dir, { recursive: true, force: true }));

describe("RingFile", () => {
  it("writes a large ring's pages without holding the event loop: timers run while it is allocated", async () => {
    const layout = ringLayout(4, 64 * 2 ** 20); // 256 MiB of pages
    let ticks = 0;
    const timer = setInterval(() => ticks++, 0);
    let ring: RingFile | undefined;
    try {
      ring = await RingFile.create(join(dir, "big.ring"), layout, undefined);
    } finally {
      clearInterval(timer);
    }
    try {
      expect(ticks).toBeGreaterThan(0); // a synchronous allocation lets no timer run until it is done
      expect(statSync(ring.path).size).toBe(layout.fileBytes);
      const header = readFileSync(ring.path).subarray(0, 4096);
      expect(decodeRingHeader(new Uint8Array(header))).toMatchObject({ slots: 4, slotBytes: layout.slotBytes });
    } finally {
      ring.close();
    }
    expect(existsSync(join(dir, "big.ring"))).toBe(false);
  });
});

describe("a ring being allocated when the server stops", () => {
  it("is stopped and its file removed before close() resolves: no half-written ring outlives the server", async () => {
    const ws = await makeWorkspace();
    try {
      await putSyntheticDataset(ws, "tok/d", 3000, 20, 300);
      const dataset = await datasetFlags(ws, "d", { sources: [{ prefix: "data/tok/d" }], seq_length: 64, seed: 9, split: "100,0,0", split_index: 0, num_samples: 5000 });
      const shmDir = join(ws.dir, "shm"); // on disk: a large allocation takes a while there
      const rf = await startServer(ws, [...dataset, "--shm-dir", shmDir, "--shm-bytes", "4GiB", "--max-batch-bytes", "256MiB"]);
      const s = await connectUnix(join(shmDir, `rackfeed-${new URL(rf.url).port}.sock`));
      try {
        const dec = new FrameDecoder();
        s.write(encodeFrame({ t: "hello", version: SHM_PROTOCOL_VERSION }));
        expect(dec.push((await s.read())!)[0].t).toBe("welcome");
        // 64 slots of 1000 × 65 tokens: a ring of ~8 MiB... × 64 = several hundred MiB to write.
        s.write(encodeFrame({ t: "open", dataset: "d", world: 1, rank: 0, microBatch: 1000, slots: 64, startStep: 0 }));
        const rings = () => readdirSync(shmDir).filter((n) => n.endsWith(".ring"));
        for (const until = Date.now() + 5000; rings().length === 0 && Date.now() < until;) await new Promise((r) => setTimeout(r, 2));
        expect(rings()).toHaveLength(1); // being written
        await rf.close();
        expect(rings()).toEqual([]);
      } finally {
        s.close();
      }
    } finally {
      await ws.remove();
    }
  });
});
