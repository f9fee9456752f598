import { describe, expect, it } from "vitest";
import {
  blendSizes,
  buildBlendingIndices,
  buildExhaustiveBlendingIndices,
  buildTokenDataset,
  checkNoOversampling,
  DatasetConfigError,
  encodeIndex,
  normalize,
  parseDatasetConfig,
  parseIndex,
} from "../../src/dataset/mod.ts";
import { vectorJson } from "./vector-files.ts";

const primitives = vectorJson("primitives.json");

describe("blend sizes and indexes", () => {
  it("blendSizes() gives the targets, buffers and blend size in primitives.json", () => {
    for (const c of primitives.blend_sizes) {
      const s = blendSizes(c.weights, c.num_samples, c.surplus);
      expect(Array.from(s.targets), JSON.stringify(c)).toEqual(c.targets);
      expect(Array.from(s.buffers), JSON.stringify(c)).toEqual(c.buffers);
      expect(s.size).toBe(c.blend_size);
    }
  });

  it("blendSizes() rounds 600 × 1.005 and 1400 × 1.005 in doubles, as section 5.2 says", () => {
    expect(Array.from(blendSizes([0.3, 0.7], 2000, 0.005).buffers)).toEqual([603, 1407]);
    expect(blendSizes([1, 1, 1], 1000, 0.005).size).toBe(1002);
  });

  it("buildBlendingIndices() with twice-normalised weights gives the indexes in primitives.json", () => {
    for (const c of primitives.blending_indices) {
      const bi = buildBlendingIndices(normalize(normalize(c.weights)), c.size);
      expect(Array.from(bi.datasetIndex), JSON.stringify(c.weights)).toEqual(c.dataset_index);
      expect(Array.from(bi.datasetSampleIndex), JSON.stringify(c.weights)).toEqual(c.dataset_sample_index);
    }
  });

  it("buildBlendingIndices() gives the spec's 0.3 / 0.7 example and breaks ties toward the lowest source", () => {
    const bi = buildBlendingIndices([0.3, 0.7], 12);
    expect(Array.from(bi.datasetIndex)).toEqual([1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1]);
    expect(Array.from(bi.datasetSampleIndex)).toEqual([0, 0, 1, 2, 1, 3, 4, 2, 5, 6, 3, 7]);
    expect(Array.from(buildBlendingIndices([0.5, 0.5], 4).datasetIndex)).toEqual([0, 1, 0, 1]);
  });

  it("buildExhaustiveBlendingIndices() uses every sample of every source once", () => {
    const bi = buildExhaustiveBlendingIndices([1, 2]);
    expect(Array.from(bi.datasetIndex)).toEqual([1, 0, 1]);
    const big = buildExhaustiveBlendingIndices([5, 1, 7]);
    expect(Array.from(big.counts)).toEqual([5, 1, 7]);
    for (let k = 0; k < 3; k++) {
      const mine = Array.from(big.datasetSampleIndex).filter((_, s) => big.datasetIndex[s] === k);
      expect(mine).toEqual(Array.from({ length: mine.length }, (_, j) => j));
    }
    expect(() => buildExhaustiveBlendingIndices([3, 0])).toThrow(RangeError);
  });

  it("checkNoOversampling() names the source a blend takes too many samples from", () => {
    expect(() => checkNoOversampling([3, 4], [3, 4], ["a", "b"])).not.toThrow();
    expect(() => checkNoOversampling([3, 5], [3, 4], ["a", "b"])).toThrow(/takes 5 samples from "b" but its dataset has only 4/);
  });
});

describe("buildTokenDataset() blends", () => {
  // 29 tokens, seq_length 4: exactly 7 windows in one epoch.
  const small = parseIndex(encodeIndex({ dtypeCode: 8, lengths: [10, 9, 10] }), { path: "small.idx" });
  const body = {
    sources: [{ prefix: "s", weight: 1 }, { prefix: "s", weight: 6 }, { prefix: "s", weight: 2 }],
    seq_length: 4,
    seed: 3,
    split: "100,0,0",
    split_index: 0,
    num_samples: 10,
  };

  it("buildTokenDataset() refuses a blend that oversamples a source when the surplus is 0", () => {
    // Targets [2, 7, 3] but the greedy index picks source 1 eight times; its dataset has 7 windows.
    const config = parseDatasetConfig({ ...body, mid_level_dataset_surplus: 0 });
    let err: unknown;
    try {
      buildTokenDataset(config, [small, small, small]);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(DatasetConfigError);
    expect((err as DatasetConfigError).field).toBe("mid_level_dataset_surplus");
    expect((err as Error).message).toMatch(/takes 8 samples from "s" but its dataset has only 7/);
  });

  it("buildTokenDataset() builds the same blend with the default surplus, the source running 2 epochs", () => {
    const ds = buildTokenDataset(parseDatasetConfig(body), [small, small, small]);
    expect(Array.from(ds.blend!.counts)).toEqual([1, 8, 3]);
    expect(Array.from(ds.blend!.buffers)).toEqual([3, 8, 4]);
    expect(ds.sources[1].gpt.epochs).toBe(2);
    expect(ds.length).toBe(12);
  });

  it("buildTokenDataset() refuses a weighted blend of 2^32 samples or more as a registration error (400), not a crash", () => {
    let err: unknown;
    try {
      buildTokenDataset(parseDatasetConfig({ ...body, num_samples: 2 ** 32 }), [small, small, small]);
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(DatasetConfigError);
    expect((err as DatasetConfigError).field).toBe("num_samples");
    expect((err as Error).message).toMatch(/exceeds 2\^32-1/);
  });

  it("buildTokenDataset() treats one weighted source as a blend of one asking ceil(N × 1.005)", () => {
    const i32 = parseIndex(encodeIndex({ dtypeCode: 4, lengths: [100, 200, 300] }), { path: "w.idx" });
    const config = parseDatasetConfig({ ...body, sources: [{ prefix: "w", weight: 0.5 }], num_samples: 1000, seq_length: 2 });
    const ds = buildTokenDataset(config, [i32]);
    expect(ds.kind).toBe("blend");
    expect(ds.sources[0].numSamplesRequested).toBe(1005);
    expect(ds.length).toBe(1000);
    const plain = buildTokenDataset(parseDatasetConfig({ ...config, sources: [{ prefix: "w" }] }), [i32]);
    expect(plain.kind).toBe("single");
    expect(plain.sources[0].numSamplesRequested).toBe(1000);
  });
});
