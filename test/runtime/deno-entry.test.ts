import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectSameBytes, makeWorkspace, rawGet, patternBytes, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { type ChildServer, DENO, ROOT, startChild } from "../helpers/spawn.ts";

const body = patternBytes(3 * 65536 + 77, 9);
let ws: Workspace;
let deno: ChildServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await ws.put("shard.bin", body);
  deno = await startChild(DENO, [
    "run", "-A", `${ROOT}src/main.ts`, "serve",
    "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`, "--cache-dir", ws.cache, "--block-bytes", "64KiB",
  ]);
}, 120_000);
afterAll(async () => {
  await deno?.stop();
  await ws.remove();
});

/**
 * Starts `deno run PERMISSIONS src/main.ts serve` on a terminal (`script`: Deno prompts only
 * there, and a prompt waits for ever), waits for its banner, checks no permission prompt came
 * first, and stops it. Returns what it printed.
 */
async function bannerOnTerminal(permissions: string[], cacheDir: string, shmDir: string): Promise<string> {
  const serve = [
    DENO, "run", ...permissions, `${ROOT}src/main.ts`, "serve",
    "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`, "--cache-dir", cacheDir, "--shm-dir", shmDir,
  ].join(" ");
  const child = spawn("script", ["-qec", serve, "/dev/null"], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d) => (out += String(d)));
  try {
    // The banner's last line (the shared-memory line comes before it), or a prompt.
    await waitFor(() => /Batch copies/.test(out) || /Allow\?/.test(out), "the server's banner, or a prompt", 60_000);
    expect(out).not.toMatch(/Allow\?/);
    return out;
  } finally {
    child.kill("SIGKILL");
    spawnSync("pkill", ["-f", cacheDir]);
  }
}

describe("the Deno entry point (deno run -A src/main.ts serve)", () => {
  it("says it runs on Deno", () => {
    expect(deno.output()).toMatch(/rackfeed \(deno [\d.]+\) listening on/);
  });

  it("serves a range that spans blocks", async () => {
    const res = await fetch(`${deno.url}/v1/objects/data/shard.bin`, { headers: { range: "bytes=65530-131080" } });
    expect(res.status).toBe(206);
    expect(res.headers.get("content-range")).toBe(`bytes 65530-131080/${body.length}`);
    expectSameBytes(new Uint8Array(await res.arrayBuffer()), body.subarray(65530, 131081));
  });

  it("refuses an encoded dot-dot key with 400", async () => {
    // A raw request: fetch would resolve %2e%2e as a dot segment before sending it.
    const res = await rawGet(deno.url, "/v1/objects/data/%2e%2e/secret");
    expect(res.status).toBe(400);
  });

  it("exposes /metrics with origin traffic", async () => {
    const text = await (await fetch(`${deno.url}/metrics`)).text();
    expect(text).toMatch(/rackfeed_origin_requests_total\{origin="data",op="read"\} [1-9]/);
  });
});

describe("the Deno entry with the Docker image's permissions (no -A)", () => {
  const DOCKER_FLAGS = ["--allow-net", "--allow-read", "--allow-write", "--allow-env", "--allow-sys"];

  it("serves HTTP with a warning when the default /dev/shm cannot be used, and /v1/shm says 404", async () => {
    // Deno treats paths under /dev as special files that need -A for a Unix socket.
    const child = await startChild(DENO, [
      "run", ...DOCKER_FLAGS, `${ROOT}src/main.ts`, "serve",
      "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`, "--cache-dir", `${ws.dir}/c-docker`,
    ]);
    try {
      expect(child.output()).toMatch(/warning: shared-memory path off: .*\/dev\/shm/);
      expect((await fetch(`${child.url}/v1/shm`)).status).toBe(404);
      expectSameBytes(new Uint8Array(await (await fetch(`${child.url}/v1/objects/data/shard.bin`)).arrayBuffer()), body);
    } finally {
      await child.stop();
    }
  }, 120_000);

  it("refuses to start when the shm path was asked for explicitly and cannot start", async () => {
    const { runToExit } = await import("../helpers/spawn.ts");
    const { code, out } = await runToExit(DENO, [
      "run", ...DOCKER_FLAGS, `${ROOT}src/main.ts`, "serve",
      "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`, "--cache-dir", `${ws.dir}/c-docker2`, "--shm-dir", "/dev/shm",
    ]);
    expect(code).toBe(2);
    expect(out).toMatch(/Cannot start the shared-memory path on \/dev\/shm\/rackfeed-\d+\.sock: .*or pass --shm-dir off/);
  }, 120_000);
  it("starts with --allow-ffi but without --allow-sys (no peer credentials: shm peers need the token)", async () => {
    const dir = `${ws.dir}/shm-ffi`;
    const child = await startChild(DENO, [
      "run", "--allow-net", "--allow-read", "--allow-write", "--allow-env", "--allow-ffi", `${ROOT}src/main.ts`, "serve",
      "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`, "--cache-dir", `${ws.dir}/c-ffi`, "--shm-dir", dir,
    ]);
    try {
      expect((await fetch(`${child.url}/v1/shm`)).status).toBe(200);
      expectSameBytes(new Uint8Array(await (await fetch(`${child.url}/v1/objects/data/shard.bin`)).arrayBuffer()), body);
    } finally {
      await child.stop();
    }
  }, 120_000);

  it("starts from a terminal with the image's permissions (FFI for its own library only) without stopping at a permission prompt", async () => {
    // `script` gives the server a terminal: Deno prompts only there, and a prompt waits for ever
    // (msgpackr's native addon and libc for ring mappings asked for FFI before).
    const out = await bannerOnTerminal([
      "--allow-net", "--allow-read", "--allow-write", "--allow-env", "--allow-sys", `--allow-ffi=${ROOT}native/build/librackfeed.so`,
    ], `${ws.dir}/c-tty`, `${ws.dir}/shm-tty`);
    expect(out).toMatch(/rings in .* \(pwrite\)/); // no FFI for libc: rings are written, not mapped
  }, 120_000);

  it("starts from a terminal without --allow-sys or --allow-run, beside a dead server's unlocked ring, without stopping at a prompt", async () => {
    // Physical memory (--allow-sys) and the probe of a ring's pid (--allow-run) each prompted.
    const shm = `${ws.dir}/shm-noperm`;
    mkdirSync(shm, { recursive: true });
    writeFileSync(`${shm}/rackfeed-ring-999999-deadbeef-1.ring`, new Uint8Array(4096));
    await bannerOnTerminal(["--allow-net", "--allow-read", "--allow-write", "--allow-env", "--allow-ffi"], `${ws.dir}/c-noperm`, shm);
    // Whose ring it is cannot be told without --allow-run: it is kept, not taken for a dead server's.
    expect(existsSync(`${shm}/rackfeed-ring-999999-deadbeef-1.ring`)).toBe(true);
  }, 120_000);

  it("refuses at start-up, with exit 2 and both flags named, a TLS key that is not the certificate's", async () => {
    const { runToExit } = await import("../helpers/spawn.ts");
    const { selfSignedCert } = await import("../helpers/tls.ts");
    const a = selfSignedCert(ws.dir, "deno-a");
    const b = selfSignedCert(ws.dir, "deno-b");
    const { code, out } = await runToExit(DENO, [
      "run", "-A", `${ROOT}src/main.ts`, "serve", "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`,
      "--cache-dir", `${ws.dir}/c-tls-bad`, "--shm-dir", "off", "--tls-cert", a.cert, "--tls-key", b.key,
    ]);
    expect(code, out).toBe(2);
    expect(out).toMatch(/Invalid --tls-cert\/--tls-key/);
  }, 120_000);

  it("sends every HTTP/2 batch's own bytes under mixed load (Deno reported bodies complete before sending them, and a reused body carried another batch)", async () => {
    const { selfSignedCert } = await import("../helpers/tls.ts");
    const { http2Fetch } = await import("../../src/client/node.ts");
    const { readFileSync } = await import("node:fs");
    const https = await import("node:https");
    const tls = selfSignedCert(ws.dir, "deno-mix");
    const ca = readFileSync(tls.cert, "utf8");
    const child = await startChild(DENO, [
      "run", "-A", `${ROOT}src/main.ts`, "demo", "--listen", "127.0.0.1:0", "--shm-dir", "off",
      "--cache-dir", `${ws.dir}/c-mix`, "--tls-cert", tls.cert, "--tls-key", tls.key,
    ]);
    try {
      const agent = new https.Agent({ keepAlive: true, maxSockets: 4, ca });
      const get = (path: string, headers: Record<string, string> = {}) =>
        new Promise<Buffer>((resolve, reject) =>
          https.get(`${child.url}${path}`, { ca, agent, headers }, (r) => {
            const parts: Buffer[] = [];
            r.on("data", (d: Buffer) => parts.push(d));
            r.on("end", () => resolve(Buffer.concat(parts)));
          }).on("error", reject));
      const reference = await get("/v1/datasets/demo/samples?start=0&count=2000");
      const sample = reference.length / 2000;
      const h2 = http2Fetch({ ca });
      const until = performance.now() + 8000;
      let batches = 0;
      const bad: string[] = [];
      // Batches over HTTP/2 (4 in flight) while HTTP/1.1 keep-alive clients read object ranges.
      const h2worker = async (w: number) => {
        for (let i = 0; performance.now() < until; i++) {
          const rank = w % 2;
          const step = (i * 4 + w) % 500;
          const body = new Uint8Array(await (await h2(`${child.url}/v1/datasets/demo/batches/${step}?rank=${rank}&world=2&micro_batch=2`)).arrayBuffer());
          const first = (step * 2 + rank) * 2;
          batches++;
          if (Buffer.compare(body, reference.subarray(first * sample, (first + 2) * sample)) !== 0) bad.push(`step ${step} rank ${rank}`);
        }
      };
      const h1worker = async () => {
        for (let i = 0; performance.now() < until; i++) await get("/v1/objects/demo/shards/shard-00000.bin", { range: `bytes=${(i * 7919 * 64) % (16 << 20)}-${(i * 7919 * 64) % (16 << 20) + 262_143}` }).catch(() => undefined);
      };
      await Promise.all([0, 1, 2, 3].map(h2worker).concat([h1worker(), h1worker()]));
      agent.destroy();
      expect(batches).toBeGreaterThan(200);
      expect(bad).toEqual([]);
    } finally {
      await child.stop();
    }
  }, 120_000);
});

