import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  blendSizes,
  buildBlendingIndices,
  buildGptIndices,
  buildTokenDataset,
  DatasetConfigError,
  DTYPE_CODES,
  encodeIndex,
  normalize,
  parseDatasetConfig,
  parseIndex,
  PIECE_STRIDE,
  planGptWindow,
  RandomState,
} from "../../src/dataset/mod.ts";

const seedArb = fc.integer({ min: 0, max: 0xffffffff });

/** A dataset over sources of these sequence lengths (uint16 tokens), a weighted blend or not. */
function sourcesDataset(srcs: readonly { weight: number; lens: number[] }[], weighted: boolean, seqLength: number, numSamples: number, seed: number) {
  const config = parseDatasetConfig({
    sources: srcs.map((s, k) => ({ prefix: `p${k}`, ...(weighted ? { weight: s.weight } : {}) })),
    seq_length: seqLength,
    seed,
    split: "100,0,0",
    split_index: 0,
    num_samples: numSamples,
  });
  return buildTokenDataset(config, srcs.map((s, k) => parseIndex(encodeIndex({ dtypeCode: 8, lengths: s.lens }), { path: `p${k}.idx` })));
}

/** A one-source dataset over sequences of these lengths (uint16 tokens). */
function singleSource(lengths: number[], seqLength: number, numSamples: number, seed: number) {
  return sourcesDataset([{ weight: 1, lens: lengths }], false, seqLength, numSamples, seed);
}

describe("properties", () => {
  it("RandomState.shuffle is a permutation, and the same seed gives the same one", () => {
    fc.assert(
      fc.property(seedArb, fc.integer({ min: 0, max: 3000 }), (seed, n) => {
        const a = new Uint32Array(n).map((_, i) => i);
        const b = a.slice();
        new RandomState(seed).shuffle(a);
        new RandomState(seed).shuffle(b);
        expect(a).toEqual(b);
        expect(Array.from(a.slice().sort())).toEqual(Array.from({ length: n }, (_, i) => i));
      }),
      { numRuns: 100 },
    );
  });

  it("RandomState.randomInterval(max) stays within [0, max] on both branches", () => {
    fc.assert(
      fc.property(seedArb, fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }), (seed, max) => {
        const rs = new RandomState(seed);
        for (let k = 0; k < 4; k++) {
          const v = rs.randomInterval(max);
          expect(Number.isInteger(v) && v >= 0 && v <= max).toBe(true);
        }
      }),
    );
  });

  it("parseIndex(encodeIndex(x)) returns x for every dtype", () => {
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 8 }), fc.array(fc.integer({ min: 0, max: 1 << 20 }), { maxLength: 50 }), (code, lens) => {
        const ix = parseIndex(encodeIndex({ dtypeCode: code, lengths: lens }), { path: "p.idx" });
        expect(Array.from(ix.lengths)).toEqual(lens);
        expect(ix.itemSize).toBe(DTYPE_CODES[code].itemSize);
        let at = 0;
        lens.forEach((len, k) => {
          expect(ix.pointers[k]).toBe(at);
          at += len * ix.itemSize;
        });
        expect(ix.requiredBinBytes).toBe(at);
      }),
    );
  });

  it("buildGptIndices() windows are the token stream's [s × L, s × L + L + x), always L + x tokens", () => {
    const arb = fc.record({
      lengths: fc.array(fc.oneof(fc.constant(0), fc.integer({ min: 1, max: 60 })), { minLength: 1, maxLength: 30 }),
      cut: fc.tuple(fc.nat(), fc.nat()),
      seqLength: fc.integer({ min: 2, max: 24 }),
      seed: seedArb,
      numSamples: fc.option(fc.integer({ min: 1, max: 150 }), { nil: undefined }),
      addExtraToken: fc.boolean(),
      keepPartial: fc.boolean(),
      dtypeCode: fc.constantFrom(4, 8),
    });
    fc.assert(
      fc.property(arb, (c) => {
        const n = c.lengths.length;
        const begin = c.cut[0] % (n + 1);
        const end = begin + (c.cut[1] % (n - begin + 1));
        const index = parseIndex(encodeIndex({ dtypeCode: c.dtypeCode, lengths: c.lengths }), { path: "prop.idx" });
        let tokens = 0;
        for (let d = begin; d < end; d++) tokens += c.lengths[d];
        const opts = { lengths: index.lengths, begin, end, seqLength: c.seqLength, seed: c.seed, numSamples: c.numSamples, addExtraToken: c.addExtraToken, keepPartial: c.keepPartial };
        if (tokens <= 1) {
          expect(() => buildGptIndices(opts)).toThrow(DatasetConfigError);
          return;
        }
        let ix;
        try {
          ix = buildGptIndices(opts);
        } catch (e) {
          // Only keep-partial streams that end in an empty sequence are refused here.
          expect(c.keepPartial && e instanceof DatasetConfigError).toBe(true);
          return;
        }
        const x = c.addExtraToken ? 1 : 0;
        const L = c.seqLength;
        const docs = end - begin;
        // Every split sequence appears once per epoch; a separate final epoch is one whole pass.
        const counts = new Map<number, number>();
        for (const d of ix.documentIndex) counts.set(d, (counts.get(d) ?? 0) + 1);
        for (let d = begin; d < end; d++) expect(counts.get(d)).toBe(ix.epochs);
        if (ix.separateFinalEpoch) {
          expect(Array.from(ix.documentIndex.subarray(docs * (ix.epochs - 1))).sort((a, b) => a - b)).toEqual(
            Array.from({ length: docs }, (_, k) => begin + k),
          );
          expect(Math.max(-1, ...ix.shuffleIndex.subarray(0, ix.samplesBeforeFinalEpoch))).toBeLessThan(ix.samplesBeforeFinalEpoch!);
        }
        expect(Array.from(ix.shuffleIndex).sort((a, b) => a - b)).toEqual(Array.from({ length: ix.length }, (_, k) => k));
        if (c.numSamples !== undefined) expect(ix.length).toBeGreaterThanOrEqual(c.numSamples);

        // The stream as token addresses (pointer / item size + offset), built independently of the walk.
        const stream: number[] = [];
        for (const d of ix.documentIndex) {
          for (let t = 0; t < c.lengths[d]; t++) stream.push(index.pointers[d] / index.itemSize + t);
        }
        const out = new Float64Array(PIECE_STRIDE * (L + x));
        for (let item = 0; item < ix.length; item++) {
          const j = ix.shuffleIndex[item];
          const pieces = planGptWindow(ix, index, item, 0, out, 0);
          const got: number[] = [];
          for (let p = 0; p < pieces; p++) {
            const first = out[PIECE_STRIDE * p + 1] / index.itemSize;
            for (let t = 0; t < out[PIECE_STRIDE * p + 2]; t++) got.push(first + t);
          }
          const want = stream.slice(j * L, j * L + L + x);
          expect(got).toEqual(want);
          // Only a keep-partial last window may be short.
          if (!(c.keepPartial && j === ix.length - 1)) expect(got.length).toBe(L + x);
        }
      }),
      { numRuns: 150 },
    );
  });

  it("buildBlendingIndices() numbers each source's samples 0, 1, 2, … and fills the blend", () => {
    fc.assert(
      fc.property(
        fc.array(fc.double({ min: 0.01, max: 10, noNaN: true }), { minLength: 1, maxLength: 6 }),
        fc.integer({ min: 1, max: 400 }),
        (raw, n) => {
          const sizes = blendSizes(raw, n, 0.005);
          expect(sizes.size).toBeGreaterThanOrEqual(n);
          const bi = buildBlendingIndices(normalize(sizes.weights), sizes.size);
          const next = new Array(raw.length).fill(0);
          for (let s = 0; s < sizes.size; s++) {
            const k = bi.datasetIndex[s];
            expect(bi.datasetSampleIndex[s]).toBe(next[k]++);
          }
          expect(next.reduce((a, b) => a + b, 0)).toBe(sizes.size);
          expect(Array.from(bi.counts)).toEqual(next);
        },
      ),
    );
  });

  it("buildTokenDataset() plans every sample of a random weighted blend as windowLength tokens from its own source", () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ weight: fc.integer({ min: 1, max: 9 }), lens: fc.array(fc.integer({ min: 1, max: 80 }), { minLength: 2, maxLength: 12 }) }), { minLength: 1, maxLength: 3 }),
        fc.integer({ min: 2, max: 16 }),
        fc.integer({ min: 1, max: 120 }),
        seedArb,
        (srcs, seqLength, numSamples, seed) => {
          const ds = sourcesDataset(srcs, true, seqLength, numSamples, seed);
          const plan = new Float64Array(PIECE_STRIDE * ds.maxPiecesPerSample);
          for (let i = 0; i < ds.length; i++) {
            const n = ds.planSample(i, plan);
            let tokens = 0;
            for (let p = 0; p < n; p++) {
              expect(plan[PIECE_STRIDE * p]).toBe(ds.sourceOf(i));
              tokens += plan[PIECE_STRIDE * p + 2];
            }
            expect(tokens).toBe(seqLength + 1);
          }
        },
      ),
      { numRuns: 60 },
    );
  });

  it("readIndexes() reads exactly the entries planning reads (their sum), for single sources and blends, and clips runs past either end", () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ weight: fc.integer({ min: 1, max: 9 }), lens: fc.array(fc.integer({ min: 1, max: 80 }), { minLength: 2, maxLength: 12 }) }), { minLength: 1, maxLength: 3 }),
        fc.boolean(),
        fc.integer({ min: 2, max: 16 }),
        fc.integer({ min: 1, max: 120 }),
        seedArb,
        fc.integer({ min: -5, max: 130 }),
        fc.integer({ min: 1, max: 40 }),
        (srcs, weighted, seqLength, numSamples, seed, first, count) => {
          const ds = sourcesDataset(weighted ? srcs : srcs.slice(0, 1), weighted, seqLength, numSamples, seed);
          // What planning sample i reads: its source's shuffle row, the row's offset and the
          // positions to the next row's, and each document's pointer and length.
          let expected = 0;
          for (let i = Math.max(0, first); i < Math.min(first + count, ds.length); i++) {
            const k = ds.sourceOf(i);
            const item = ds.blend === undefined ? i : ds.blend.datasetSampleIndex[i];
            const { gpt, index } = ds.sources[k];
            const row = gpt.shuffleIndex[item];
            expected += gpt.sampleOffsets[row];
            for (let p = gpt.samplePositions[row]; p <= gpt.samplePositions[row + 1]; p++) {
              const doc = gpt.documentIndex[p];
              expected += index.pointers[doc] + index.lengths[doc];
            }
          }
          expect(ds.readIndexes(first, count)).toBe(expected);
        },
      ),
      { numRuns: 100 },
    );
  });

  it("readIndexes() reads the same entries when a batch's documents outnumber its scratch (4096)", () => {
    // Documents of 1–3 tokens in windows of 2049: ~1000 documents per sample, ~8000 for 8 samples.
    const ds = singleSource(Array.from({ length: 60_000 }, (_, i) => 1 + (i % 3)), 2048, 40, 5);
    const { gpt, index } = ds.sources[0];
    let expected = 0;
    let docs = 0;
    for (let i = 0; i < 8; i++) {
      const row = gpt.shuffleIndex[i];
      expected += gpt.sampleOffsets[row];
      for (let p = gpt.samplePositions[row]; p <= gpt.samplePositions[row + 1]; p++, docs++) {
        expected += index.pointers[gpt.documentIndex[p]] + index.lengths[gpt.documentIndex[p]];
      }
    }
    expect(docs).toBeGreaterThan(4096);
    expect(ds.readIndexes(0, 8)).toBe(expected);
  });

  it("readIndexes() reads ahead the first 1024 samples of a larger batch only", () => {
    const ds = singleSource(Array.from({ length: 400 }, (_, i) => 5 + ((i * 37) % 50)), 8, 3000, 3);
    expect(ds.readIndexes(0, 3000)).toBe(ds.readIndexes(0, 1024));
    expect(ds.readIndexes(0, 1024)).toBeGreaterThan(ds.readIndexes(0, 1023));
  });
});
