import { describe, expect, it } from "vitest";
import { evaluateRange } from "../../src/http/range.ts";

describe("Range header parsing", () => {
  it("reads single byte ranges with whitespace around each part, and ignores what is not one", () => {
    expect(evaluateRange(" Bytes = 2 - 5 ", 100)).toEqual({ start: 2, end: 6 });
    expect(evaluateRange("bytes=-10", 100)).toEqual({ start: 90, end: 100 });
    expect(evaluateRange("bytes=90-", 100)).toEqual({ start: 90, end: 100 });
    for (const h of ["bytes=0-1,4-5", "bytes=-5-", "items=0-1", "bytes=abc", "bytes=-", "bytes 0-1", "bytes=1e3-", "bytes=5-2"]) {
      expect(evaluateRange(h, 100), h).toBeUndefined();
    }
  });

  it("takes linear time on a header of 64 KiB of spaces (a backtracking pattern held the event loop for seconds)", () => {
    for (const h of [`bytes=${" ".repeat(65_536)}x`, `bytes=-${" ".repeat(65_536)}x`, `bytes=${" ".repeat(65_536)}-${" ".repeat(65_536)}x`]) {
      const t0 = performance.now();
      expect(evaluateRange(h, 100)).toBeUndefined();
      expect(performance.now() - t0).toBeLessThan(250);
    }
  });
});
