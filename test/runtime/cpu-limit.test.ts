import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { cpuLimit } from "../../src/runtime/cpu-limit.ts";

let root: string;
afterEach(() => rmSync(root, { recursive: true, force: true }));

/** A directory laid out like `/` with these files. */
function fakeRoot(files: Record<string, string>): string {
  root = mkdtempSync(join(tmpdir(), "rackfeed-cpu-"));
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(root, path)), { recursive: true });
    writeFileSync(join(root, path), text);
  }
  return root;
}

describe("cpuLimit", () => {
  it("takes a cgroup v2 quota (a container's --cpus 2.5) below the host's CPUs, rounded down", () => {
    expect(cpuLimit({ root: fakeRoot({ "/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/cpu.max": "250000 100000\n" }), cpus: () => 64 })).toBe(2);
  });

  it("reads the process's own cgroup v2 and ignores no quota ('max')", () => {
    const r = fakeRoot({
      "/proc/self/cgroup": "0::/system.slice/trainer.service\n",
      "/sys/fs/cgroup/cpu.max": "max 100000\n",
      "/sys/fs/cgroup/system.slice/trainer.service/cpu.max": "400000 100000\n",
    });
    expect(cpuLimit({ root: r, cpus: () => 16 })).toBe(4);
  });

  it("takes a cgroup v1 quota, and ignores -1 (no quota)", () => {
    expect(cpuLimit({
      root: fakeRoot({
        "/proc/self/cgroup": "4:cpu,cpuacct:/docker/abc\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
        "/sys/fs/cgroup/cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
      }),
      cpus: () => 8,
    })).toBe(1);
    expect(cpuLimit({
      root: fakeRoot({ "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1\n", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000\n" }),
      cpus: () => 8,
    })).toBe(8);
  });

  it("keeps the runtime's count where it is smaller or nothing can be read, and never answers 0", () => {
    expect(cpuLimit({ root: fakeRoot({ "/sys/fs/cgroup/cpu.max": "1600000 100000" }), cpus: () => 4 })).toBe(4);
    expect(cpuLimit({ root: fakeRoot({}), cpus: () => 6 })).toBe(6);
    expect(cpuLimit({ root: fakeRoot({ "/sys/fs/cgroup/cpu.max": "50000 100000" }), cpus: () => 6 })).toBe(1);
    expect(cpuLimit({ root: fakeRoot({}), cpus: () => { throw new Error("no --allow-sys"); } })).toBe(1);
  });
});
