import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hostMemoryLimit } from "../../src/runtime/memory-limit.ts";

let root: string;
beforeAll(() => {
  root = mkdtempSync(join(tmpdir(), "rackfeed-memlimit-"));
});
afterAll(() => rmSync(root, { recursive: true, force: true }));

const GiB = 2 ** 30;

/** A directory laid out like `/` with the given files. */
function fakeRoot(name: string, files: Record<string, string>): string {
  const at = join(root, name);
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(at, path)), { recursive: true });
    writeFileSync(join(at, path), text);
  }
  return at;
}

describe("hostMemoryLimit", () => {
  it("takes a cgroup v2 limit below physical memory, from the process's own cgroup", async () => {
    const at = fakeRoot("v2", {
      "/proc/self/cgroup": "0::/kubepods/pod1/c1\n",
      "/sys/fs/cgroup/memory.max": "max\n",
      "/sys/fs/cgroup/kubepods/pod1/c1/memory.max": `${2 * GiB}\n`,
    });
    expect(await hostMemoryLimit({ root: at, totalmem: () => 16 * GiB })).toEqual({ bytes: 2 * GiB, source: "cgroup memory.max" });
  });

  it("takes a cgroup v1 limit, also where the memory controller shares its hierarchy, and ignores v1's 'unlimited'", async () => {
    const at = fakeRoot("v1", {
      "/proc/self/cgroup": "5:cpuacct,cpu:/\n4:memory:/docker/abc\n0::/\n",
      "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
      "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": `${3 * GiB}\n`,
    });
    expect(await hostMemoryLimit({ root: at, totalmem: () => 16 * GiB })).toEqual({ bytes: 3 * GiB, source: "cgroup memory.limit_in_bytes" });
  });

  it("is physical memory where no cgroup limits it, and the mount root's limit in a cgroup namespace", async () => {
    const none = fakeRoot("none", { "/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "max\n" });
    expect(await hostMemoryLimit({ root: none, totalmem: () => 16 * GiB })).toEqual({ bytes: 16 * GiB, source: "physical memory" });
    const ns = fakeRoot("ns", { "/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": `${GiB}\n` });
    expect(await hostMemoryLimit({ root: ns, totalmem: () => 16 * GiB })).toEqual({ bytes: GiB, source: "cgroup memory.max" });
  });

  it("is undefined where nothing can be read", async () => {
    const empty = fakeRoot("empty", {});
    expect(await hostMemoryLimit({ root: empty, totalmem: () => { throw new Error("NotCapable: --allow-sys"); } })).toBeUndefined();
  });
});
