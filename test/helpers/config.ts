/** @module Test fixtures for configuration: `loadConfig` over in-memory files, and the `ConfigError` a call throws. */

import { expect } from "vitest";
import { type Config, ConfigError, loadConfig } from "../../src/config/load.ts";

/** `loadConfig` with cwd `/srv`, the given environment, and `files` as the only readable files. */
export function load(args: string[], env: Record<string, string> = {}, files: Record<string, string> = {}): Config {
  return loadConfig({
    args,
    env,
    cwd: "/srv",
    readTextFile: (p) => {
      if (!(p in files)) throw new Error(`ENOENT: no such file, open '${p}'`);
      return files[p];
    },
  });
}

/** The `ConfigError` `fn` throws (fails the test if it throws anything else, or nothing). */
export function errorOf(fn: () => unknown): ConfigError {
  try {
    fn();
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return e as ConfigError;
  }
  throw new Error("expected a ConfigError, but nothing was thrown");
}
