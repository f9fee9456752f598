import { describe, expect, it } from "vitest";
import {
  buildGptIndices,
  buildSampleIndex,
  DatasetConfigError,
  encodeIndex,
  type GptIndexOptions,
  numEpochs,
  parseIndex,
  PIECE_STRIDE,
  planGptWindow,
} from "../../src/dataset/mod.ts";

function rows(r: { positions: Uint32Array; offsets: Int32Array }): number[][] {
  return Array.from(r.positions, (p, s) => [p, r.offsets[s]]);
}

const lengths = Int32Array.of(5, 3, 8);
const docIndex = Int32Array.of(2, 0, 1);

describe("buildSampleIndex() on the spec's worked example (lengths [5, 3, 8], document index [2, 0, 1], L = 4)", () => {
  it("buildSampleIndex() with the extra token gives rows (0,0) (0,4) (1,0) (1,4)", () => {
    expect(rows(buildSampleIndex(lengths, docIndex, 4, 1, 3))).toEqual([[0, 0], [0, 4], [1, 0], [1, 4]]);
  });

  it("buildSampleIndex() with a keep-partial count of 4 adds the short row (2, 2)", () => {
    expect(rows(buildSampleIndex(lengths, docIndex, 4, 1, 4))).toEqual([[0, 0], [0, 4], [1, 0], [1, 4], [2, 2]]);
  });

  it("buildSampleIndex() without the extra token gives rows (0,0) (0,4) (0,8) (1,4) (2,3)", () => {
    expect(rows(buildSampleIndex(lengths, docIndex, 4, 0, 4))).toEqual([[0, 0], [0, 4], [0, 8], [1, 4], [2, 3]]);
  });

  it("buildSampleIndex() steps over empty sequences", () => {
    // Stream: seq 1 (3 tokens), seq 0 (empty), seq 2 (4 tokens).
    const r = buildSampleIndex(Int32Array.of(0, 3, 4), Int32Array.of(1, 0, 2), 2, 1, 3);
    expect(rows(r)).toEqual([[0, 0], [0, 2], [2, 1], [2, 3]]);
  });

  it("buildSampleIndex() refuses a stream that ends before the last row, as megatron-core asserts", () => {
    expect(() => buildSampleIndex(lengths, docIndex, 4, 1, 5)).toThrow(DatasetConfigError);
    // Far past the end: must fail at the end of the stream, not walk off it.
    expect(() => buildSampleIndex(lengths, docIndex, 4, 1, 1000)).toThrow(/ends at row 4 of the sample index, but 1000 samples .*expected at most 4/);
    expect(() => buildSampleIndex(lengths, docIndex, 4, 0, 1000)).toThrow(DatasetConfigError);
  });

  it("buildSampleIndex() refuses an empty document index or one naming a sequence that does not exist", () => {
    expect(() => buildSampleIndex(lengths, new Int32Array(0), 4, 1, 1)).toThrow(/document index is empty/);
    expect(rows(buildSampleIndex(lengths, new Int32Array(0), 4, 1, 0))).toEqual([[0, 0]]);
    expect(() => buildSampleIndex(lengths, Int32Array.of(2, 7), 4, 1, 3)).toThrow(/entry 1 is sequence 7/);
    expect(() => buildSampleIndex(lengths, docIndex, 1, 1, 3)).toThrow(/seq_length/);
  });
});

describe("buildGptIndices()", () => {
  const base: GptIndexOptions = {
    lengths,
    begin: 0,
    end: 3,
    seqLength: 4,
    seed: 1,
    numSamples: 3,
    addExtraToken: true,
    keepPartial: false,
  };

  it("numEpochs() is the smallest E >= 1 with E × T >= N × L + x", () => {
    expect(numEpochs(47022, 57601)).toBe(2);
    expect(numEpochs(10, 10)).toBe(1);
    expect(numEpochs(10, 11)).toBe(2);
    expect(numEpochs(10, 1)).toBe(1);
    expect(numEpochs(3, 2 ** 52 + 1)).toBe(1501199875790166);
  });

  it("numEpochs() refuses the inputs on which megatron-core's epoch loop never ends, instead of spinning", () => {
    expect(() => numEpochs(0, 5)).toThrow(DatasetConfigError);
    expect(numEpochs(0, 0)).toBe(1);
    expect(() => numEpochs(1, Infinity)).toThrow(RangeError);
    expect(() => numEpochs(10, Number.NaN)).toThrow(RangeError);
    expect(() => numEpochs(-1, 5)).toThrow(RangeError);
  });

  it("buildGptIndices() with one epoch shuffles the split once and lays windows L tokens apart", () => {
    const ix = buildGptIndices(base);
    expect(ix.epochs).toBe(1);
    expect(ix.length).toBe(3);
    expect(ix.separateFinalEpoch).toBe(false);
    expect(Array.from(ix.documentIndex).sort()).toEqual([0, 1, 2]);
    expect(Array.from(ix.shuffleIndex).sort()).toEqual([0, 1, 2]);
  });

  it("buildGptIndices() addresses sequence numbers of the file, not positions in the split", () => {
    const ix = buildGptIndices({ ...base, lengths: Int32Array.of(9, 9, 5, 3, 8), begin: 2, end: 5 });
    expect(Array.from(ix.documentIndex).sort()).toEqual([2, 3, 4]);
  });

  it("buildGptIndices() with keep-partial counts windows with a single-precision ceiling and ends the last one short", () => {
    const ix = buildGptIndices({ ...base, numSamples: undefined, keepPartial: true });
    expect(ix.length).toBe(4);
    const index = parseIndex(encodeIndex({ dtypeCode: 8, lengths: [5, 3, 8] }), { path: "k.idx" });
    const out = new Float64Array(PIECE_STRIDE * 5);
    let tokens = 0;
    const n = planGptWindow(ix, index, Array.from(ix.shuffleIndex).indexOf(3), 0, out, 0);
    for (let p = 0; p < n; p++) tokens += out[PIECE_STRIDE * p + 2];
    // 16 tokens, windows start at 0, 4, 8, 12: the last holds tokens 12 … 15 only.
    expect(tokens).toBe(4);
  });

  it("buildGptIndices() refuses a keep-partial stream whose last sequence is empty", () => {
    // Seed 1234 leaves [0, 1] in place, so the empty sequence 1 ends the stream.
    const opts = { ...base, lengths: Int32Array.of(5, 0), end: 2, seqLength: 3, seed: 1234, numSamples: undefined, keepPartial: true };
    expect(() => buildGptIndices(opts)).toThrow(/last sequence in the document index is empty/);
    expect(buildGptIndices({ ...opts, keepPartial: false }).length).toBe(1);
  });

  it("buildGptIndices() without the extra token makes windows of exactly L tokens", () => {
    const ix = buildGptIndices({ ...base, addExtraToken: false, numSamples: 4 });
    expect(ix.length).toBe(4);
    expect(ix.extraToken).toBe(0);
  });

  it("buildGptIndices() refuses splits holding at most one token and seq_length < 2", () => {
    expect(() => buildGptIndices({ ...base, begin: 1, end: 1 })).toThrow(/holds 0 tokens/);
    expect(() => buildGptIndices({ ...base, lengths: Int32Array.of(1, 0), end: 2 })).toThrow(DatasetConfigError);
    expect(() => buildGptIndices({ ...base, seqLength: 1 })).toThrow(/seq_length/);
    expect(() => buildGptIndices({ ...base, end: 4 })).toThrow(RangeError);
  });

  it("buildGptIndices() names the field of a bad seed or sample count", () => {
    expect(() => buildGptIndices({ ...base, seed: -1 })).toThrow(/seed: expected an integer in 0 … 4294967295, received -1/);
    expect(() => buildGptIndices({ ...base, numSamples: 1.5 })).toThrow(/num_samples: .*received 1.5/);
    expect(() => buildGptIndices({ ...base, numSamples: Infinity })).toThrow(/num_samples/);
  });

  it("buildGptIndices() refuses document indexes beyond 2^32-1 entries before allocating them", () => {
    const err = (() => {
      try {
        buildGptIndices({ ...base, lengths: Int32Array.of(2, 2, 2), seqLength: 2 ** 20, numSamples: 2 ** 31 });
      } catch (e) {
        return e as DatasetConfigError;
      }
    })();
    expect(err).toBeInstanceOf(DatasetConfigError);
    expect(err?.field).toBe("num_samples");
  });
});
