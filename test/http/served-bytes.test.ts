import { describe, expect, it } from "vitest";
import { OriginError } from "../../src/errors.ts";
import { pullStream } from "../../src/http/served-bytes.ts";

describe("pullStream", () => {
  it("ends a body whose source fails with one line naming the bytes sent and why, not the cause's whole stack", async () => {
    async function* source() {
      yield new Uint8Array(1000);
      yield new Uint8Array(24);
      throw new OriginError("ORIGIN_TIMEOUT", 'Origin "s3" failed reading "a.bin" bytes 1024-2047: no answer within 200 ms (2 attempts)', {
        cause: Object.assign(new Error("socket hang up"), { $metadata: { attempts: 2 } }),
      });
    }
    let counted = 0;
    const reader = pullStream(source(), (n) => (counted += n)).getReader();
    let got = 0;
    let error: Error | undefined;
    try {
      for (;;) {
        const r = await reader.read();
        if (r.done) break;
        got += r.value.length;
      }
    } catch (e) {
      error = e as Error;
    }
    expect(got).toBe(1024);
    expect(counted).toBe(1024);
    expect(error?.message).toBe('rackfeed: response body cut after 1024 bytes: Origin "s3" failed reading "a.bin" bytes 1024-2047: no answer within 200 ms (2 attempts)');
    expect(error?.stack).not.toContain("\n");
    expect(error?.cause).toBeUndefined();
  });
});
