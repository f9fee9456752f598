import { describe, expect, it } from "vitest";
import { floorDiv, normalize, pairwiseSum, roundHalfEven } from "../../src/dataset/mod.ts";
import { hexDouble, vectorJson } from "./vector-files.ts";

const primitives = vectorJson("primitives.json");

describe("numpy float arithmetic", () => {
  it("normalize() matches numpy bit for bit, once and twice, for every weight list in primitives.json", () => {
    for (const c of primitives.normalize) {
      const once = normalize(c.weights);
      expect(Array.from(once), JSON.stringify(c.weights)).toEqual(c.normalized_hex.map(hexDouble));
      expect(Array.from(normalize(once)), JSON.stringify(c.weights)).toEqual(c.twice_hex.map(hexDouble));
    }
  });

  it("normalize([0.1, 0.2, 0.3]) leaves the last weight below 0.5, as the spec says", () => {
    expect(pairwiseSum([0.1, 0.2, 0.3])).toBe(0.6000000000000001);
    expect(Array.from(normalize([0.1, 0.2, 0.3]))).toEqual([0.16666666666666666, 0.3333333333333333, 0.4999999999999999]);
  });

  it("pairwiseSum() equals numpy.sum for 300 values where a left-to-right sum differs", () => {
    const values = Array.from({ length: 300 }, (_, i) => i * 0.1 + 1 / (i + 1));
    let sequential = 0;
    for (const v of values) sequential += v;
    expect(sequential).toBe(hexDouble("0x1.18b485ca8f9a9p+12"));
    expect(pairwiseSum(values)).toBe(hexDouble("0x1.18b485ca8f9a6p+12"));
  });

  it("roundHalfEven() rounds like Python's round", () => {
    expect([0.5, 1.5, 2.5, 3.5, 49.5, 96.9, 97.49999999999999, 2.4999].map(roundHalfEven)).toEqual([0, 2, 2, 4, 50, 97, 97, 2]);
  });

  it("floorDiv() is exact where a double division rounds up", () => {
    const a = 2 ** 53 - 1;
    expect(floorDiv(a, 3)).toBe(3002399751580330);
    expect(floorDiv(94043, 128)).toBe(734);
    expect(floorDiv(9007199254740991, 9007199254740992 / 2)).toBe(1);
  });
});
