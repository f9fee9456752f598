import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    exclude: ["test/runtime/deno/**", "node_modules/**"],
    testTimeout: 30_000,
    hookTimeout: 60_000,
    // Two cores: integration suites start real servers; keep parallelism modest.
    maxWorkers: 2,
  },
});
