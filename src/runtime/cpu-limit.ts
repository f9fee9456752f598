/**
 * @module The CPUs this process may keep busy: the host's (or its affinity mask's), or fewer
 * where a cgroup's CPU quota (a container's `--cpus`, v1 or v2) says so. The runtimes' own
 * counts (`availableParallelism`, `navigator.hardwareConcurrency`) ignore quotas, so a container
 * given 2 CPUs on a 64-core host would start threads (copy threads, the planning thread) for 64.
 * Read from /proc and /sys with `node:fs`; the runtime's count where nothing can be read.
 */

import { readFileSync } from "node:fs";
import { cgroupDirs } from "./memory-limit.ts";

/** Where to look; tests point `root` at a directory laid out like `/`. */
export interface CpuLimitSources {
  /** A directory laid out like `/` to read /proc and /sys under (tests); default "" (the real root). */
  readonly root?: string;
  /** The runtime's own count of CPUs. */
  readonly cpus: () => number;
}

/**
 * The smaller of the runtime's CPU count and this process's cgroup CPU quota (rounded down, at
 * least 1).
 *
 * @param sources the runtime's CPU count, and where to read the cgroup files
 * @returns whole CPUs
 * @example
 * ```ts
 * const cpus = cpuLimit({ cpus: availableParallelism });
 * ```
 */
export function cpuLimit(sources: CpuLimitSources): number {
  const root = sources.root ?? "";
  let cpus = 1;
  try {
    cpus = Math.max(1, Math.floor(sources.cpus()));
  } catch {
    // Deno without --allow-sys: one, as the runtimes answer when they cannot tell
  }
  const read = (path: string): string | undefined => {
    try {
      return readFileSync(`${root}${path}`, "utf8").trim();
    } catch {
      return undefined;
    }
  };
  const consider = (quota: number, period: number) => {
    if (Number.isFinite(quota) && Number.isFinite(period) && quota > 0 && period > 0) cpus = Math.min(cpus, Math.max(1, Math.floor(quota / period)));
  };
  const dirs = cgroupDirs(read("/proc/self/cgroup") ?? "", "cpu");
  for (const dir of dirs.v2) {
    // "max 100000" is no quota.
    const m = /^(\d+) (\d+)$/.exec(read(`/sys/fs/cgroup${dir}/cpu.max`) ?? "");
    if (m) consider(Number(m[1]), Number(m[2]));
  }
  for (const dir of dirs.v1) {
    for (const mount of ["cpu", "cpu,cpuacct"]) {
      // -1 is no quota.
      const quota = Number(read(`/sys/fs/cgroup/${mount}${dir}/cpu.cfs_quota_us`));
      const period = Number(read(`/sys/fs/cgroup/${mount}${dir}/cpu.cfs_period_us`));
      consider(quota, period);
    }
  }
  return cpus;
}
