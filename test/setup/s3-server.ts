/**
 * @module vitest globalSetup: a real S3 server (Ceph RGW, `scripts/s3/start-rgw.sh`) on loopback
 * for the S3 suites. An endpoint already given in the environment (`S3_ENDPOINT` with
 * `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`S3_BUCKET`, as `.ci/run` exports) is used as is;
 * otherwise the script starts one (reusing a running one) and it is stopped afterwards if this
 * run started it. A failed start is not fatal here: the S3 suites fail loudly with its output
 * (see `test/helpers/s3.ts`), the other suites still run.
 */

import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import type { TestProject } from "vitest/node";

/** What the S3 suites receive through `inject("s3")`. */
export interface S3TestServer {
  readonly endpoint: string;
  readonly accessKeyId: string;
  readonly secretAccessKey: string;
  readonly region: string;
  readonly bucket: string;
}

declare module "vitest" {
  export interface ProvidedContext {
    s3: S3TestServer | { error: string };
  }
}

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const RGW_DIR = process.env.RGW_DIR ?? "/tmp/rackfeed-rgw";

function parseEnv(text: string): Record<string, string> {
  return Object.fromEntries(
    text.split("\n").map((l) => /^([A-Z0-9_]+)=(.*)$/.exec(l.trim())).filter((m) => m !== null).map((m) => [m![1], m![2]]),
  );
}

function fromEnv(env: Record<string, string | undefined>): S3TestServer | undefined {
  if (!env.S3_ENDPOINT || !env.AWS_ACCESS_KEY_ID || !env.AWS_SECRET_ACCESS_KEY || !env.S3_BUCKET) return undefined;
  return {
    endpoint: env.S3_ENDPOINT,
    accessKeyId: env.AWS_ACCESS_KEY_ID,
    secretAccessKey: env.AWS_SECRET_ACCESS_KEY,
    region: env.AWS_REGION ?? "us-east-1",
    bucket: env.S3_BUCKET,
  };
}

export default function setup(project: TestProject): () => void {
  const given = fromEnv(process.env);
  if (given) {
    project.provide("s3", given);
    return () => {};
  }
  const wasRunning = existsSync(`${RGW_DIR}/pids`);
  const t0 = performance.now();
  const r = spawnSync("bash", [`${ROOT}scripts/s3/start-rgw.sh`, "rackfeed-test"], {
    encoding: "utf8",
    timeout: 300_000,
    env: { ...process.env, RGW_DIR },
  });
  const server = r.status === 0 ? fromEnv(parseEnv(r.stdout)) : undefined;
  if (!server) {
    project.provide("s3", {
      error: `scripts/s3/start-rgw.sh failed (exit ${r.status ?? r.signal}${r.error ? `, ${r.error.message}` : ""}):\n` +
        `${(r.stderr ?? "").split("\n").slice(-25).join("\n")}`,
    });
    return () => {};
  }
  console.error(`[s3] RGW ${wasRunning ? "reused" : "started"} at ${server.endpoint} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  project.provide("s3", server);
  return () => {
    // Leave a gateway someone else started (a developer's, or .ci/run's) running.
    if (!wasRunning) spawnSync("bash", [`${ROOT}scripts/s3/stop-rgw.sh`], { env: { ...process.env, RGW_DIR }, stdio: "ignore" });
  };
}
