import { describe, expect, it } from "vitest";
import { buildFromIndexFiles, type IndexBuildInput, parseDatasetConfig, PIECE_STRIDE, type TokenDataset } from "../../src/dataset/mod.ts";
import { isCacheServerError } from "../../src/errors.ts";
import { workerIndexBuilder } from "../../src/runtime/index-builder.ts";
import { syntheticDataset } from "../helpers/token-data.ts";

function input(documents: number, numSamples: number, weighted = false): IndexBuildInput {
  const a = syntheticDataset(documents, 20, 300, 5);
  const b = syntheticDataset(documents / 2, 40, 200, 6);
  const sources = weighted ? [{ prefix: "d/a", weight: 0.6 }, { prefix: "d/b", weight: 0.4 }] : [{ prefix: "d/a" }];
  const config = parseDatasetConfig({ sources, seq_length: 64, seed: 7, split: "90,10,0", split_index: 0, num_samples: numSamples });
  const files = weighted ? [a, b] : [a];
  return { config, idx: files.map((f) => f.idx), paths: files.map((_, k) => `d/${k}.idx`), binSizes: files.map((f) => f.bin.length) };
}

/** Every sample's plan, so two builds can be compared piece for piece. */
function plans(ds: TokenDataset): Float64Array[] {
  const out: Float64Array[] = [];
  for (let i = 0; i < ds.length; i += 97) {
    const pieces = new Float64Array(PIECE_STRIDE * ds.maxPiecesPerSample);
    const n = ds.planSample(i, pieces);
    out.push(pieces.slice(0, n * PIECE_STRIDE));
  }
  return out;
}

describe("workerIndexBuilder (Node worker thread)", () => {
  it.each([[false], [true]])("builds the same dataset as the calling thread (weighted blend: %s)", async (weighted) => {
    const inline = buildFromIndexFiles(input(3000, 40_000, weighted));
    const sent = input(3000, 40_000, weighted);
    const built = await workerIndexBuilder("node")(sent);
    // The .idx bytes were moved to the worker thread, not copied: they are detached here.
    expect(sent.idx.every((b) => b.byteLength === 0)).toBe(true);
    expect(built.length).toBe(inline.length);
    expect(built.describe()).toEqual(inline.describe());
    expect(plans(built)).toEqual(plans(inline));
    expect(built.sources[0].gpt.shuffleIndex).toEqual(inline.sources[0].gpt.shuffleIndex);
    if (weighted) expect(built.blend!.datasetIndex).toEqual(inline.blend!.datasetIndex);
    // Moved back, not shared; asked for (a planning thread will read them), in shared memory.
    const arrays = (ds: TokenDataset): ArrayBufferView[] => [
      ds.sources[0].gpt.shuffleIndex,
      ds.sources[0].gpt.documentIndex,
      ds.sources[0].index.pointers,
      ds.sources[0].index.lengths,
      ...(weighted ? [ds.blend!.datasetIndex, ds.blend!.datasetSampleIndex] : []),
    ];
    expect(arrays(built).some((a) => a.buffer instanceof SharedArrayBuffer)).toBe(false);
    const shared = await workerIndexBuilder("node")({ ...input(3000, 40_000, weighted), shareArrays: true });
    expect(arrays(shared).every((a) => a.buffer instanceof SharedArrayBuffer)).toBe(true);
    expect(plans(shared)).toEqual(plans(inline));
  });

  it("raises the calling thread's error, code and message, for a malformed .idx", async () => {
    const bad = input(100, 1000);
    const idx = new Uint8Array(bad.idx[0]);
    idx[0] ^= 0xff; // bad magic
    const inlineError = (() => {
      try {
        buildFromIndexFiles({ ...bad, idx: [idx.slice()] });
      } catch (e) {
        return e as Error;
      }
    })();
    const error = await workerIndexBuilder("node")({ ...bad, idx: [idx] }).then(() => undefined, (e) => e as Error);
    expect(isCacheServerError(error)).toBe(true);
    expect(error!.message).toBe(inlineError!.message);
    expect(error!.message).toMatch(/Cannot read index "d\/0\.idx": bad magic/);
  });
});
