import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { TUNABLES } from "../../src/config/defaults.ts";
import { withTunablesTable } from "../../src/config/tunables-doc.ts";

const readme = readFileSync(new URL("../../README.md", import.meta.url), "utf8");

describe("README", () => {
  it("carries the configuration table generated from the defaults table (run `npm run docs:config` if this fails)", () => {
    expect(withTunablesTable(readme)).toBe(readme);
    for (const t of Object.values(TUNABLES)) expect(readme).toContain(`\`${t.flag}\``);
  });

  it("gives the two set-up commands that package.json defines", () => {
    const pkg = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"));
    expect(readme).toMatch(/^npm start\s+#/m);
    expect(readme).toMatch(/^npm test\s+#/m);
    expect(pkg.scripts.test).toBe("bash scripts/test-all.sh");
    expect(pkg.scripts.prestart).toContain("ensure-deps");
  });
});
