/** @module Test fixtures: rackfeed started as a real child process (Node through tsx, or Deno). */

import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { fileURLToPath, pathToFileURL } from "node:url";

/** The repository root. */
export const ROOT = fileURLToPath(new URL("../../", import.meta.url));
/** deno as installed by `npm install`. */
export const DENO = `${ROOT}node_modules/.bin/deno`;
/** node itself: with `NODE_TS` in front of a .ts entry it runs TypeScript in this very process (so its pid and RSS are the server's). */
export const NODE = process.execPath;
/** Node flags that load tsx's TypeScript loader. */
export const NODE_TS = ["--import", pathToFileURL(`${ROOT}node_modules/tsx/dist/loader.mjs`).href];

/** A child rackfeed process. */
export interface ChildServer {
  readonly url: string;
  readonly proc: ChildProcess;
  /** Everything printed so far. */
  output(): string;
  /** Resident memory of the process now, in bytes (Linux /proc). */
  rss(): number;
  /** SIGTERM, then waits for exit; resolves with the exit code. */
  stop(): Promise<number | null>;
}

/** Output and exit code of a command that is expected to end by itself. */
export function runToExit(cmd: string, args: string[], cwd = ROOT, timeoutMs = 30_000): Promise<{ code: number | null; out: string }> {
  return new Promise((resolve, reject) => {
    const proc = spawn(cmd, args, { cwd, stdio: ["ignore", "pipe", "pipe"], env: childEnv() });
    let out = "";
    proc.stdout.on("data", (d) => (out += d));
    proc.stderr.on("data", (d) => (out += d));
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`${cmd} ${args.join(" ")} did not exit within ${timeoutMs} ms:\n${out}`));
    }, timeoutMs);
    proc.on("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, out });
    });
  });
}

/** Starts a server command and resolves once it prints `listening on http://...`. */
export function startChild(cmd: string, args: string[], cwd = ROOT, timeoutMs = 60_000): Promise<ChildServer> {
  return new Promise((resolve, reject) => {
    const proc = spawn(cmd, args, { cwd, stdio: ["ignore", "pipe", "pipe"], env: childEnv() });
    let out = "";
    let done = false;
    const exited = new Promise<number | null>((r) => proc.on("exit", (code) => r(code)));
    const timer = setTimeout(() => {
      proc.kill("SIGKILL");
      reject(new Error(`${cmd} did not start within ${timeoutMs} ms:\n${out}`));
    }, timeoutMs);
    const onData = (d: Buffer) => {
      out += d;
      const m = /listening on (https?:\/\/\S+)/.exec(out);
      if (m && !done) {
        done = true;
        clearTimeout(timer);
        resolve({
          url: m[1],
          proc,
          output: () => out,
          rss: () => Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${proc.pid}/status`, "utf8"))?.[1] ?? NaN) * 1024,
          stop: async () => {
            proc.kill("SIGTERM");
            const t = setTimeout(() => proc.kill("SIGKILL"), 10_000);
            const code = await exited;
            clearTimeout(t);
            return code;
          },
        });
      }
    };
    proc.stdout.on("data", onData);
    proc.stderr.on("data", onData);
    proc.on("exit", (code) => {
      if (!done) {
        clearTimeout(timer);
        reject(new Error(`${cmd} exited with ${code} before listening:\n${out}`));
      }
    });
  });
}

function childEnv(): NodeJS.ProcessEnv {
  // Keep the operator's RACKFEED_* settings out of tests; Deno must not try the network.
  const env: NodeJS.ProcessEnv = { ...process.env, DENO_NO_UPDATE_CHECK: "1", NO_COLOR: "1" };
  for (const k of Object.keys(env)) if (k.startsWith("RACKFEED_")) delete env[k];
  return env;
}
