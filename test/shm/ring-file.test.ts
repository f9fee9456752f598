import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { decodeRingHeader, ringLayout } from "../../src/shm/protocol.ts";
import { RingFile } from "../../src/shm/ring-file.ts";

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
