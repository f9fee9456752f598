/** @module Runs `bench/shm/client.ts` as a child process on Deno (mapped ring) or Node (pread) and returns its figures. */

import { spawnSync } from "node:child_process";
import { DENO, NODE, NODE_TS, ROOT } from "../../test/helpers/spawn.ts";

/** What `bench/shm/client.ts` prints (`hashes` and `lat` only with `--hash`). */
export interface ShmClientFigures {
  readonly batches: number;
  readonly seconds: number;
  readonly bytes: number;
  readonly p50: number;
  readonly p99: number;
  /** With --continuous: the timed consumer's first t_wait (its ring made, its first batch filled). */
  readonly firstWait?: number;
  /** With --server-pid: the server's main-thread CPU over the timed passes, in ns. */
  readonly serverNs?: number;
  readonly hashes?: string[];
  readonly lat?: number[];
}

/**
 * @param client which runtime runs the SDK
 * @param argv URL DATASET MICRO_BATCH STEPS PASSES [--hash] [--continuous]
 */
export function runShmClient(client: "deno" | "node", argv: string[]): ShmClientFigures {
  const script = `${ROOT}bench/shm/client.ts`;
  const p = client === "deno"
    ? spawnSync(DENO, ["run", "-A", script, ...argv], { encoding: "utf8", timeout: 300_000 })
    : spawnSync(NODE, [...NODE_TS, script, ...argv], { encoding: "utf8", timeout: 300_000 });
  if (p.status !== 0) throw new Error(`shm client (${client}) failed: ${p.stderr}`);
  return JSON.parse(p.stdout.trim().split("\n").pop()!);
}
