import { existsSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { makeDirs } from "../../src/runtime/make-dirs.ts";

const root = mkdtempSync(join(tmpdir(), "rackfeed-make-dirs-"));
afterAll(() => rmSync(root, { recursive: true, force: true }));

describe.each([
  ["makeDirs", (p: string) => makeDirs(p)],
] as const)("%s", (name, make) => {
  it("makes a directory and its missing parents, and leaves an existing one alone", async () => {
    const deep = join(root, name, "a", "b", "c");
    await make(deep);
    expect(statSync(deep).isDirectory()).toBe(true);
    writeFileSync(join(deep, "kept"), "x");
    await make(deep);
    expect(existsSync(join(deep, "kept"))).toBe(true);
  });

  it("refuses a path that is a file, or under one, saying so", async () => {
    const file = join(root, `${name}-file`);
    writeFileSync(file, "x");
    await expect(make(file)).rejects.toMatchObject({ code: "ENOTDIR", message: `${file} is a file, not a directory` });
    await expect(make(join(file, "sub"))).rejects.toMatchObject({ code: "ENOTDIR" });
  });

  it("fails, rather than loop, where a directory cannot be made under an existing parent (/proc)", async () => {
    await expect(make("/proc/rackfeed-no-such-dir/sub")).rejects.toMatchObject({ code: "ENOENT" });
  });
});
