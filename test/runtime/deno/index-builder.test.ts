// The index-build worker under Deno: the same dataset as a build on the calling thread, and its errors.

import assert from "node:assert/strict";
import { buildFromIndexFiles, encodeIndex, type IndexBuildInput, parseDatasetConfig, PIECE_STRIDE, type TokenDataset } from "../../../src/dataset/mod.ts";
import { isCacheServerError } from "../../../src/errors.ts";
import { workerIndexBuilder } from "../../../src/runtime/index-builder.ts";

function input(): IndexBuildInput {
  const lengths: number[] = [];
  let x = 5;
  for (let i = 0; i < 3000; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    lengths.push(20 + (x % 281));
  }
  const tokens = lengths.reduce((a, b) => a + b, 0);
  const config = parseDatasetConfig({ sources: [{ prefix: "d/a" }], seq_length: 64, seed: 7, split: "90,10,0", split_index: 0, num_samples: 40_000 });
  return { config, idx: [encodeIndex({ dtypeCode: 8, lengths })], paths: ["d/a.idx"], binSizes: [tokens * 2] };
}

function plans(ds: TokenDataset): number[][] {
  const out: number[][] = [];
  for (let i = 0; i < ds.length; i += 97) {
    const pieces = new Float64Array(PIECE_STRIDE * ds.maxPiecesPerSample);
    out.push(Array.from(pieces.subarray(0, ds.planSample(i, pieces) * PIECE_STRIDE)));
  }
  return out;
}

Deno.test("the index-build worker builds the same dataset as the calling thread, the .idx moved not copied", async () => {
  const inline = buildFromIndexFiles(input());
  const sent = input();
  const built = await workerIndexBuilder("deno")(sent);
  assert.equal(sent.idx[0].byteLength, 0);
  assert.deepEqual(built.describe(), inline.describe());
  assert.deepEqual(plans(built), plans(inline));
});

Deno.test("the index-build worker raises the calling thread's error for a malformed .idx", async () => {
  const bad = input();
  const idx = new Uint8Array(bad.idx[0]);
  idx[0] ^= 0xff;
  const error = await workerIndexBuilder("deno")({ ...bad, idx: [idx] }).then(() => undefined, (e) => e as Error);
  assert.ok(isCacheServerError(error));
  assert.match(error!.message, /Cannot read index "d\/a\.idx": bad magic/);
});
