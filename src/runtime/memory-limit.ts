/**
 * @module The memory this process may use: physical memory, or less where a cgroup (a
 * container's memory limit, v1 or v2) says so. Read from /proc and /sys with `node:fs`, which
 * both runtimes provide; undefined where neither can be read (another OS, Deno without
 * --allow-sys).
 */

import { readFile } from "node:fs/promises";
import { totalmem } from "node:os";

/** A memory limit and where it comes from, for messages. */
export interface MemoryLimit {
  readonly bytes: number;
  readonly source: string;
}

/** Where to look; tests point `root` at a directory laid out like `/`. */
export interface MemoryLimitSources {
  readonly root?: string;
  readonly totalmem?: () => number;
}

/**
 * The smallest of physical memory and the memory limits of this process's cgroups.
 *
 * @returns the limit, or undefined when nothing could be read
 */
export async function hostMemoryLimit(sources: MemoryLimitSources = {}): Promise<MemoryLimit | undefined> {
  const root = sources.root ?? "";
  let best: MemoryLimit | undefined;
  const consider = (bytes: number | undefined, source: string) => {
    if (bytes !== undefined && Number.isFinite(bytes) && bytes > 0 && (!best || bytes < best.bytes)) best = { bytes, source };
  };
  try {
    consider((sources.totalmem ?? totalmem)(), "physical memory");
  } catch {
    // Deno without --allow-sys
  }
  const read = (path: string) => readFile(`${root}${path}`, "utf8").then((t) => t.trim(), () => undefined);
  // "max" (v2) and v1's huge "unlimited" value are no limit.
  const limitOf = (text: string | undefined) => {
    if (text === undefined || !/^\d+$/.test(text)) return undefined;
    const n = Number(text);
    return n >= 2 ** 62 ? undefined : n;
  };
  // The process's own cgroup where /proc names it, and the mount's root (what a container with
  // its own cgroup namespace sees as its cgroup).
  const cgroups = (await read("/proc/self/cgroup")) ?? "";
  const v2 = /^0::(\/.*)$/m.exec(cgroups)?.[1];
  const v1 = /^\d+:(?:[^:]*,)?memory(?:,[^:]*)?:(\/.*)$/m.exec(cgroups)?.[1];
  for (const dir of new Set(["", v2 && v2 !== "/" ? v2 : ""])) {
    consider(limitOf(await read(`/sys/fs/cgroup${dir}/memory.max`)), `cgroup memory.max`);
  }
  for (const dir of new Set(["", v1 && v1 !== "/" ? v1 : ""])) {
    consider(limitOf(await read(`/sys/fs/cgroup/memory${dir}/memory.limit_in_bytes`)), `cgroup memory.limit_in_bytes`);
  }
  return best;
}
