import { describe, expect, it } from "vitest";
import {
  buildFromIndexFiles,
  estimateIndexMemory,
  type IndexBuildInput,
  indexMemoryLowerBound,
  parseDatasetConfig,
  tokenDatasetParts,
  unsharedBytes,
} from "../../src/dataset/mod.ts";
import { syntheticDataset } from "../helpers/token-data.ts";

const a = syntheticDataset(500, 20, 300, 4); // ~80 k tokens
const b = syntheticDataset(300, 10, 200, 5);

function input(body: Record<string, unknown>, files: { idx: Uint8Array; bin: Uint8Array }[], paths: string[]): IndexBuildInput {
  const config = parseDatasetConfig({ seed: 2, split: "100,0,0", split_index: 0, ...body });
  return { config, idx: files.map((f) => f.idx), paths, binSizes: files.map((f) => f.bin.length) };
}

const cases: [string, IndexBuildInput][] = [
  ["one source, one epoch", input({ sources: [{ prefix: "d/a" }], seq_length: 32, num_samples: 100 }, [a], ["d/a.idx"])],
  ["one source over many epochs (separate final epoch)", input({ sources: [{ prefix: "d/a" }], seq_length: 64, num_samples: 5000 }, [a], ["d/a.idx"])],
  ["a long seq_length over a small corpus (a document index of many epochs)", input({ sources: [{ prefix: "d/b" }], seq_length: 100_000, num_samples: 40 }, [b], ["d/b.idx"])],
  ["a train split of part of the file", input({ sources: [{ prefix: "d/a" }], seq_length: 32, num_samples: 900, split: "90,10,0" }, [a], ["d/a.idx"])],
  [
    "a blend with the same file twice",
    input(
      { sources: [{ prefix: "d/a", weight: 1 }, { prefix: "d/b", weight: 2 }, { prefix: "d/a", weight: 0.5 }], seq_length: 48, num_samples: 3000 },
      [a, b, a],
      ["d/a.idx", "d/b.idx", "d/a.idx"],
    ),
  ],
];

describe("estimateIndexMemory()", () => {
  for (const [what, inp] of cases) {
    it(`estimateIndexMemory() counts exactly the typed-array bytes the build keeps: ${what}`, () => {
      const held = unsharedBytes(tokenDatasetParts(buildFromIndexFiles(inp)));
      const e = estimateIndexMemory(inp);
      expect(e.heldBytes).toBe(held);
      const idx = inp.idx.reduce((s, f) => s + f.byteLength, 0);
      expect(e.buildBytes).toBe(held + idx);
      expect(e.parsedBytes + e.documentIndexBytes + e.sampleBytes + e.blendBytes).toBe(held);
      // The lower bound that refuses before the files are read never refuses what the estimate accepts.
      expect(indexMemoryLowerBound(inp.config, inp.idx.map((f) => f.byteLength))).toBeLessThanOrEqual(e.buildBytes);
    });
  }

  it("estimateIndexMemory() grows the document index with the epochs a long seq_length takes", () => {
    const short = estimateIndexMemory(input({ sources: [{ prefix: "d/b" }], seq_length: 64, num_samples: 40 }, [b], ["d/b.idx"]));
    const long = estimateIndexMemory(input({ sources: [{ prefix: "d/b" }], seq_length: 1_000_000, num_samples: 40 }, [b], ["d/b.idx"]));
    expect(short.maxEpochs).toBe(1);
    expect(long.maxEpochs).toBeGreaterThan(1000);
    expect(long.documentIndexBytes).toBe(4 * long.maxEpochs * 300);
  });

  it("estimateIndexMemory() reaches sizes no build could allocate without allocating them", () => {
    const e = estimateIndexMemory(input({ sources: [{ prefix: "d/a" }], seq_length: 2 ** 31 - 2, num_samples: 1e12 }, [a], ["d/a.idx"]));
    expect(e.buildBytes).toBeGreaterThan(2 ** 50);
    expect(Number.isFinite(e.buildBytes)).toBe(true);
  });

  it("estimateIndexMemory() counts only the file of a source the build will refuse", () => {
    const truncated = a.idx.subarray(0, 100);
    const e = estimateIndexMemory({ ...cases[0][1], idx: [truncated] });
    expect(e).toMatchObject({ heldBytes: 0, buildBytes: 100, idxBytes: 100 });
  });
});
