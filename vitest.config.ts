import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    exclude: ["test/runtime/deno/**", "node_modules/**"],
    testTimeout: 30_000,
    // A real S3 server (Ceph RGW) on loopback for the S3 suites; see the module's comment.
    globalSetup: ["test/setup/s3-server.ts"],
    hookTimeout: 60_000,
    // Two cores: integration suites start real servers; keep parallelism modest.
    maxWorkers: 2,
  },
});
