// The native gather under Deno (Deno.dlopen): the same copies as on Node, on this thread and as a nonblocking call.

import assert from "node:assert/strict";
import type { PieceCopier } from "../../../src/batch/piece-copier.ts";
import { countingCopier } from "../../helpers/counting-copier.ts";
import { loadDenoPieceCopier } from "../../../src/runtime/native-gather-deno.ts";

function pattern(n: number): Uint8Array {
  const b = new Uint8Array(n);
  for (let i = 0; i < n; i++) b[i] = (i * 31 + (i >> 8)) & 0xff;
  return b;
}

Deno.test("the native gather loads and copies pieces of views at their offsets, on this thread and on another", async () => {
  const copier = loadDenoPieceCopier();
  assert.ok(copier, "native/build/librackfeed.so did not load (scripts/build-native.mjs builds it)");
  const big = pattern(1 << 16);
  const view = big.subarray(1000, 5000);
  const pieces = new Float64Array([copier.address(view) + 10, 100, 0, copier.address(big) + 60000, 50, 100]);
  const dst = new Uint8Array(150);
  assert.equal(copier.copy(dst, pieces, 0, 2), 150);
  assert.deepEqual(dst.subarray(0, 100), big.subarray(1010, 1110));
  assert.deepEqual(dst.subarray(100), big.subarray(60000, 60050));
  const again = new Uint8Array(150);
  assert.equal(await copier.copyOnThread(again, pieces, 1, 2), 50);
  assert.deepEqual(again.subarray(100), big.subarray(60000, 60050));
  assert.ok(again.subarray(0, 100).every((b) => b === 0));
});

/** A directory with a synthetic token dataset (origin `data`, dataset `p`: 4096-token windows) for `fn`; removed after. */
async function withDatasetDir(fn: (dir: string) => Promise<void>): Promise<void> {
  const { syntheticDataset } = await import("../../helpers/token-data.ts");
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-gather-" });
  try {
    const { idx, bin } = syntheticDataset(300, 500, 6000, 4);
    await Deno.mkdir(`${dir}/origin`);
    await Deno.writeFile(`${dir}/origin/p.idx`, idx);
    await Deno.writeFile(`${dir}/origin/p.bin`, bin);
    await Deno.writeTextFile(`${dir}/p.json`, JSON.stringify({ sources: [{ prefix: "data/p" }], seq_length: 4096, seed: 2, split: "100,0,0", split_index: 0, num_samples: 4000 }));
    await fn(dir);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

/** A server (not listening) over `withDatasetDir`'s dataset, 64 KiB blocks, its cache under `dir/cache-NAME`. */
async function datasetServer(dir: string, name: string, env: { copier?: PieceCopier }) {
  const { loadConfig } = await import("../../../src/config/load.ts");
  const { createServer } = await import("../../../src/server.ts");
  const { oneChunkStream, whenDoneDeno } = await import("../../../src/runtime/deno.ts");
  const config = loadConfig({
    args: ["--listen", "127.0.0.1:0", "--origin", `data=${dir}/origin`, "--cache-dir", `${dir}/cache-${name}`, "--block-bytes", "64KiB", "--dataset", `p=${dir}/p.json`, "--shm-dir", "off"],
    env: {},
    readTextFile: (p) => Deno.readTextFileSync(p),
    cwd: dir,
  });
  const server = await createServer(config, { now: () => performance.now(), log: () => {}, wrapBody: oneChunkStream, whenDone: whenDoneDeno, ...env });
  return { config, server };
}

Deno.test("a Deno server copying natively, large batches on threads, serves the bytes of one copying in JavaScript", async () => {
  const { listenDeno } = await import("../../../src/runtime/deno.ts");
  const copier = loadDenoPieceCopier()!;
  const bodies: Uint8Array[][] = [];
  // Four threads whatever this machine has: a 300-sample batch (2.4 MiB) is cut in four slices.
  const threaded = countingCopier(copier);
  await withDatasetDir(async (dir) => {
    for (const [name, env] of [["native", { copier: threaded }], ["script", {}]] as const) {
      const { config, server } = await datasetServer(dir, name, env);
      const listener = await listenDeno(server.fetch, config.listen);
      try {
        // Concurrent requests, so that slices of several batches are on the threads at once.
        const path = (step: number, mb: number) => `${listener.url}/v1/datasets/p/batches/${step}?rank=0&world=1&micro_batch=${mb}`;
        const jobs = [[0, 300], [1, 300], [2, 8], [5, 300], [40, 8], [3, 300]] as const;
        bodies.push(await Promise.all(jobs.map(async ([step, mb]) => {
          const res = await fetch(path(step, mb));
          assert.equal(res.status, 200);
          return new Uint8Array(await res.arrayBuffer());
        })));
      } finally {
        await listener.close();
        await server.close();
      }
    }
  });
  assert.equal(threaded.calls.onThreads, 4 * 4);
  const [native, script] = bodies;
  for (let i = 0; i < native.length; i++) assert.ok(native[i].length > 0 && native[i].length === script[i].length && native[i].every((b, j) => b === script[i][j]), `batch ${i}`);
});

Deno.test("a group of small batches is copied by one nonblocking call into views of one buffer, as in JavaScript", async () => {
  const { assembleSamples, copyResidentRuns, takeResident } = await import("../../../src/batch/assemble-batch.ts");
  const threaded = countingCopier(loadDenoPieceCopier()!);
  await withDatasetDir(async (dir) => {
    const { server } = await datasetServer(dir, "group", {});
    try {
      const reg = await server.datasets.get("p");
      const firsts = [0, 64, 24, 200];
      const want: Uint8Array[] = [];
      for (const f of firsts) want.push((await assembleSamples(server.cache, reg, f, 8, 2 ** 30)).body.slice());
      const runs = firsts.map((f) => takeResident(server.cache, reg, f, 8, 2 ** 30)!);
      const bytes = want[0].length;
      const buffer = new Uint8Array(5 * bytes).fill(0xee);
      const into = firsts.map((_, i) => buffer.subarray((4 - i) * bytes, (5 - i) * bytes)); // slots in reverse order
      const batches = await copyResidentRuns(threaded, reg, runs, into);
      assert.equal(threaded.calls.onThreads, 1);
      for (let i = 0; i < firsts.length; i++) assert.ok(batches[i].body.every((b, j) => b === want[i][j]), `run ${i}`);
      assert.ok(buffer.subarray(0, bytes).every((b) => b === 0xee));
    } finally {
      await server.close();
    }
  });
});
