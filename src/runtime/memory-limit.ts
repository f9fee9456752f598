/**
 * @module The memory this process may use: physical memory, or less where a cgroup (a
 * container's memory limit, v1 or v2) says so. Read from /proc and /sys with `node:fs`, which
 * both runtimes provide; undefined where neither can be read (another OS, Deno without
 * --allow-sys).
 */

import { readFile } from "node:fs/promises";
import { totalmem } from "node:os";

/**
 * The cgroup directories to read a limit from, relative to the v2 mount (`/sys/fs/cgroup`) and
 * to a v1 controller's mount: the process's own cgroup where `/proc/self/cgroup` names it, and
 * the mount's root (what a container with its own cgroup namespace sees as its cgroup).
 *
 * @param procSelfCgroup the text of `/proc/self/cgroup`
 * @param controller the v1 controller (`memory`, `cpu`)
 * @returns the directories, "" for a mount's root
 */
export function cgroupDirs(procSelfCgroup: string, controller: string): { readonly v2: readonly string[]; readonly v1: readonly string[] } {
  const v2 = /^0::(\/.*)$/m.exec(procSelfCgroup)?.[1];
  const v1 = new RegExp(`^\\d+:(?:[^:]*,)?${controller}(?:,[^:]*)?:(\\/.*)$`, "m").exec(procSelfCgroup)?.[1];
  return { v2: [...new Set(["", v2 && v2 !== "/" ? v2 : ""])], v1: [...new Set(["", v1 && v1 !== "/" ? v1 : ""])] };
}

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
  const dirs = cgroupDirs((await read("/proc/self/cgroup")) ?? "", "memory");
  for (const dir of dirs.v2) {
    consider(limitOf(await read(`/sys/fs/cgroup${dir}/memory.max`)), `cgroup memory.max`);
  }
  for (const dir of dirs.v1) {
    consider(limitOf(await read(`/sys/fs/cgroup/memory${dir}/memory.limit_in_bytes`)), `cgroup memory.limit_in_bytes`);
  }
  return best;
}
