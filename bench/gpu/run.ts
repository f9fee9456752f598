// bench/gpu: token batches from rackfeed's shared-memory ring into GPU memory (bench/gpu/shm_h2d.py),
// with the ring page-locked (cudaHostRegister: the copy engine reads the slots directly) and
// pageable, for a token batch (micro_batch 8 × 4097 uint16 = 64 KiB), 1 MiB and 8 MiB batches,
// beside the host-to-device bandwidth of a pinned buffer of the same size measured on the same GPU
// in the same run (the physical limit of any host-to-GPU feed). Rackfeed on Node, warm (every
// block in the memory tier), rings on /dev/shm; t_wait and t_h2d as the trainer sees them.
//
// Needs a CUDA GPU and a python3 with torch, numpy and msgpack (BENCH_PYTHON, default python3).
// Each row: an untimed consumer over STEPS × PASSES batches, then one over the same steps, timed
// as a trainer iterates; its ring's setup (open -> mapped and page-locked) is its own column.
// Run: node --import tsx bench/gpu/run.ts      Knobs: BENCH_PASSES=8, BENCH_PYTHON=python3

import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { makeWorkspace } from "../../test/helpers/rackfeed.ts";
import { NODE, NODE_TS, ROOT, startChild } from "../../test/helpers/spawn.ts";
import { writeTransportDataset } from "../shm/transport-dataset.ts";

const PYTHON = process.env.BENCH_PYTHON ?? "python3";
const PASSES = Number(process.env.BENCH_PASSES ?? 8);
const SIZES = [{ name: "8×4097 (64 KiB)", mb: 8, steps: 400 }, { name: "1 MiB", mb: 128, steps: 150 }, { name: "8 MiB", mb: 1024, steps: 18 }] as const;

interface Figures {
  mode: string;
  batches: number;
  gbps: number;
  ring_setup: number;
  first_wait: number;
  t_wait_p50: number;
  t_wait_p99: number;
  t_h2d_p50: number;
  t_h2d_p99: number;
  pinned_gbps: number;
  pageable_gbps: number;
  register_flags: string | null;
  device: string;
}

const ws = await makeWorkspace();
const shmRoot = mkdtempSync("/dev/shm/rackfeed-gpu-bench-");
try {
  await writeTransportDataset(ws);
  const server = await startChild(NODE, [...NODE_TS, `${ROOT}src/main.node.ts`, "serve", "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`,
    "--cache-dir", `${ws.dir}/c`, "--dataset", `d=${ws.dir}/d.json`, "--read-ahead-seconds", "0", "--shm-dir", shmRoot]);
  try {
    for (const { mb, steps } of SIZES) {
      for (let i = 0; i < steps; i++) {
        const r = await fetch(`${server.url}/v1/datasets/d/batches/${i}?rank=0&world=1&micro_batch=${mb}`);
        if (r.status !== 200) throw new Error(`warm-up batch ${i}: ${r.status} ${await r.text()}`);
        await r.arrayBuffer();
      }
    }
    const { socket } = (await (await fetch(`${server.url}/v1/shm`)).json()) as { socket: string };
    const ms = (s: number) => (s * 1000).toFixed(3);
    let device = "";
    const rows: string[] = [];
    for (const { name, mb, steps } of SIZES) {
      for (const mode of ["registered", "pageable"] as const) {
        const p = spawnSync(PYTHON, [`${ROOT}bench/gpu/shm_h2d.py`, socket, "d", String(mb), String(steps), String(PASSES), mode],
          { encoding: "utf8", timeout: 180_000 });
        if (p.status !== 0) throw new Error(`shm_h2d.py ${mb} ${mode} failed (${p.status ?? p.signal}):\n${p.stderr}\n${p.stdout}`);
        const f = JSON.parse(p.stdout.trim().split("\n").pop()!) as Figures;
        device = f.device;
        const ring = mode === "registered" ? `page-locked ring (${f.register_flags})` : "pageable ring";
        rows.push(`| ${name} | ${ring} | ${f.batches} | ${f.gbps.toFixed(2)} | ${f.pinned_gbps.toFixed(2)} | ${(f.gbps / f.pinned_gbps).toFixed(2)}× | ${f.pageable_gbps.toFixed(2)} | ${ms(f.t_wait_p50)} | ${ms(f.t_wait_p99)} | ${ms(f.t_h2d_p50)} | ${ms(f.t_h2d_p99)} | ${ms(f.ring_setup)} | ${ms(f.first_wait)} |`);
      }
    }
    console.log(`GPU: ${device}; rackfeed on Node, warm, rings in ${shmRoot}; one consumer of STEPS × ${PASSES} batches per row`);
    console.log(`| batch | ring | batches | shm → GPU GB/s | pinned H2D GB/s (limit) | × limit | pageable H2D GB/s | t_wait p50 ms | p99 ms | t_h2d p50 ms | p99 ms | ring setup ms | first t_wait ms |`);
    console.log(`|---|---|---|---|---|---|---|---|---|---|---|---|---|`);
    for (const r of rows) console.log(r);
  } catch (e) {
    console.error(`server output:\n${server.output().slice(-3000)}`);
    throw e;
  } finally {
    await server.stop();
  }
} finally {
  await ws.remove();
  rmSync(shmRoot, { recursive: true, force: true });
}
