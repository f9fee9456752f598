// Deno.test smoke suite: the shared server code under Deno's own HTTP server and file APIs.
// Run with `deno test -A test/runtime/deno/` (part of `npm test`).

import assert from "node:assert/strict";
import { loadConfig } from "../../../src/config/load.ts";
import { listenDeno, oneChunkStream } from "../../../src/runtime/deno.ts";
import { createServer } from "../../../src/server.ts";

function pattern(n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = (i * 31 + (i >> 8)) & 0xff;
  return out;
}

async function withServer(
  args: string[],
  fn: (url: string, dir: string) => Promise<void>,
): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-" });
  await Deno.mkdir(`${dir}/origin`);
  await Deno.writeFile(`${dir}/origin/shard.bin`, pattern(200_000));
  const config = loadConfig({
    args: ["--listen", "127.0.0.1:0", "--origin", `data=${dir}/origin`, "--cache-dir", `${dir}/cache`, ...args],
    env: {},
    readTextFile: (p) => Deno.readTextFileSync(p),
    cwd: dir,
  });
  const server = await createServer(config, { now: () => performance.now(), log: () => {}, wrapBody: oneChunkStream });
  const listener = await listenDeno(server.fetch, config.listen);
  try {
    await fn(listener.url, dir);
  } finally {
    await listener.close();
    await server.close();
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("serves a range spanning three blocks with 206 and content-range", async () => {
  await withServer(["--block-bytes", "64KiB"], async (url) => {
    const res = await fetch(`${url}/v1/objects/data/shard.bin`, { headers: { range: "bytes=65535-131072" } });
    assert.equal(res.status, 206);
    assert.equal(res.headers.get("content-range"), "bytes 65535-131072/200000");
    const got = new Uint8Array(await res.arrayBuffer());
    assert.deepEqual(got, pattern(200_000).subarray(65535, 131073));
  });
});

Deno.test("serves one-block bodies as uncopied stream chunks without damaging the cached block", async () => {
  await withServer(["--block-bytes", "64KiB"], async (url) => {
    for (let round = 0; round < 3; round++) {
      const res = await fetch(`${url}/v1/objects/data/shard.bin`, { headers: { range: "bytes=70000-80000" } });
      assert.equal(res.status, 206);
      assert.equal(res.headers.get("content-length"), "10001");
      assert.deepEqual(new Uint8Array(await res.arrayBuffer()), pattern(200_000).subarray(70000, 80001), `round ${round}`);
    }
  });
});

Deno.test("answers 416 beyond the end and 304 for a matching If-None-Match", async () => {
  await withServer([], async (url) => {
    const beyond = await fetch(`${url}/v1/objects/data/shard.bin`, { headers: { range: "bytes=200000-" } });
    assert.equal(beyond.status, 416);
    await beyond.body?.cancel();
    const first = await fetch(`${url}/v1/objects/data/shard.bin`, { method: "HEAD" });
    const etag = first.headers.get("etag")!;
    const again = await fetch(`${url}/v1/objects/data/shard.bin`, { headers: { "if-none-match": etag } });
    assert.equal(again.status, 304);
    await again.body?.cancel();
  });
});

Deno.test("keeps the warm cache across a restart on Deno's file APIs", async () => {
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-warm-" });
  try {
    await Deno.mkdir(`${dir}/origin`);
    await Deno.writeFile(`${dir}/origin/a.bin`, pattern(150_000));
    const config = loadConfig({
      args: ["--origin", `data=${dir}/origin`, "--cache-dir", `${dir}/cache`, "--block-bytes", "64KiB"],
      env: {},
      readTextFile: (p) => Deno.readTextFileSync(p),
      cwd: dir,
    });
    for (const round of [0, 1]) {
      const server = await createServer(config, { now: () => performance.now(), log: () => {} });
      const res = await server.fetch(new Request("http://x/v1/objects/data/a.bin"));
      assert.deepEqual(new Uint8Array(await res.arrayBuffer()), pattern(150_000));
      const reads = server.origins.get("data")!.stats().requests.read;
      assert.equal(reads, round === 0 ? 3 : 0, `origin reads in round ${round}`);
      await server.close();
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the client SDK reads objects and iterates batches on Deno", async () => {
  const { RackfeedClient } = await import("../../../src/client/mod.ts");
  const { encodeIndex } = await import("../../../src/dataset/mod.ts");
  await withServer(["--admin-token", "deno-admin-token"], async (url, dir) => {
    const lengths = Array.from({ length: 50 }, (_, i) => 100 + i * 7);
    const tokens = lengths.reduce((a, b) => a + b, 0);
    await Deno.writeFile(`${dir}/origin/t.idx`, encodeIndex({ dtypeCode: 8, lengths }));
    await Deno.writeFile(`${dir}/origin/t.bin`, new Uint8Array(new Uint16Array(tokens).map((_, i) => i % 5000).buffer));
    const put = await fetch(`${url}/v1/datasets/t`, {
      method: "PUT",
      headers: { authorization: "Bearer deno-admin-token" },
      body: JSON.stringify({ sources: [{ prefix: "data/t" }], seq_length: 32, seed: 1, split: "100,0,0", split_index: 0, num_samples: 100 }),
    });
    assert.equal(put.status, 201);
    const c = new RackfeedClient({ url });
    assert.deepEqual(await c.readObject("data", "shard.bin", { start: 1, end: 4 }), pattern(200_000).subarray(1, 4));
    const steps: number[] = [];
    for await (const b of c.batches("t", { rank: 0, world: 1, microBatch: 4, endStep: 5 })) {
      steps.push(b.step);
      assert.equal(b.tokens.length, 4 * 33);
    }
    assert.deepEqual(steps, [0, 1, 2, 3, 4]);
    await c.close();
  });
});
