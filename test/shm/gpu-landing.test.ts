import { execFile } from "node:child_process";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";
import { ROOT } from "../helpers/spawn.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";

/**
 * bench/gpu/shm_h2d.py is the README's example of a trainer landing batches in GPU memory from the
 * ring. There is no GPU here: test/shm/python/stub stands in for torch (numpy arrays for device memory,
 * recorded cudaHostRegister calls), and everything else is real — the server, the socket, the ring,
 * the protocol. Debian's python3 with python3-numpy and python3-msgpack (.ci/run installs them).
 */
const PYTHON = process.env.RACKFEED_PYTHON ?? "/usr/bin/python3";
const SCRIPT = join(ROOT, "bench/gpu/shm_h2d.py");
const REG = { sources: [{ prefix: "data/tok/d" }], seq_length: 128, seed: 5, split: "100,0,0", split_index: 0, num_samples: 6000 };
let ws: Workspace;
let rf: RunningServer;
let socketPath: string;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/d", 3000, 20, 400);
  rf = await startServer(ws, [...(await datasetFlags(ws, "d", REG)), "--block-bytes", "8KiB", "--memory-bytes", "4MiB", "--shm-dir", join(ws.dir, "shm")]);
  socketPath = (await (await fetch(`${rf.url}/v1/shm`)).json()).socket;
});
afterAll(async () => {
  await rf?.close();
  await ws?.remove();
});

async function httpBatchHash(step: number, mb: number): Promise<string> {
  const res = await fetch(`${rf.url}/v1/datasets/d/batches/${step}?rank=0&world=1&micro_batch=${mb}`);
  expect(res.status).toBe(200);
  return createHash("sha256").update(new Uint8Array(await res.arrayBuffer())).digest("hex");
}

describe("the GPU landing example (bench/gpu/shm_h2d.py, torch stood in for)", () => {
  it.each(["registered", "pageable"] as const)("lands every batch byte-identical to its HTTP body, in order (%s ring)", async (mode) => {
    const mb = 16;
    const steps = 25;
    const passes = 4; // one untimed and one timed consumer, each over steps 0..99
    const { stdout, stderr } = await promisify(execFile)(PYTHON, [SCRIPT, socketPath, "d", String(mb), String(steps), String(passes), mode, "--hash"], {
      timeout: 60_000,
      env: { ...process.env, PYTHONPATH: join(ROOT, "test/shm/python/stub") },
    });
    const out = JSON.parse(stdout.trim().split("\n").pop()!);
    expect(out.mode).toBe(mode);
    expect(out.batches).toBe(steps * passes);
    expect(out.hashes).toHaveLength(steps * passes);
    for (let s = 0; s < steps * passes; s++) expect(out.hashes[s], `step ${s}`).toBe(await httpBatchHash(s, mb));
    const cuda = JSON.parse(stderr.trim().split("\n").pop()!);
    if (mode === "registered") {
      // Each ring (one per consumer) page-locked once, read-only, whole, and unlocked again.
      expect(out.register_flags).toBe("read-only");
      expect(cuda.registered).toHaveLength(2);
      for (const [bytes, flags] of cuda.registered) {
        expect(flags).toBe(0x08); // cudaHostRegisterReadOnly
        expect(bytes).toBeGreaterThanOrEqual(mb * (REG.seq_length + 1) * 2 * 4);
      }
      expect(cuda.unregistered).toBe(2);
    } else {
      expect(out.register_flags).toBeNull();
      expect(cuda.registered).toEqual([]);
    }
    // The server gave both rings back once the consumers left.
    await expect.poll(async () => Number((await (await fetch(`${rf.url}/metrics`)).text()).match(/^rackfeed_shm_rings (\d+)/m)?.[1])).toBe(0);
  }, 60_000);
});
