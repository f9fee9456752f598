import { describe, expect, it } from "vitest";
import { isCacheServerError } from "../../src/errors.ts";
import {
  buildTokenDataset,
  DatasetConfigError,
  encodeIndex,
  parseDatasetConfig,
  parseIndex,
} from "../../src/dataset/mod.ts";
import { vectorBytes } from "./vector-files.ts";

const base = {
  sources: [{ prefix: "data/pub_i32_b" }],
  seq_length: 128,
  seed: 42,
  split: "969,30,1",
  split_index: 0,
  num_samples: 450,
};

function configError(fn: () => unknown): DatasetConfigError {
  try {
    fn();
  } catch (e) {
    if (e instanceof DatasetConfigError) return e;
    throw e;
  }
  throw new Error("expected a DatasetConfigError, nothing was thrown");
}

function expectFieldError(body: unknown, field: string, pattern?: RegExp): void {
  const err = configError(() => parseDatasetConfig(body));
  expect(err.field, JSON.stringify(body)).toBe(field);
  expect(err.message.startsWith(`Invalid dataset config: ${field}: `), err.message).toBe(true);
  if (pattern) expect(err.message).toMatch(pattern);
  expect(isCacheServerError(err) && err.code).toBe("BAD_REQUEST");
}

describe("parseDatasetConfig()", () => {
  it("parseDatasetConfig() fills Megatron's defaults", () => {
    const c = parseDatasetConfig(base);
    expect(c.mid_level_dataset_surplus).toBe(0.005);
    expect(c.add_extra_token_to_sequence).toBe(true);
    expect(c.drop_last_partial_validation_sequence).toBe(true);
    expect(c.sources).toEqual([{ prefix: "data/pub_i32_b" }]);
    expect(Object.isFrozen(c)).toBe(true);
  });

  it("parseDatasetConfig() refuses seq_length below 2 or not an integer", () => {
    expectFieldError({ ...base, seq_length: 1 }, "seq_length", /integer in 2 … /);
    expectFieldError({ ...base, seq_length: "128" }, "seq_length", /received "128"/);
    expectFieldError({ ...base, seq_length: 64.5 }, "seq_length");
  });

  it("parseDatasetConfig() refuses weights <= 0 or not finite, naming the source", () => {
    const two = (w: unknown) => ({ ...base, sources: [{ prefix: "a", weight: 1 }, { prefix: "b", weight: w }] });
    expectFieldError(two(0), "sources[1].weight", /> 0, received 0/);
    expectFieldError(two(-0.5), "sources[1].weight");
    expectFieldError(two(Number.NaN), "sources[1].weight");
    expectFieldError(two("1"), "sources[1].weight");
  });

  it("parseDatasetConfig() refuses weights whose sum overflows or whose share of it underflows to 0 (the blend would be empty, or drop a source)", () => {
    const two = (a: number, b: number) => ({ ...base, sources: [{ prefix: "a", weight: a }, { prefix: "b", weight: b }] });
    expectFieldError(two(1e308, 1e308), "sources[0].weight", /finite sum/);
    expectFieldError(two(1e300, 1e-300), "sources[1].weight", /share above 0/);
    expect(parseDatasetConfig(two(3, 1e-10)).sources.map((s) => s.weight)).toEqual([3, 1e-10]); // small, but a share
  });

  it("parseDatasetConfig() refuses several sources without weights, and a mix of weighted and unweighted", () => {
    expectFieldError({ ...base, sources: [{ prefix: "a" }, { prefix: "b" }] }, "sources", /without weights/);
    expectFieldError({ ...base, sources: [{ prefix: "a", weight: 1 }, { prefix: "b" }] }, "sources[1].weight", /every source needs one/);
    expectFieldError({ ...base, sources: [] }, "sources");
    expectFieldError({ ...base, sources: [{ prefix: "" }] }, "sources[0].prefix");
    expectFieldError({ ...base, sources: [{ prefix: "a", wieght: 1 }] }, "sources[0].wieght", /unknown field/);
  });

  it("parseDatasetConfig() refuses bad split strings and a split of weight 0", () => {
    expectFieldError({ ...base, split: "1,2,3,4" }, "split", /at most three/);
    expectFieldError({ ...base, split: "0,0,0" }, "split");
    expectFieldError({ ...base, split: "1.2.3" }, "split");
    expectFieldError({ ...base, split: 99 }, "split");
    expectFieldError({ ...base, split: "100,0,0", split_index: 1 }, "split_index", /weight 0/);
    expectFieldError({ ...base, split: "1,1", split_index: 2 }, "split_index", /test/);
    expectFieldError({ ...base, split_index: 3 }, "split_index");
  });

  it("parseDatasetConfig() refuses seeds outside 0 … 2^32-1, num_samples < 1 and unknown fields", () => {
    expectFieldError({ ...base, seed: -1 }, "seed");
    expectFieldError({ ...base, seed: 2 ** 32 }, "seed");
    expectFieldError({ ...base, num_samples: 0 }, "num_samples");
    expectFieldError({ ...base, num_samples: undefined }, "num_samples");
    expectFieldError({ ...base, seq_len: 128 }, "seq_len", /unknown field/);
    expectFieldError({ ...base, mid_level_dataset_surplus: -0.1 }, "mid_level_dataset_surplus");
    expectFieldError({ ...base, add_extra_token_to_sequence: 1 }, "add_extra_token_to_sequence");
    expectFieldError(null, "(body)");
  });

  it("parseDatasetConfig() refuses a mid_level_dataset_surplus outside 0 … 1 naming it, not num_samples (1e308 overflowed the sample counts)", () => {
    const blend = { ...base, sources: [{ prefix: "a", weight: 0.3 }, { prefix: "b", weight: 0.7 }], num_samples: 12000 };
    expectFieldError({ ...blend, mid_level_dataset_surplus: 1e308 }, "mid_level_dataset_surplus", /fraction in 0 … 1 .*received 1e\+308/);
    expectFieldError({ ...blend, mid_level_dataset_surplus: 1.5 }, "mid_level_dataset_surplus", /received 1\.5/);
    expectFieldError({ ...blend, mid_level_dataset_surplus: -0.005 }, "mid_level_dataset_surplus", /received -0\.005/);
    expectFieldError({ ...blend, mid_level_dataset_surplus: "0.005" }, "mid_level_dataset_surplus");
    expect(parseDatasetConfig({ ...blend, mid_level_dataset_surplus: 0 }).mid_level_dataset_surplus).toBe(0);
    expect(parseDatasetConfig({ ...blend, mid_level_dataset_surplus: 1 }).mid_level_dataset_surplus).toBe(1);
  });

  it("parseDatasetConfig() refuses a blend whose num_samples × (1 + surplus) is no safe integer, naming the fields", () => {
    const blend = { ...base, sources: [{ prefix: "a", weight: 1 }], num_samples: 2 ** 53 - 2 };
    expectFieldError({ ...blend, mid_level_dataset_surplus: 0.5 }, "mid_level_dataset_surplus", /num_samples 9007199254740990 × \(1 \+ mid_level_dataset_surplus 0\.5\)/);
    expectFieldError(blend, "num_samples", /mid_level_dataset_surplus 0\.005/);
    // A plain source builds no surplus: the same num_samples is no concern of the surplus.
    expect(parseDatasetConfig({ ...base, num_samples: 2 ** 53 - 2 }).num_samples).toBe(2 ** 53 - 2);
  });

  it("parseDatasetConfig() refuses keep-partial windows on the valid split, which need pad id -1", () => {
    expectFieldError(
      { ...base, split_index: 1, drop_last_partial_validation_sequence: false },
      "drop_last_partial_validation_sequence",
    );
    expect(parseDatasetConfig({ ...base, drop_last_partial_validation_sequence: false }).split_index).toBe(0);
  });
});

describe("buildTokenDataset() refuses what megatron-core would hang or abort on", () => {
  const idx = parseIndex(vectorBytes("data/pub_i32_b.idx"), { path: "data/pub_i32_b.idx" });

  it("buildTokenDataset() refuses an empty split range, naming the source", () => {
    // 969,30,1 over 100 sequences: the test split is [100, 100).
    const config = parseDatasetConfig({ ...base, split_index: 2 });
    const err = configError(() => buildTokenDataset(config, [idx]));
    expect(err.field).toBe("sources[0]");
    expect(err.message).toMatch(/split range \[100, 100\) of "data\/pub_i32_b" holds 0 tokens/);
  });

  it("buildTokenDataset() refuses a split range of a single token", () => {
    const one = parseIndex(encodeIndex({ dtypeCode: 8, lengths: [1, 0] }), { path: "one.idx" });
    const config = parseDatasetConfig({ ...base, sources: [{ prefix: "one" }], split: "100,0,0" });
    expect(configError(() => buildTokenDataset(config, [one])).message).toMatch(/holds 1 token;/);
  });

  it("buildTokenDataset() refuses a blend whose source dtypes cannot share int32", () => {
    const f64 = parseIndex(encodeIndex({ dtypeCode: 6, lengths: [50, 50] }), { path: "f.idx" });
    const config = parseDatasetConfig({
      ...base,
      split: "100,0,0",
      sources: [{ prefix: "data/pub_i32_b", weight: 1 }, { prefix: "f", weight: 1 }],
      num_samples: 10,
      seq_length: 8,
    });
    const err = configError(() => buildTokenDataset(config, [idx, f64]));
    expect(err.field).toBe("sources");
    expect(err.message).toMatch(/cannot hold float64/);
  });
});
