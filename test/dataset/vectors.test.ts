import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import {
  buildTokenDataset,
  type IndexedDatasetIndex,
  parseDatasetConfig,
  parseIndex,
  PIECE_STRIDE,
  readSample,
  type TokenDataset,
} from "../../src/dataset/mod.ts";
import { vectorBytes, vectorJson } from "./vector-files.ts";

interface VectorCase {
  name: string;
  registration: unknown;
  expected: string;
  debug: string;
  len: number;
  dtypes: string[];
}

const cases: VectorCase[] = vectorJson("cases.json").cases;

function open(c: VectorCase): { ds: TokenDataset; bins: Uint8Array[]; indexes: IndexedDatasetIndex[] } {
  const config = parseDatasetConfig(c.registration);
  const bins = config.sources.map((s) => vectorBytes(`${s.prefix}.bin`));
  const indexes = config.sources.map((s, k) =>
    parseIndex(vectorBytes(`${s.prefix}.idx`), { path: `${s.prefix}.idx`, binSize: bins[k].byteLength })
  );
  return { ds: buildTokenDataset(config, indexes, { binSizes: bins.map((b) => b.byteLength) }), bins, indexes };
}

function rows(positions: Uint32Array, offsets: Int32Array): number[][] {
  return Array.from(positions, (p, s) => [p, offsets[s]]);
}

describe.each(cases.map((c) => [c.name, c] as const))("Megatron vector %s", (_name, c) => {
  const { ds, bins } = open(c);
  const expected = vectorJson(c.expected);
  const debug = vectorJson(c.debug).arrays;

  it("readSample() reproduces every window's SHA-256 and the digest of all windows", () => {
    expect(expected.count).toBeGreaterThan(0);
    const out = new BigInt64Array(ds.windowLength);
    const all = createHash("sha256");
    const mismatches: number[] = [];
    for (let i = 0; i < expected.count; i++) {
      expect(readSample(ds, bins, i, out)).toBe(ds.windowLength);
      const bytes = new Uint8Array(out.buffer);
      all.update(bytes);
      if (createHash("sha256").update(bytes).digest("hex").slice(0, 16) !== expected.window_sha256_16[i]) mismatches.push(i);
    }
    expect(mismatches).toEqual([]);
    expect(all.digest("hex")).toBe(expected.sha256_all_int64le);
  });

  it("readSample() in the served dtype gives the explicit first and last windows", () => {
    const Ctor = ds.dtype === "uint16" ? Uint16Array : Int32Array;
    const out = new Ctor(ds.windowLength);
    for (const range of expected.ranges) {
      range.windows.forEach((window: number[], k: number) => {
        readSample(ds, bins, range.start + k, out);
        expect(Array.from(out), `sample ${range.start + k}`).toEqual(window);
      });
    }
  });

  it("buildTokenDataset() computes Megatron's length, dtype, window length and per-source facts", () => {
    const facts = expected.facts;
    expect(ds.length).toBe(c.len);
    expect(ds.numSamples).toBe(expected.count);
    expect(ds.windowLength).toBe(expected.window_length);
    expect([ds.dtype]).toEqual(c.dtypes);
    expect(ds.kind).toBe(facts.kind);
    const d = ds.describe();
    d.sources.forEach((s, k) => {
      const p = facts.parts[k];
      expect(s.splitRange).toEqual(p.split_range);
      expect(s.sequencesInFile).toBe(p.sequences_in_file);
      expect(s.documentsInFile).toBe(p.documents_in_file);
      expect(s.numSamplesRequested).toBe(p.num_samples_requested);
      expect(s.tokensPerEpoch).toBe(p.tokens_per_epoch);
      expect(s.epochs).toBe(p.num_epochs);
      expect(s.length).toBe(p.len);
      expect(s.separateFinalEpoch).toBe(p.separate_final_epoch);
      expect(s.samplesBeforeFinalEpoch).toBe(p.num_samples_sans_final_epoch);
      expect(s.samplesPerEpoch).toBe(p.num_samples_per_epoch);
    });
    if (facts.kind === "blend") {
      expect(d.blend?.weightsUsed).toEqual(facts.blend_weights_used);
      expect(d.blend?.size).toBe(facts.blend_size);
      expect(d.blend?.counts).toEqual(facts.blend_counts);
    }
  });

  it("buildTokenDataset() builds Megatron's document, sample and shuffle indexes array for array", () => {
    ds.sources.forEach((s, k) => {
      const prefix = ds.kind === "blend" ? `part${k}_` : "";
      expect(Array.from(s.gpt.documentIndex)).toEqual(debug[`${prefix}document_index`]);
      expect(rows(s.gpt.samplePositions, s.gpt.sampleOffsets)).toEqual(debug[`${prefix}sample_index`]);
      expect(Array.from(s.gpt.shuffleIndex)).toEqual(debug[`${prefix}shuffle_index`]);
    });
    if (ds.blend !== undefined) {
      expect(Array.from(ds.blend.datasetIndex)).toEqual(debug.dataset_index);
      expect(Array.from(ds.blend.datasetSampleIndex)).toEqual(debug.dataset_sample_index);
    }
  });

  it("TokenDataset.planSample() covers exactly one window of tokens with in-bounds byte ranges", () => {
    const plan = new Float64Array(PIECE_STRIDE * ds.maxPiecesPerSample);
    for (let i = 0; i < ds.length; i++) {
      const n = ds.planSample(i, plan);
      let tokens = 0;
      for (let p = 0; p < n; p++) {
        const source = plan[PIECE_STRIDE * p];
        const count = plan[PIECE_STRIDE * p + 2];
        expect(count).toBeGreaterThan(0);
        expect(source).toBe(ds.sourceOf(i));
        expect(plan[PIECE_STRIDE * p + 1] + count * ds.sources[source].index.itemSize).toBeLessThanOrEqual(bins[source].byteLength);
        tokens += count;
      }
      if (tokens !== ds.windowLength) expect(tokens, `sample ${i}`).toBe(ds.windowLength);
    }
    expect(() => ds.planSample(ds.length, plan)).toThrow(RangeError);
    expect(() => ds.planSample(-1, plan)).toThrow(RangeError);
  });
});

describe("the spec's worked example i32_two_epochs_separate_final (section 4.8)", () => {
  const c = cases.find((x) => x.name === "i32_two_epochs_separate_final")!;
  const { ds, bins } = open(c);
  const gpt = ds.sources[0].gpt;

  it("buildTokenDataset() gives the split, epochs and final-epoch decision of section 4.8", () => {
    expect(ds.sources[0].range).toEqual({ begin: 0, end: 97 });
    expect(gpt.tokensPerEpoch).toBe(47022);
    expect(gpt.epochs).toBe(2);
    expect(gpt.samplesBeforeFinalEpoch).toBe(367);
    expect(gpt.samplesPerEpoch).toBe(367);
    expect(gpt.separateFinalEpoch).toBe(true);
  });

  it("buildTokenDataset() gives the indexes of section 4.8", () => {
    expect(gpt.documentIndex.length).toBe(194);
    expect(Array.from(gpt.documentIndex.subarray(0, 5))).toEqual([62, 40, 93, 18, 81]);
    expect(gpt.length).toBe(734);
    expect([gpt.samplePositions[3], gpt.sampleOffsets[3]]).toEqual([0, 384]);
    expect([gpt.samplePositions[734], gpt.sampleOffsets[734]]).toEqual([193, 666]);
    expect(Array.from(gpt.shuffleIndex.subarray(0, 3))).toEqual([71, 277, 104]);
    expect(Array.from(gpt.shuffleIndex.subarray(367, 371))).toEqual([714, 623, 721, 538]);
    // The separate final epoch keeps its windows at positions >= F.
    expect(Math.max(...gpt.shuffleIndex.subarray(0, 367))).toBe(366);
  });

  it("readSample(0) is tokens 253 … 381 of sequence 49", () => {
    expect([gpt.samplePositions[71], gpt.sampleOffsets[71], gpt.samplePositions[72], gpt.sampleOffsets[72]]).toEqual([20, 253, 20, 381]);
    expect(gpt.documentIndex[20]).toBe(49);
    const out = new Int32Array(ds.windowLength);
    readSample(ds, bins, 0, out);
    expect(Array.from(out.subarray(0, 3))).toEqual([2111649854, 303176247, 265149002]);
    expect(out[128]).toBe(748633403);
    const plan = new Float64Array(PIECE_STRIDE * ds.maxPiecesPerSample);
    expect(ds.planSample(0, plan)).toBe(1);
    expect(Array.from(plan.subarray(0, 3))).toEqual([0, ds.sources[0].index.pointers[49] + 253 * 4, 129]);
  });
});

describe("a blend of a uint16 and an int32 source", () => {
  const config = parseDatasetConfig({
    sources: [{ prefix: "data/pub_u16_a", weight: 2 }, { prefix: "data/pub_i32_b", weight: 1 }],
    seq_length: 32,
    seed: 9,
    split: "100,0,0",
    split_index: 0,
    num_samples: 300,
  });
  const bins = config.sources.map((s) => vectorBytes(`${s.prefix}.bin`));
  const indexes = config.sources.map((s) => parseIndex(vectorBytes(`${s.prefix}.idx`), { path: `${s.prefix}.idx` }));
  const ds = buildTokenDataset(config, indexes);

  it("buildTokenDataset() serves mixed dtypes as int32, uint16 tokens read unsigned", () => {
    expect(ds.dtype).toBe("int32");
    const narrow = new Int32Array(ds.windowLength);
    const wide = new BigInt64Array(ds.windowLength);
    let maxU16 = 0;
    let maxI32 = 0;
    for (let i = 0; i < ds.numSamples; i++) {
      readSample(ds, bins, i, narrow);
      readSample(ds, bins, i, wide);
      expect(Array.from(wide, Number)).toEqual(Array.from(narrow));
      const m = Math.max(...narrow);
      if (ds.sourceOf(i) === 0) maxU16 = Math.max(maxU16, m);
      else maxI32 = Math.max(maxI32, m);
    }
    expect(maxU16).toBeGreaterThan(32767);
    expect(maxU16).toBeLessThanOrEqual(65535);
    expect(maxI32).toBeGreaterThan(65535);
  });

  it("buildTokenDataset() blends 2:1 with the greedy index", () => {
    expect(ds.blend?.size).toBe(300);
    expect(Array.from(ds.blend!.counts)).toEqual([200, 100]);
    expect(Array.from(ds.blend!.datasetIndex.subarray(0, 6))).toEqual([0, 1, 0, 0, 1, 0]);
  });
});
