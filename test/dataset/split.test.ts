import { describe, expect, it } from "vitest";
import { DatasetConfigError, parseSplit, splitBookends, splitRange, type SplitIndex } from "../../src/dataset/mod.ts";
import { vectorJson } from "./vector-files.ts";

const primitives = vectorJson("primitives.json");

describe("splits", () => {
  it("splitRange() gives every range in primitives.json, null where megatron-core builds no split", () => {
    for (const c of primitives.split_ranges) {
      const got = [0, 1, 2].map((k) => {
        const r = splitRange(c.split, k as SplitIndex, c.sequences);
        return r === null ? null : [r.begin, r.end];
      });
      expect(got, `${c.split} over ${c.sequences}`).toEqual(c.ranges);
    }
  });

  it("parseSplit() accepts any separator, skips minus signs and pads to three numbers", () => {
    expect(parseSplit("98 2 0")).toEqual(parseSplit("98,2,0"));
    expect(parseSplit("98/2/0")).toEqual(parseSplit("98,2,0"));
    expect(parseSplit("-1,-1")).toEqual([0.5, 0.5, 0]);
    expect(parseSplit("99,1")).toEqual([0.99, 0.01, 0]);
    expect(parseSplit("969,30,1")).toEqual([0.969, 0.03, 0.001]);
  });

  it("splitBookends() adds the fractions left to right in doubles", () => {
    expect(splitBookends("80,15,5")).toEqual([0, 0.8, 0.9500000000000001, 1]);
  });

  it("parseSplit() refuses more than three numbers, non-numbers and all zeros with a DatasetConfigError on split", () => {
    for (const bad of ["1,2,3,4", "1.2.3,1", ".", "0,0,0", "none"]) {
      const err = (() => {
        try {
          parseSplit(bad);
        } catch (e) {
          return e;
        }
      })();
      expect(err, bad).toBeInstanceOf(DatasetConfigError);
      expect((err as DatasetConfigError).field).toBe("split");
      expect((err as Error).message).toMatch(/split/);
    }
  });
});
