/** @module The embedded demo: a small generated local dataset so `npm start` works with no cloud account. */

import { mkdir, stat, writeFile } from "node:fs/promises";

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
  await mkdir(`${dir}/shards`, { recursive: true });
  for (const obj of DEMO_OBJECTS) {
    const path = `${dir}/${obj.key}`;
    const want = obj.key === "hello.txt" ? new TextEncoder().encode(HELLO).length : obj.bytes;
    const have = await stat(path).then((s) => s.size, () => -1);
    if (have === want) continue;
    await writeFile(path, obj.key === "hello.txt" ? HELLO : demoBytes(obj.bytes, obj.key.length));
  }
  return DEMO_OBJECTS;
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
