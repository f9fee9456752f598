import { describe, expect, it } from "vitest";
import { backoffDelay, worstCaseMs } from "../../src/origin/retry.ts";

describe("backoffDelay()", () => {
  it("stays within the doubling ceiling and the cap, with full jitter", () => {
    const policy = { retries: 8, baseMs: 50, capMs: 1000 };
    expect([0, 1, 2, 3, 4, 5].map((r) => backoffDelay(r, policy, () => 0.999999))).toEqual([49, 99, 199, 399, 799, 999]);
    expect(backoffDelay(3, policy, () => 0)).toBe(0);
    expect(worstCaseMs({ retries: 2, baseMs: 50, capMs: 1000 }, 100)).toBe(3 * 100 + 50 + 100);
  });
});
