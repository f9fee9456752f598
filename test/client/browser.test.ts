import { createHash } from "node:crypto";
import { utimes } from "node:fs/promises";
import { join } from "node:path";
import { build } from "esbuild";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, patternBytes, readMetric, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { ROOT } from "../helpers/spawn.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
const TOKEN = "read-token-for-browser-tests";
const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 128, seed: 5, split: "100,0,0", split_index: 0, num_samples: 2000 };
let ws: Workspace;
let rf: RunningServer;
let browser: Browser;
/** The SDK (`src/client/mod.ts`) bundled for browsers, as a script defining `rackfeed`. */
let sdk: string;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 1500, 50, 600);
  await ws.put("obj.bin", patternBytes(300_000, 4));
  // An old Last-Modified makes the browser cache the answer heuristically (no Cache-Control):
  // the request with a wrong token below must still reach the server (Vary: Authorization).
  const old = new Date("2020-01-01T00:00:00Z");
  await utimes(join(ws.origin, "obj.bin"), old, old);
  rf = await startServer(ws, [...(await datasetFlags(ws, "d", REG)), "--block-bytes", "16KiB", "--read-token", TOKEN]);
  // platform "browser": a Node built-in anywhere in the SDK's imports fails the build here.
  const out = await build({
    entryPoints: [join(ROOT, "src/client/mod.ts")],
    bundle: true,
    platform: "browser",
    format: "iife",
    globalName: "rackfeed",
    write: false,
    logLevel: "silent",
  });
  sdk = out.outputFiles[0].text;
  // Fails loudly (never skips) when Chromium is missing: .ci/run installs the Debian package.
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox", "--disable-gpu"] });
}, 60_000);
afterAll(async () => {
  await browser?.close();
  await rf?.close();
  await ws?.remove();
});

const sha256 = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

describe("the client SDK in a browser (headless Chromium, bundled from src/client/mod.ts)", () => {
  it("reads objects and ranges, iterates batches with the token, and reports t_wait from the page", async () => {
    const page = await browser.newPage();
    try {
      // A page of the server's own origin (rackfeed sends no CORS headers).
      await page.goto(`${rf.url}/healthz`);
      await page.addScriptTag({ content: sdk });
      const before = await (await fetch(`${rf.url}/metrics`)).text();
      const got = await page.evaluate(async ({ url, token }) => {
        const { RackfeedClient, RackfeedError } = (globalThis as unknown as { rackfeed: typeof import("../../src/client/mod.ts") }).rackfeed;
        const hex = async (b: Uint8Array) =>
          [...new Uint8Array(await crypto.subtle.digest("SHA-256", b as Uint8Array<ArrayBuffer>))].map((x) => x.toString(16).padStart(2, "0")).join("");
        const c = new RackfeedClient({ url, token, reportEvery: 1000 });
        const whole = await c.readObject("data", "obj.bin");
        const range = await c.readObject("data", "obj.bin", { start: 16_000, end: 50_000 });
        const steps: { step: number; transport: string; hash: string; rows: number; wait: number; dtype: string }[] = [];
        for await (const b of c.batches("d", { rank: 1, world: 2, microBatch: 4, startStep: 3, endStep: 9, prefetch: 2 })) {
          const bytes = new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength);
          steps.push({ step: b.step, transport: b.transport, hash: await hex(bytes), rows: b.shape[0], wait: b.waitSeconds, dtype: b.dtype });
          c.reportStep(b.step, { t_h2d: 0.001, t_compute: 0.05 });
        }
        await c.close();
        let refused: { name: string; status: number } | undefined;
        try {
          await new RackfeedClient({ url, token: "not-the-token" }).readObject("data", "obj.bin");
        } catch (e) {
          refused = { name: (e as Error).name, status: e instanceof RackfeedError ? e.status : -1 };
        }
        return { whole: await hex(whole), wholeLength: whole.length, range: await hex(range), rangeLength: range.length, steps, refused, ua: navigator.userAgent };
      }, { url: rf.url, token: TOKEN });

      expect(got.ua).toMatch(/Chrome/);
      expect(got.wholeLength).toBe(300_000);
      expect(got.whole).toBe(sha256(patternBytes(300_000, 4)));
      expect(got.rangeLength).toBe(34_000);
      expect(got.range).toBe(sha256(patternBytes(300_000, 4).subarray(16_000, 50_000)));
      expect(got.steps.map((s) => s.step)).toEqual([3, 4, 5, 6, 7, 8]);
      for (const s of got.steps) {
        expect(s).toMatchObject({ transport: "http", rows: 4, dtype: "uint16" });
        expect(s.wait).toBeGreaterThanOrEqual(0);
        const direct = await fetch(`${rf.url}/v1/datasets/d/batches/${s.step}?rank=1&world=2&micro_batch=4`, { headers: { authorization: `Bearer ${TOKEN}` } });
        expect(direct.status).toBe(200);
        expect(s.hash).toBe(sha256(new Uint8Array(await direct.arrayBuffer())));
      }
      expect(got.refused).toEqual({ name: "RackfeedError", status: 401 });
      // The page's timings reached the server: one t_wait and one t_h2d per step.
      const after = await (await fetch(`${rf.url}/metrics`)).text();
      const count = (text: string) => readMetric(text, "rackfeed_t_wait_seconds_count", { dataset: "d" });
      expect(count(after) - count(before)).toBe(6);
      expect(readMetric(after, "rackfeed_t_h2d_seconds_count", { dataset: "d" })).toBe(6);
    } finally {
      await page.close();
    }
  });
});
