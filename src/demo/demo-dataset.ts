/** @module The embedded demo: a small generated local dataset so `npm start` works with no cloud account. */

import { stat, writeFile } from "node:fs/promises";
import { makeDirs } from "../runtime/make-dirs.ts";
import { encodeIndex } from "../dataset/mod.ts";

/** One generated demo object. */
export interface DemoObject {
  readonly key: string;
  readonly bytes: number;
}

/** The demo objects: a text file, and shards that span several 8 MiB blocks. */
export const DEMO_OBJECTS: readonly DemoObject[] = [
  { key: "hello.txt", bytes: 0 },
  { key: "shards/shard-00000.bin", bytes: 20 * 2 ** 20 },
  { key: "shards/shard-00001.bin", bytes: 20 * 2 ** 20 },
  { key: "shards/shard-00002.bin", bytes: 5 * 2 ** 20 + 123 },
];

const HELLO = "Hello from rackfeed. This file was served through the block cache.\n";

/**
 * Creates the demo objects under `dir` unless they already exist with the right size.
 * Shard bytes are a deterministic pseudo-random stream, so ranges can be checked by anyone.
 *
 * @param dir the directory to fill
 * @returns the objects written or found
 */
export async function ensureDemoDataset(dir: string): Promise<readonly DemoObject[]> {
  await makeDirs(`${dir}/shards`);
  for (const obj of DEMO_OBJECTS) {
    const path = `${dir}/${obj.key}`;
    const want = obj.key === "hello.txt" ? new TextEncoder().encode(HELLO).length : obj.bytes;
    const have = await stat(path).then((s) => s.size, () => -1);
    if (have === want) continue;
    await writeFile(path, obj.key === "hello.txt" ? HELLO : demoBytes(obj.bytes, obj.key.length));
  }
  await ensureDemoTokens(dir);
  return DEMO_OBJECTS;
}

/** Name of the demo token dataset and its registration file (relative to the demo folder). */
export const DEMO_TOKEN_DATASET = { name: "demo", registration: "tokens/demo-dataset.json" } as const;

/**
 * A small Megatron indexed dataset (`tokens/demo_text_document.idx/.bin`, uint16 tokens, 400
 * documents) and its registration, so the demo serves token batches too.
 */
async function ensureDemoTokens(dir: string): Promise<void> {
  await makeDirs(`${dir}/tokens`);
  const lengths: number[] = [];
  let x = 12345;
  for (let i = 0; i < 400; i++) {
    x = (Math.imul(x, 1103515245) + 12345) >>> 0;
    lengths.push(50 + (x % 2000));
  }
  const tokens = lengths.reduce((a, b) => a + b, 0);
  const bin = `${dir}/tokens/demo_text_document.bin`;
  if (await stat(bin).then((s) => s.size !== tokens * 2, () => true)) {
    const t = new Uint16Array(tokens);
    for (let i = 0; i < tokens; i++) t[i] = (i * 2654435761) % 50257; // GPT-2-sized vocabulary
    await writeFile(`${dir}/tokens/demo_text_document.idx`, encodeIndex({ dtypeCode: 8, lengths }));
    await writeFile(bin, new Uint8Array(t.buffer));
  }
  const registration = {
    sources: [{ prefix: "demo/tokens/demo_text_document" }],
    seq_length: 1024,
    seed: 1234,
    split: "969,30,1",
    split_index: 0,
    num_samples: 2000,
  };
  await writeFile(`${dir}/${DEMO_TOKEN_DATASET.registration}`, JSON.stringify(registration, null, 2));
}

function demoBytes(n: number, seed: number): Uint8Array {
  const out = new Uint8Array(n);
  let x = (0x9e3779b9 ^ seed) >>> 0;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 0xff;
  }
  return out;
}
