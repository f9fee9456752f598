import { createHash } from "node:crypto";
import { copyFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import fc from "fast-check";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { encodeIndex, estimateIndexMemory, parseDatasetConfig } from "../../src/dataset/mod.ts";
import { putSyntheticDataset, syntheticDataset } from "../helpers/token-data.ts";
import { expectSameBytes, makeWorkspace, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";

const VECTORS = fileURLToPath(new URL("../vectors/megatron/", import.meta.url));
const ADMIN = "admin-token-for-tests";
const cases: { name: string; registration: { sources: { prefix: string }[] }; expected: string }[] =
  JSON.parse(await import("node:fs").then((fs) => fs.readFileSync(join(VECTORS, "cases.json"), "utf8"))).cases;

let ws: Workspace;
let rf: RunningServer;

/** The registration of a vector case with its prefixes moved under origin "data". */
function registration(c: (typeof cases)[number]): unknown {
  return { ...c.registration, sources: c.registration.sources.map((s) => ({ ...s, prefix: `data/${s.prefix}` })) };
}

async function put(name: string, body: unknown, token: string | undefined = ADMIN, url = rf.url): Promise<Response> {
  return await fetch(`${url}/v1/datasets/${name}`, {
    method: "PUT",
    headers: { "content-type": "application/json", ...(token ? { authorization: `Bearer ${token}` } : {}) },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
}

async function samples(name: string, start: number, count: number): Promise<Response> {
  return await fetch(`${rf.url}/v1/datasets/${name}/samples?start=${start}&count=${count}`);
}

beforeAll(async () => {
  ws = await makeWorkspace();
  for (const f of ["pub_u16_a", "pub_u16_c", "pub_i32_b"]) {
    for (const ext of [".idx", ".bin"]) await copyFile(join(VECTORS, "data", f + ext), join(ws.origin, "data", f + ext)).catch(async () => {
      await ws.put(`data/${f}${ext}`, new Uint8Array(0));
      await copyFile(join(VECTORS, "data", f + ext), join(ws.origin, "data", f + ext));
    });
  }
  rf = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "4KiB", "--memory-bytes", "4MiB"]);
  for (const c of cases) expect((await put(c.name, registration(c))).status).toBe(201);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

describe("token datasets are sample-for-sample identical to megatron-core (shared vectors)", () => {
  for (const c of cases) {
    it(`${c.name}: every served window has the expected SHA-256`, async () => {
      const expected = JSON.parse(await import("node:fs").then((fs) => fs.readFileSync(join(VECTORS, c.expected), "utf8")));
      const desc = await (await fetch(`${rf.url}/v1/datasets/${c.name}`)).json();
      const w = expected.window_length as number;
      expect(desc.windowLength).toBe(w);
      const all = createHash("sha256");
      const bad: number[] = [];
      for (let start = 0; start < expected.count; start += 250) {
        const count = Math.min(250, expected.count - start);
        const res = await samples(c.name, start, count);
        expect(res.status).toBe(200);
        expect(res.headers.get("x-rackfeed-shape")).toBe(`${count},${w}`);
        expect(res.headers.get("x-rackfeed-first-sample")).toBe(String(start));
        const dtype = res.headers.get("x-rackfeed-dtype");
        const buf = await res.arrayBuffer();
        expect(res.headers.get("content-length")).toBe(String(buf.byteLength)); // a client can size its buffer up front
        const tokens = dtype === "uint16" ? new Uint16Array(buf) : new Int32Array(buf);
        expect(tokens.length).toBe(count * w);
        const wide = new BigInt64Array(w);
        for (let s = 0; s < count; s++) {
          for (let t = 0; t < w; t++) wide[t] = BigInt(tokens[s * w + t]);
          const bytes = new Uint8Array(wide.buffer);
          all.update(bytes);
          if (createHash("sha256").update(bytes).digest("hex").slice(0, 16) !== expected.window_sha256_16[start + s]) {
            bad.push(start + s);
          }
        }
      }
      expect(bad).toEqual([]);
      expect(all.digest("hex")).toBe(expected.sha256_all_int64le);
    });
  }
});

describe("batches", () => {
  it("tile the sample sequence across steps and ranks with no gap or overlap", async () => {
    const name = "u16_blend_two";
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 1, max: 4 }),
        fc.integer({ min: 1, max: 8 }),
        fc.integer({ min: 0, max: 20 }),
        async (world, micro, step) => {
          const whole = new Uint8Array(await (await samples(name, step * world * micro, world * micro)).arrayBuffer());
          const parts: Uint8Array[] = [];
          for (let rank = 0; rank < world; rank++) {
            const res = await fetch(`${rf.url}/v1/datasets/${name}/batches/${step}?rank=${rank}&world=${world}&micro_batch=${micro}`);
            expect(res.status).toBe(200);
            expect(res.headers.get("x-rackfeed-first-sample")).toBe(String((step * world + rank) * micro));
            parts.push(new Uint8Array(await res.arrayBuffer()));
          }
          expectSameBytes(Buffer.concat(parts), whole);
        },
      ),
      { numRuns: 25 },
    );
  });

  it("returns the same bytes for the same request", async () => {
    const url = `${rf.url}/v1/datasets/u16_one_epoch/batches/7?rank=1&world=2&micro_batch=4`;
    const a = new Uint8Array(await (await fetch(url)).arrayBuffer());
    const b = new Uint8Array(await (await fetch(url)).arrayBuffer());
    expect(a.length).toBe(4 * 129 * 2);
    expectSameBytes(a, b);
  });

  it("answers HEAD with the GET's headers without fetching, copying or counting a step", async () => {
    await putSyntheticDataset(ws, "head_probe", 40, 50, 400, 9);
    const reg = await put("head_probe", { sources: [{ prefix: "data/head_probe" }], seq_length: 64, seed: 3, split: "100,0,0", split_index: 0, num_samples: 200 });
    expect(reg.status, await reg.clone().text()).toBe(201);
    const url = `${rf.url}/v1/datasets/head_probe/batches/3?rank=1&world=2&micro_batch=4`;
    const misses = async () => Number((await (await fetch(`${rf.url}/metrics`)).text()).match(/^rackfeed_cache_misses_total (\d+)/m)![1]);
    const before = await misses();
    const head = await fetch(url, { method: "HEAD" });
    expect(head.status).toBe(200);
    expect(head.headers.get("x-rackfeed-cache")).toBe("miss");
    expect(await misses()).toBe(before); // nothing was fetched
    const get = await fetch(url);
    const body = new Uint8Array(await get.arrayBuffer());
    expect(get.headers.get("x-rackfeed-cache")).toBe("miss");
    for (const h of ["content-length", "x-rackfeed-dtype", "x-rackfeed-shape", "x-rackfeed-first-sample"]) {
      expect(head.headers.get(h), h).toBe(get.headers.get(h));
    }
    expect(Number(head.headers.get("content-length"))).toBe(body.length);
    expect((await fetch(url, { method: "HEAD" })).headers.get("x-rackfeed-cache")).toBe("hit");
    // A HEAD is not a step: the consumer's last step stays the GET's.
    const steps = () => rf.server.readAhead.lookahead().filter((c) => c.dataset === "head_probe").map((c) => c.step);
    expect(steps()).toEqual([3]);
    await fetch(`${rf.url}/v1/datasets/head_probe/batches/9?rank=1&world=2&micro_batch=4`, { method: "HEAD" });
    expect(steps()).toEqual([3]);
  });

  it("answers 416 naming the last step for a step beyond the dataset", async () => {
    const res = await fetch(`${rf.url}/v1/datasets/u16_one_epoch/batches/125?rank=0&world=1&micro_batch=8`);
    expect(res.status).toBe(416);
    expect((await res.json()).message).toMatch(/steps 0-124/);
    // 1000 samples, world 3 × micro_batch 8: 41 full steps. Step 41 would fit rank 0 (samples
    // 984-991) but not ranks 1 and 2: every rank gets the same 416, as over shm and in the SDK.
    for (const rank of [0, 1, 2]) {
      const last = await fetch(`${rf.url}/v1/datasets/u16_one_epoch/batches/41?rank=${rank}&world=3&micro_batch=8`);
      expect(last.status, `rank ${rank}`).toBe(416);
      expect((await last.json()).message).toMatch(/with world=3 and micro_batch=8 it has steps 0-40 \(1000 samples\)/);
      const served = await fetch(`${rf.url}/v1/datasets/u16_one_epoch/batches/40?rank=${rank}&world=3&micro_batch=8`);
      expect(served.status, `rank ${rank}`).toBe(200);
      await served.arrayBuffer();
    }
    const tooBig = await fetch(`${rf.url}/v1/datasets/u16_one_epoch/batches/0?rank=0&world=1&micro_batch=100000`);
    expect(tooBig.status).toBe(416);
    expect((await tooBig.json()).message).toMatch(/it has no full step \(1000 samples\)/);
    const sample = await samples("u16_one_epoch", 1000, 1);
    expect(sample.status).toBe(416);
    // A samples range that starts inside and runs past the end is cut there, as a byte range is.
    const cut = await samples("u16_one_epoch", 998, 5);
    expect(cut.status).toBe(200);
    expect(cut.headers.get("x-rackfeed-shape")).toMatch(/^2,\d+$/);
    expect((await cut.arrayBuffer()).byteLength).toBe(2 * Number(cut.headers.get("x-rackfeed-shape")!.split(",")[1]) * 2);
  });

  it("refuses bad query parameters with 400 naming the parameter", async () => {
    const base = `${rf.url}/v1/datasets/u16_one_epoch`;
    for (const [q, msg] of [
      ["batches/0?rank=2&world=2&micro_batch=1", /rank="2"/],
      ["batches/0?rank=0&world=1", /micro_batch/],
      ["batches/x?micro_batch=1", /step "x"/],
      ["samples?start=-1&count=1", /start="-1"/],
      ["samples?start=0&count=0", /count="0"/],
      // Given twice (a proxy appending its own, a client bug): which was meant is a guess.
      ["batches/0?rank=0&world=1&micro_batch=4&micro_batch=abc", /Query parameter "micro_batch" given 2 times \("4", "abc"\): give it once/],
      ["samples?start=0&start=5&count=1", /"start" given 2 times/],
    ] as const) {
      const res = await fetch(`${base}/${q}`);
      expect(res.status, q).toBe(400);
      expect((await res.json()).message, q).toMatch(msg);
    }
    expect((await fetch(`${rf.url}/v1/datasets/nope/samples`)).status).toBe(404);
  });
});

describe("registration", () => {
  it("needs the admin token", async () => {
    expect((await put("x", registration(cases[0]), "")).status).toBe(401);
    expect((await put("x", registration(cases[0]), "wrong-token-123")).status).toBe(401);
    const closed = await startServer(ws);
    try {
      expect((await put("x", registration(cases[0]), ADMIN, closed.url)).status).toBe(403);
    } finally {
      await closed.close();
    }
  });

  it("names the admin token when a server with a read token refuses a registration, whatever token came", async () => {
    const guarded = await startServer(ws, ["--admin-token", ADMIN, "--read-token", "read-token-for-tests"]);
    try {
      for (const token of ["", "wrong-token-123", "read-token-for-tests"]) {
        const res = await put("x", registration(cases[0]), token, guarded.url);
        expect(res.status, token).toBe(401);
        expect((await res.json()).message, token).toMatch(/^Missing or wrong admin token/);
      }
      const read = await fetch(`${guarded.url}/v1/datasets`);
      expect(read.status).toBe(401);
      expect((await read.json()).message).toMatch(/^Missing or wrong read token/);
    } finally {
      await guarded.close();
    }
  });

  it("describes a dataset and lists the registered ones", async () => {
    const d = await (await fetch(`${rf.url}/v1/datasets/u16_blend_two`)).json();
    expect(d).toMatchObject({ name: "u16_blend_two", kind: "blend", dtype: "uint16", numSamples: 2000, windowLength: 65 });
    expect(d.shape).toEqual([2000, 65]);
    const list = await (await fetch(`${rf.url}/v1/datasets`)).json();
    expect(list.datasets).toEqual(expect.arrayContaining(cases.map((c) => c.name)));
  });

  const base = () => registration(cases[0]) as Record<string, unknown>;
  const bad: [string, () => unknown, RegExp][] = [
    ["seq_length < 2", () => ({ ...base(), seq_length: 1 }), /seq_length/],
    ["a weight <= 0", () => ({ ...base(), sources: [{ weight: 0, prefix: "data/data/pub_u16_a" }] }), /weight/],
    ["a split that does not parse", () => ({ ...base(), split: "a,b" }), /split/],
    ["an unknown origin", () => ({ ...base(), sources: [{ prefix: "elsewhere/x" }] }), /sources\[0\]\.prefix.*unknown origin "elsewhere"/],
    ["a missing file", () => ({ ...base(), sources: [{ prefix: "data/data/missing" }] }), /data\/missing\.bin" does not exist/],
    ["a prefix escaping the origin", () => ({ ...base(), sources: [{ prefix: "data/../x" }] }), /sources\[0\]\.prefix/],
    ["a body that is not JSON", () => "{ nope", /JSON/],
  ];
  for (const [what, body, msg] of bad) {
    it(`refuses ${what} with 400 naming the field`, async () => {
      const res = await put("bad", body());
      expect(res.status).toBe(400);
      expect((await res.json()).message).toMatch(msg);
    });
  }

  it("refuses a malformed .idx with 400 naming the file, and keeps serving", async () => {
    const good = encodeIndex({ dtypeCode: 8, lengths: [10, 20] });
    const badMagic = good.slice();
    badMagic[0] ^= 0xff;
    await ws.put("broken/magic.idx", badMagic);
    await ws.put("broken/magic.bin", new Uint8Array(60));
    await ws.put("broken/short.idx", good);
    await ws.put("broken/short.bin", new Uint8Array(10)); // counts need 60 bytes
    const unknownDtype = good.slice();
    unknownDtype[17] = 42;
    await ws.put("broken/dtype.idx", unknownDtype);
    await ws.put("broken/dtype.bin", new Uint8Array(60));
    await ws.put("broken/trunc.idx", good.subarray(0, good.length - 3));
    await ws.put("broken/trunc.bin", new Uint8Array(60));
    for (const f of ["magic", "short", "dtype", "trunc"]) {
      const res = await put("broken", { ...base(), sources: [{ prefix: `data/broken/${f}` }] });
      expect(res.status, f).toBe(400);
      expect((await res.json()).message, f).toContain(`broken/${f}.idx`);
    }
    expect((await samples("u16_one_epoch", 0, 1)).status).toBe(200);
  });

  it("serves the new version of a dataset whose files changed, never a mix", async () => {
    const reg = (prefix: string) => ({ sources: [{ prefix }], seq_length: 64, seed: 9, split: "100,0,0", split_index: 0, num_samples: 50 });
    await copyFile(join(VECTORS, "data", "pub_u16_a.idx"), join(ws.origin, "chg.idx"));
    await copyFile(join(VECTORS, "data", "pub_u16_a.bin"), join(ws.origin, "chg.bin"));
    expect((await put("chg", reg("data/chg"))).status).toBe(201);
    expect((await put("ref", reg("data/data/pub_u16_c"))).status).toBe(201);
    const want = new Uint8Array(await (await samples("ref", 0, 50)).arrayBuffer());
    const before = new Uint8Array(await (await samples("chg", 0, 50)).arrayBuffer());
    expect(Buffer.compare(before, want)).not.toBe(0);
    // Replace both files the safe way (README): each renamed into place, the .bin first.
    const { rename } = await import("node:fs/promises");
    await copyFile(join(VECTORS, "data", "pub_u16_c.bin"), join(ws.origin, "chg.bin.tmp"));
    await copyFile(join(VECTORS, "data", "pub_u16_c.idx"), join(ws.origin, "chg.idx.tmp"));
    await rename(join(ws.origin, "chg.bin.tmp"), join(ws.origin, "chg.bin"));
    await rename(join(ws.origin, "chg.idx.tmp"), join(ws.origin, "chg.idx"));
    let got: Uint8Array | undefined;
    // Until a deadline rather than a count of tries: the rebuild comes after a metadata TTL and a
    // recheck (about 1-2 s), and on a loaded machine each try itself takes longer.
    for (const t0 = Date.now(); Date.now() - t0 < 20_000;) {
      const res = await samples("chg", 0, 50);
      const body = new Uint8Array(await res.arrayBuffer());
      // Until the rebuild lands, an answer is either the old version whole or a refusal.
      if (res.status === 200) expect(Buffer.compare(body, before) === 0 || Buffer.compare(body, want) === 0).toBe(true);
      else expect(res.status).toBe(503);
      if (res.status === 200 && Buffer.compare(body, want) === 0) {
        got = body;
        break;
      }
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(got).toBeDefined();
  });

  it("says why a dataset whose new files fail to build still serves its old version, and recovers once they are fixed", async () => {
    const reg = { sources: [{ prefix: "data/brk" }], seq_length: 64, seed: 9, split: "100,0,0", split_index: 0, num_samples: 50 };
    await copyFile(join(VECTORS, "data", "pub_u16_a.idx"), join(ws.origin, "brk.idx"));
    await copyFile(join(VECTORS, "data", "pub_u16_a.bin"), join(ws.origin, "brk.bin"));
    expect((await put("brk", reg)).status).toBe(201);
    const describe = async () => (await (await fetch(`${rf.url}/v1/datasets/brk`)).json()) as { rebuildError: string | null };
    expect((await describe()).rebuildError).toBeNull();
    const { rename } = await import("node:fs/promises");
    await writeFile(join(ws.origin, "brk.idx.tmp"), "not an index");
    await rename(join(ws.origin, "brk.idx.tmp"), join(ws.origin, "brk.idx"));
    let why: string | null = null;
    await waitFor(async () => (why = (await describe()).rebuildError) !== null, "the failed rebuild to be reported", 20_000);
    expect(why).toMatch(/brk\.idx/);
    await copyFile(join(VECTORS, "data", "pub_u16_a.idx"), join(ws.origin, "brk.idx.tmp"));
    await rename(join(ws.origin, "brk.idx.tmp"), join(ws.origin, "brk.idx"));
    await waitFor(async () => (await describe()).rebuildError === null, "the rebuild to succeed once the files are fixed", 20_000);
    expect((await samples("brk", 0, 50)).status).toBe(200);
  });

  it("registers datasets named on the command line at start-up, and refuses to start on a bad one", async () => {
    await writeFile(join(ws.dir, "good.json"), JSON.stringify(registration(cases[0])));
    const s = await startServer(ws, ["--dataset", `pile=${join(ws.dir, "good.json")}`]);
    try {
      expect((await fetch(`${s.url}/v1/datasets/pile`)).status).toBe(200);
    } finally {
      await s.close();
    }
    await writeFile(join(ws.dir, "bad.json"), JSON.stringify({ ...base(), seq_length: 0 }));
    await expect(startServer(ws, ["--dataset", `pile=${join(ws.dir, "bad.json")}`])).rejects.toThrow(
      /Cannot register dataset "pile" \(--dataset pile\).*seq_length/,
    );
  });
});

describe("index memory (--dataset-index-bytes)", () => {
  const reg = (numSamples: number, more: Record<string, unknown> = {}) => ({
    sources: [{ prefix: "data/mem/a" }], seq_length: 64, seed: 3, split: "100,0,0", split_index: 0, num_samples: numSamples, ...more,
  });
  /** What the catalog counts for `body` (its build: indexes and .idx files), from the same files. */
  const estimate = (body: Record<string, unknown>) => {
    const f = syntheticDataset(2000, 20, 400, 6);
    return estimateIndexMemory({ config: parseDatasetConfig(body), idx: [f.idx], paths: ["data/mem/a.idx"], binSizes: [f.bin.length] }).buildBytes;
  };
  const builds = async (s: RunningServer) => (await s.metric("rackfeed_dataset_builds_total", { thread: "event_loop" })) + (await s.metric("rackfeed_dataset_builds_total", { thread: "worker" }));

  it("refuses with 400 a registration whose indexes would exceed the bound, giving the estimate, the bound and what to change, before building anything, and keeps serving the version before", async () => {
    await putSyntheticDataset(ws, "mem/a", 2000, 20, 400, 6); // ~420 k tokens, a 40 KiB .idx
    const s = await startServer(ws, ["--admin-token", ADMIN, "--dataset-index-bytes", "4MiB"]);
    try {
      expect((await put("m", reg(1000), ADMIN, s.url)).status).toBe(201);
      const before = await builds(s);
      const t0 = performance.now();
      // 5e7 samples: 600 MB of sample indexes, refused before the .idx is even read (1e9, 12 GB, as fast).
      const many = await put("m", reg(5e7), ADMIN, s.url);
      expect(many.status).toBe(400);
      expect(performance.now() - t0).toBeLessThan(2000);
      expect((await many.json()).message).toMatch(
        /^Cannot register dataset "m": its indexes need at least 572\.2 MiB of memory \(6000\d+ bytes: .*50000000 samples.*\), more than the 4 MiB left of --dataset-index-bytes 4 MiB; ask for fewer num_samples.*, or raise --dataset-index-bytes$/,
      );
      // A long seq_length over this small corpus: ~4 700 epochs of its 2 000 documents, a 36 MiB document index.
      const long = await put("m", reg(2000, { seq_length: 1_000_000 }), ADMIN, s.url);
      expect(long.status).toBe(400);
      expect((await long.json()).message).toMatch(/its indexes need ~3\d\.\d MiB of memory .* of document index \(\d+ entries, up to \d{4} epochs.*a shorter seq_length/);
      // A blend of 60 copies of the file: each source reads and parses its own .idx.
      const blend = await put("m", reg(1000, { sources: Array.from({ length: 60 }, () => ({ prefix: "data/mem/a", weight: 1 })) }), ADMIN, s.url);
      expect(blend.status).toBe(400);
      expect((await blend.json()).message).toMatch(/use fewer sources/);
      expect(await builds(s)).toBe(before); // nothing was built
      // The version before serves on, and the refusals hold no memory: a registration that fits replaces it.
      expect((await (await fetch(`${s.url}/v1/datasets/m`)).json()).numSamples).toBe(1000);
      expect((await fetch(`${s.url}/v1/datasets/m/samples?start=999&count=1`)).status).toBe(200);
      expect((await put("m", reg(2000), ADMIN, s.url)).status).toBe(200);
      expect((await (await fetch(`${s.url}/v1/datasets/m`)).json()).numSamples).toBe(2000);
    } finally {
      await s.close();
    }
  });

  it("refuses a rebuild over the bound when a dataset's files grow, and serves the version before, saying why", async () => {
    await putSyntheticDataset(ws, "mem/grow", 2000, 20, 400, 6);
    const s = await startServer(ws, ["--admin-token", ADMIN, "--dataset-index-bytes", "4MiB"]);
    try {
      expect((await put("g", { ...reg(1000), sources: [{ prefix: "data/mem/grow" }] }, ADMIN, s.url)).status).toBe(201);
      const want = new Uint8Array(await (await fetch(`${s.url}/v1/datasets/g/samples?start=0&count=8`)).arrayBuffer());
      // 30 times the corpus: its whole epoch of samples and its .idx need ~7 MiB.
      const { idx, bin } = syntheticDataset(60_000, 20, 400, 7);
      const { rename } = await import("node:fs/promises");
      await writeFile(join(ws.origin, "mem/grow.bin.tmp"), bin);
      await writeFile(join(ws.origin, "mem/grow.idx.tmp"), idx);
      await rename(join(ws.origin, "mem/grow.bin.tmp"), join(ws.origin, "mem/grow.bin"));
      await rename(join(ws.origin, "mem/grow.idx.tmp"), join(ws.origin, "mem/grow.idx"));
      let why: string | null = null;
      await waitFor(async () => (why = (await (await fetch(`${s.url}/v1/datasets/g`)).json()).rebuildError) !== null, "the refused rebuild to be reported", 20_000);
      expect(why).toMatch(/^Cannot rebuild \(its files changed\) dataset "g": its indexes need ~[\d.]+ MiB of memory .* left of --dataset-index-bytes 4 MiB/);
      // Its old .bin is gone: blocks still in memory serve the old version (503 where they are not), never the new files.
      const res = await fetch(`${s.url}/v1/datasets/g/samples?start=0&count=8`);
      if (res.status === 200) expectSameBytes(new Uint8Array(await res.arrayBuffer()), want);
      else expect(res.status).toBe(503);
      expect((await (await fetch(`${s.url}/v1/datasets/g`)).json()).numSamples).toBe(1000);
    } finally {
      await s.close();
    }
  });

  it("holds the bound for all registered datasets together; a replacement is not held to room beside the version it replaces (a file change of a dataset over half the bound could never be rebuilt)", async () => {
    await putSyntheticDataset(ws, "mem/a", 2000, 20, 400, 6);
    const one = estimate(reg(100_000)); // ~1.4 MiB
    const bound = Math.floor((2.5 * one) / 1024); // two fit, not three
    const s = await startServer(ws, ["--admin-token", ADMIN, "--dataset-index-bytes", `${bound}KiB`]);
    try {
      expect((await put("a", reg(100_000), ADMIN, s.url)).status).toBe(201);
      expect((await put("b", reg(100_000), ADMIN, s.url)).status).toBe(201);
      const third = await put("c", reg(100_000), ADMIN, s.url);
      expect(third.status).toBe(400);
      expect((await third.json()).message).toMatch(/left of --dataset-index-bytes [\d.]+ MiB \([\d.]+ MiB of it taken by the 2 datasets registered\)/);
      // Replacing "b" with as large a version: "a" and the new "b" fit; the old "b" goes once it is in.
      expect((await put("b", reg(100_000, { seed: 4 }), ADMIN, s.url)).status).toBe(200);
      expect((await put("c", reg(100_000), ADMIN, s.url)).status).toBe(400); // still two of them
      expect((await put("b", reg(1000), ADMIN, s.url)).status).toBe(200); // a smaller "b"
      expect((await put("c", reg(100_000), ADMIN, s.url)).status).toBe(201); // and then the third fits
      expect((await (await fetch(`${s.url}/v1/datasets`)).json()).datasets.sort()).toEqual(["a", "b", "c"]);
    } finally {
      await s.close();
    }
  });
});
