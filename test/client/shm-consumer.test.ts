import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import * as net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { localTransport } from "../../src/client/node.ts";
import { ShmError, shmBatches } from "../../src/client/shm-consumer.ts";
import { encodeFrame, encodeRingHeader, FrameDecoder, ringLayout, SHM_PROTOCOL_VERSION, type SlotHeader, slotHeaderOffset, writeSlotHeader } from "../../src/shm/protocol.ts";

const BATCH_BYTES = 4096;

let dir: string;
beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "rackfeed-stale-"));
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
});

/**
 * A stand-in shm server: greets, answers `open` with a ring of 4 slots whose slot 0 holds
 * `header` and bytes 7, 7, …, then announces step 0 in slot 0 (generation 1). `clientClosed`
 * turns true once the client has closed its end; `close()` cuts any connection left.
 */
async function standInServer(header: SlotHeader): Promise<{ socket: string; clientClosed: () => boolean; close: () => Promise<void> }> {
  const layout = ringLayout(4, BATCH_BYTES);
  const ring = new Uint8Array(layout.fileBytes);
  ring.set(encodeRingHeader(layout), 0);
  writeSlotHeader(new DataView(ring.buffer), slotHeaderOffset(0), header);
  ring.fill(7, layout.dataOffset, layout.dataOffset + BATCH_BYTES);
  const ringPath = join(dir, "ring");
  writeFileSync(ringPath, ring);
  const socket = join(dir, "sock");
  const accepted = new Set<net.Socket>();
  let clientClosed = false;
  const server = net.createServer((s) => {
    accepted.add(s);
    const dec = new FrameDecoder();
    s.on("error", () => {});
    s.on("end", () => (clientClosed = true));
    s.on("close", () => accepted.delete(s));
    s.on("data", (chunk) => {
      for (const m of dec.push(new Uint8Array(chunk))) {
        if (m.t === "hello") s.write(encodeFrame({ t: "welcome", version: SHM_PROTOCOL_VERSION, instance: "stand-in" }));
        if (m.t === "open") {
          s.write(encodeFrame({ t: "ring", path: ringPath, ...layout, dtype: "uint8", rows: 1, cols: BATCH_BYTES, endStep: 1 }));
          s.write(encodeFrame({ t: "batch", slot: 0, generation: 1, step: 0, length: BATCH_BYTES, firstSample: 0, cache: "hit" }));
        }
      }
    });
  });
  await new Promise<void>((r) => server.listen(socket, r));
  return {
    socket,
    clientClosed: () => clientClosed,
    close: () => {
      // server.close() waits for every connection: a client that kept its own would hang the test.
      for (const s of accepted) s.destroy();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
}

/** The first batch a consumer of the stand-in reads, or the error it fails with. */
async function firstBatch(socket: string): Promise<Uint8Array | unknown> {
  try {
    for await (const b of shmBatches(localTransport(), socket, undefined, undefined, { dataset: "d", rank: 0, world: 1, microBatch: 1, startStep: 0, slots: 4, timeoutMs: 5000 })) {
      return b.bytes.slice();
    }
    return new Error("no batch");
  } catch (e) {
    return e;
  }
}

describe("shm consumer: slot headers", () => {
  it("reads a slot whose header carries the announced generation and step (the stand-in itself works)", async () => {
    const srv = await standInServer({ generation: 1, length: BATCH_BYTES, step: 0, firstSample: 0, cache: "hit" });
    try {
      const got = await firstBatch(srv.socket);
      expect(got).toBeInstanceOf(Uint8Array);
      expect(got).toEqual(new Uint8Array(BATCH_BYTES).fill(7));
    } finally {
      await srv.close();
    }
  });

  it("never reads a stale slot as new: a header of another generation than the notice fails with STALE_SLOT, and the consumer closes its connection", async () => {
    // Zeroed (a kept ring handed to a new consumer before the server wrote this slot), or as an
    // earlier consumer of the ring left it a round later (step 4, generation 5).
    for (const [generation, step] of [[0, 0], [5, 4]]) {
      const srv = await standInServer({ generation, length: BATCH_BYTES, step, firstSample: step, cache: "hit" });
      try {
        const err = await firstBatch(srv.socket);
        expect(err).toBeInstanceOf(ShmError);
        expect((err as ShmError).code).toBe("STALE_SLOT");
        expect((err as ShmError).message).toContain(`Slot 0 holds generation ${generation} (step ${step}), expected 1 (step 0)`);
        const until = Date.now() + 5000;
        while (!srv.clientClosed() && Date.now() < until) await new Promise((r) => setTimeout(r, 10));
        expect(srv.clientClosed(), "the consumer closed its control connection").toBe(true);
      } finally {
        await srv.close();
      }
      rmSync(join(dir, "sock"), { force: true });
    }
  });

  it("refuses a torn header: the right generation with another step, or a length past the slot", async () => {
    for (const header of [
      { generation: 1, length: BATCH_BYTES, step: 9, firstSample: 0, cache: "hit" as const },
      { generation: 1, length: 1 << 20, step: 0, firstSample: 0, cache: "hit" as const },
    ]) {
      const srv = await standInServer(header);
      try {
        const err = await firstBatch(srv.socket);
        expect(err, JSON.stringify(header)).toBeInstanceOf(ShmError);
        expect((err as ShmError).code).toBe("STALE_SLOT");
      } finally {
        await srv.close();
      }
      rmSync(join(dir, "sock"), { force: true });
    }
  });
});
