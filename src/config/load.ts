/** @module Turns flags, environment and an optional JSON config file into one validated, frozen `Config` at start-up. */

import { parseArgs } from "node:util";
import { TUNABLES, type TunableKey } from "./defaults.ts";

/** Where an origin's objects live. */
export type OriginSpec =
  | { readonly name: string; readonly kind: "fs"; readonly root: string }
  | { readonly name: string; readonly kind: "s3"; readonly bucket: string; readonly prefix: string };

/** The validated configuration of `rackfeed serve`. Built once; bad input fails here, never per request. */
export interface Config {
  readonly listen: { readonly hostname: string; readonly port: number };
  readonly cacheDir: string;
  readonly memoryBytes: number;
  readonly diskBytes: number;
  readonly blockBytes: number;
  readonly partBytes: number;
  readonly originConcurrency: number;
  readonly originQueue: number;
  readonly readAheadBlocks: number;
  readonly metadataTtl: number;
  readonly diskWriteQueue: number;
  readonly readToken: string | undefined;
  readonly adminToken: string | undefined;
  readonly origins: readonly OriginSpec[];
}

/** What `loadConfig` needs from its surroundings (injected, so tests need no real process). */
export interface ConfigSources {
  /** Arguments after `serve`. */
  readonly args: readonly string[];
  /** Environment variables. */
  readonly env: Readonly<Record<string, string | undefined>>;
  /** Reads a config file; throws if missing. */
  readonly readTextFile: (path: string) => string;
  /** Directory that relative paths are resolved against. */
  readonly cwd: string;
}

/** Raised for any bad configuration; the CLI prints its message and exits 2. */
export class ConfigError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = "ConfigError";
  }
}

const ORIGIN_NAME = /^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$/;

/**
 * Builds the `serve` configuration: defaults, then the config file, then environment, then flags.
 *
 * @param src arguments, environment, file reader and working directory
 * @returns the frozen configuration
 * @throws {ConfigError} naming the flag, variable or field and what was expected
 * @example
 * ```ts
 * const cfg = loadConfig({ args: ["--origin", "data=/srv/data"], env: {}, readTextFile, cwd: "/" });
 * ```
 */
export function loadConfig(src: ConfigSources): Config {
  const options: Record<string, { type: "string"; multiple?: boolean }> = {
    config: { type: "string" },
    origin: { type: "string", multiple: true },
  };
  for (const t of Object.values(TUNABLES)) options[t.flag.slice(2)] = { type: "string" };
  let parsed;
  try {
    parsed = parseArgs({ args: [...src.args], options, strict: true, allowPositionals: false });
  } catch (e) {
    throw new ConfigError(`${(e as Error).message.replace(/\. To specify.*$/s, "")}; see "rackfeed serve --help"`, {
      cause: e,
    });
  }
  const flags = parsed.values as Record<string, string | string[] | undefined>;

  let file: Record<string, unknown> = {};
  const configPath = (flags.config as string | undefined) ?? src.env.RACKFEED_CONFIG;
  if (configPath !== undefined) file = readConfigFile(resolvePath(configPath, src.cwd), src.readTextFile);
  const known = new Set<string>([...Object.keys(TUNABLES), "origins"]);
  for (const k of Object.keys(file)) {
    if (!known.has(k)) {
      throw new ConfigError(
        `Unknown field "${k}" in config file ${configPath}; expected one of: ${[...known].join(", ")}`,
      );
    }
  }

  const values: Record<string, unknown> = {};
  const fromDefault = new Set<string>();
  for (const [key, t] of Object.entries(TUNABLES) as [TunableKey, (typeof TUNABLES)[TunableKey]][]) {
    const candidates: [unknown, string][] = [
      [flags[t.flag.slice(2)], t.flag],
      [src.env[t.env], `environment variable ${t.env}`],
      [file[key], `"${key}" in ${configPath}`],
      [t.default, `default of ${t.flag}`],
    ];
    const hit = candidates.find(([v]) => v !== undefined);
    if (!hit) {
      values[key] = undefined;
      continue;
    }
    const [raw, what] = hit;
    if (hit === candidates[3]) fromDefault.add(key);
    if (typeof raw !== "string" && typeof raw !== "number") {
      throw new ConfigError(`Invalid ${what}: expected a string or number, received ${JSON.stringify(raw)}`);
    }
    try {
      values[key] = t.parse(raw, what);
    } catch (e) {
      throw new ConfigError((e as Error).message, { cause: e });
    }
  }

  const origins = new Map<string, OriginSpec>();
  const fileOrigins = file.origins ?? {};
  if (typeof fileOrigins !== "object" || fileOrigins === null || Array.isArray(fileOrigins)) {
    throw new ConfigError(`Invalid "origins" in ${configPath}: expected an object of NAME: URL`);
  }
  for (const [name, url] of Object.entries(fileOrigins as Record<string, unknown>)) {
    if (typeof url !== "string") {
      throw new ConfigError(`Invalid "origins.${name}" in ${configPath}: expected a URL string`);
    }
    origins.set(name, parseOrigin(name, url, `"origins.${name}" in ${configPath}`, src.cwd));
  }
  for (const spec of (flags.origin as string[] | undefined) ?? []) {
    const eq = spec.indexOf("=");
    if (eq <= 0) throw new ConfigError(`Invalid --origin "${spec}": expected NAME=URL, e.g. data=/srv/datasets`);
    const name = spec.slice(0, eq);
    origins.set(name, parseOrigin(name, spec.slice(eq + 1), `--origin ${name}`, src.cwd));
  }

  // A default part size never exceeds a block the user made smaller; an explicit one must fit.
  if (fromDefault.has("partBytes")) values.partBytes = Math.min(values.partBytes as number, values.blockBytes as number);
  if ((values.partBytes as number) > (values.blockBytes as number)) {
    throw new ConfigError(
      `Invalid --part-bytes: ${values.partBytes} exceeds --block-bytes ${values.blockBytes}; a part is a piece of a block`,
    );
  }
  if ((values.blockBytes as number) > (values.memoryBytes as number)) {
    throw new ConfigError(
      `Invalid --memory-bytes: ${values.memoryBytes} is smaller than one block (--block-bytes ${values.blockBytes})`,
    );
  }

  return Object.freeze({
    ...(values as Omit<Config, "listen" | "origins" | "cacheDir">),
    listen: Object.freeze(parseListen(values.listen as string)),
    cacheDir: resolvePath(values.cacheDir as string, src.cwd),
    origins: Object.freeze([...origins.values()]),
  });
}

function readConfigFile(path: string, read: (p: string) => string): Record<string, unknown> {
  let body: string;
  try {
    body = read(path);
  } catch (e) {
    throw new ConfigError(`Cannot read config file ${path}: ${(e as Error).message}`, { cause: e });
  }
  let json: unknown;
  try {
    json = JSON.parse(body);
  } catch (e) {
    throw new ConfigError(`Cannot parse config file ${path}: ${(e as Error).message}`, { cause: e });
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) {
    throw new ConfigError(`Invalid config file ${path}: expected a JSON object`);
  }
  return json as Record<string, unknown>;
}

/**
 * Parses `HOST:PORT`, `[v6]:PORT` or `:PORT` (loopback).
 *
 * @param text the listen address
 * @returns hostname and port
 * @throws {ConfigError} when the text is not an address
 */
export function parseListen(text: string): { hostname: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]*)):(\d{1,5})$/.exec(text);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) {
    throw new ConfigError(`Invalid --listen "${text}": expected HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080`);
  }
  return { hostname: m[1] ?? (m[2] || "127.0.0.1"), port };
}

function parseOrigin(name: string, url: string, what: string, cwd: string): OriginSpec {
  if (!ORIGIN_NAME.test(name)) {
    throw new ConfigError(
      `Invalid ${what}: origin name "${name}" must be 1-63 letters, digits, "_" or "-", starting with a letter or digit`,
    );
  }
  if (url.startsWith("s3://")) {
    const rest = url.slice(5);
    const slash = rest.indexOf("/");
    const bucket = slash < 0 ? rest : rest.slice(0, slash);
    if (!/^[a-z0-9][a-z0-9.-]{1,62}$/.test(bucket)) {
      throw new ConfigError(`Invalid ${what}: "${url}" does not name an S3 bucket (s3://bucket/prefix)`);
    }
    throw new ConfigError(
      `Invalid ${what}: S3 origins ("${url}") are not available in this build yet; use a filesystem path`,
    );
  }
  let path = url;
  if (url.startsWith("file://")) {
    try {
      path = decodeURIComponent(new URL(url).pathname);
    } catch (e) {
      throw new ConfigError(`Invalid ${what}: "${url}" is not a file:// URL`, { cause: e });
    }
  } else if (/^[a-z][a-z0-9+.-]*:\/\//i.test(url)) {
    throw new ConfigError(`Invalid ${what}: unsupported URL "${url}"; expected s3://bucket/prefix, file:///path or a path`);
  }
  if (path.length === 0) throw new ConfigError(`Invalid ${what}: empty path`);
  return { name, kind: "fs", root: resolvePath(path, cwd) };
}

function resolvePath(p: string, cwd: string): string {
  const abs = p.startsWith("/") ? p : `${cwd.replace(/\/+$/, "")}/${p}`;
  // Normalise "." and ".." so that roots compare reliably with resolved keys later.
  const out: string[] = [];
  for (const seg of abs.split("/")) {
    if (seg === "" || seg === ".") continue;
    if (seg === "..") out.pop();
    else out.push(seg);
  }
  return "/" + out.join("/");
}
