import { mkdir } from "node:fs/promises";
import { chromium, type Browser } from "playwright-core";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, patternBytes, readMetric, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { ROOT } from "../helpers/spawn.ts";

const ADMIN = "admin-token-for-tests";
const CHROMIUM = process.env.CHROMIUM_PATH ?? "/usr/bin/chromium";
let ws: Workspace;
let rf: RunningServer;
let browser: Browser;

beforeAll(async () => {
  ws = await makeWorkspace();
  for (let i = 0; i < 3; i++) await ws.put(`d/${i}.bin`, patternBytes(150_000, i));
  rf = await startServer(ws, ["--admin-token", ADMIN, "--block-bytes", "64KiB"]);
  // Known traffic: every object read twice (misses, then memory hits), one finished prefetch.
  for (let round = 0; round < 2; round++) {
    for (let i = 0; i < 3; i++) await (await fetch(`${rf.url}/v1/objects/data/d/${i}.bin`)).arrayBuffer();
  }
  const job = await (await fetch(`${rf.url}/prefetch`, {
    method: "POST",
    headers: { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" },
    body: JSON.stringify({ objects: ["data/d/"], tier: "disk" }),
  })).json();
  for (let i = 0; i < 200; i++) {
    const p = await (await fetch(`${rf.url}/prefetch/${job.id}`, { headers: { authorization: `Bearer ${ADMIN}` } })).json();
    if (p.state === "done") break;
    await new Promise((r) => setTimeout(r, 10));
  }
  // Fails loudly (never skips) when Chromium is missing: .ci/run installs the Debian package.
  browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox", "--disable-gpu"] });
}, 60_000);
afterAll(async () => {
  await browser?.close();
  await rf.close();
  await ws.remove();
});

describe("GET /v1/status", () => {
  it("reports the same numbers as /metrics", async () => {
    const s = await (await fetch(`${rf.url}/v1/status`)).json();
    const text = await (await fetch(`${rf.url}/metrics`)).text();
    expect(s.cache.hitRatio).toBeCloseTo(readMetric(text, "rackfeed_cache_hit_ratio"), 10);
    expect(s.cache.tiers.memory.bytes).toBe(readMetric(text, "rackfeed_cache_bytes", { tier: "memory" }));
    expect(s.cache.tiers.disk.blocks).toBe(readMetric(text, "rackfeed_cache_blocks", { tier: "disk" }));
    expect(s.origins[0]).toMatchObject({ name: "data", bytes: readMetric(text, "rackfeed_origin_bytes_total", { origin: "data" }) });
    expect(s.prefetch[0]).toMatchObject({ state: "done", objectsDone: 3 });
  });
});

describe("the dashboard at GET /", () => {
  it("renders in headless Chromium with numbers that match /metrics, and saves a screenshot", async () => {
    const page = await browser.newPage({ viewport: { width: 1280, height: 900 } });
    try {
      await page.goto(`${rf.url}/`);
      await page.waitForSelector("body[data-ready='1']", { timeout: 10_000 });
      const text = await (await fetch(`${rf.url}/metrics`)).text();
      const ratio = Number(await page.getAttribute("#hit-ratio", "data-value"));
      expect(ratio).toBeCloseTo(readMetric(text, "rackfeed_cache_hit_ratio"), 10);
      expect(await page.textContent("#hit-ratio")).toBe(`${(100 * ratio).toFixed(1)}%`);
      expect(Number(await page.getAttribute("#memory-bytes", "data-value"))).toBe(readMetric(text, "rackfeed_cache_bytes", { tier: "memory" }));
      expect(Number(await page.getAttribute("#disk-bytes", "data-value"))).toBe(readMetric(text, "rackfeed_cache_bytes", { tier: "disk" }));
      expect(Number(await page.textContent("#memory-hits"))).toBe(readMetric(text, "rackfeed_cache_hits_total", { tier: "memory" }));
      expect(Number(await page.textContent("#misses"))).toBe(readMetric(text, "rackfeed_cache_misses_total"));
      expect(Number(await page.getAttribute("[data-origin-bytes]", "data-origin-bytes"))).toBe(
        readMetric(text, "rackfeed_origin_bytes_total", { origin: "data" }),
      );
      const job = page.locator("#prefetch tr").nth(1);
      expect(await job.textContent()).toContain("done");
      expect(await job.locator("progress").getAttribute("value")).toBe("450000");
      await mkdir(`${ROOT}test-results`, { recursive: true });
      await page.screenshot({ path: `${ROOT}test-results/dashboard.png`, fullPage: true });
    } finally {
      await page.close();
    }
  });

  it("shows an error line, not a blank page, when the status needs a token it was not given", async () => {
    const guarded = await startServer(ws, ["--read-token", "reader-token-1"]);
    const page = await browser.newPage();
    try {
      await page.goto(`${guarded.url}/`);
      await page.waitForFunction(() => document.getElementById("error")!.textContent !== "", undefined, { timeout: 10_000 });
      expect(await page.textContent("#error")).toMatch(/HTTP 401/);
      await page.goto(`${guarded.url}/?token=reader-token-1`);
      await page.waitForSelector("body[data-ready='1']", { timeout: 10_000 });
    } finally {
      await page.close();
      await guarded.close();
    }
  });
});
