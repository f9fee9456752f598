import { describe, expect, it } from "vitest";
import { buildFromIndexFiles, parseDatasetConfig, shareArrays, tokenDatasetFromParts, tokenDatasetParts, unsharedBytes } from "../../src/dataset/mod.ts";
import { syntheticDataset } from "../helpers/token-data.ts";

describe("sharing a dataset's arrays", () => {
  it("copies every typed array into shared memory, the dataset unchanged", () => {
    const f = syntheticDataset(500, 20, 300, 4);
    const g = syntheticDataset(300, 10, 200, 5);
    const config = parseDatasetConfig({
      sources: [{ prefix: "a", weight: 0.5 }, { prefix: "b", weight: 0.5 }],
      seq_length: 32,
      seed: 2,
      split: "100,0,0",
      split_index: 0,
      num_samples: 3000,
    });
    const ds = buildFromIndexFiles({ config, idx: [f.idx, g.idx], paths: ["a.idx", "b.idx"], binSizes: [f.bin.length, g.bin.length] });
    const parts = tokenDatasetParts(ds);
    const before = unsharedBytes(parts);
    expect(before).toBeGreaterThan(0);
    const shared = shareArrays(parts);
    expect(unsharedBytes(shared)).toBe(0);
    expect(unsharedBytes(parts)).toBe(before); // the original is left as it was
    expect(shared.sources[1].gpt.documentIndex.buffer).toBeInstanceOf(SharedArrayBuffer);
    expect(shared.sources[1].gpt.documentIndex).not.toBe(parts.sources[1].gpt.documentIndex);
    const again = tokenDatasetFromParts(shared);
    expect(again.describe()).toEqual(ds.describe());
    const a = new Float64Array(3 * ds.maxPiecesPerSample);
    const b = new Float64Array(3 * ds.maxPiecesPerSample);
    for (let i = 0; i < ds.length; i += 7) {
      const n = ds.planSample(i, a);
      expect(again.planSample(i, b)).toBe(n);
      expect(b.subarray(0, 3 * n)).toEqual(a.subarray(0, 3 * n));
    }
    // Shared already: not copied again.
    expect(shareArrays(shared).sources[0].gpt.shuffleIndex).toBe(shared.sources[0].gpt.shuffleIndex);
  });
});
