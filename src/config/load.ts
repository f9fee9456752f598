/** @module Turns flags, environment and an optional JSON config file into one validated, frozen `Config` at start-up. */

import { createSecureContext } from "node:tls";
import { parseArgs } from "node:util";
import { TUNABLES, type TunableKey } from "./defaults.ts";

/** Where an origin's objects live. */
export type OriginSpec =
  | { readonly name: string; readonly kind: "fs"; readonly root: string }
  | {
    readonly name: string;
    readonly kind: "s3";
    readonly bucket: string;
    /** "" or ending in "/". */
    readonly prefix: string;
    /** Unset: the AWS SDK chain (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`, profile). */
    readonly endpoint?: string;
    /** Unset: the AWS SDK chain (`AWS_REGION`, profile); `us-east-1` when an endpoint is set. */
    readonly region?: string;
    /** Path-style addressing; unset: true when an endpoint is set. */
    readonly forcePathStyle?: boolean;
  };

/** The validated configuration of `rackfeed serve`. Built once; bad input fails here, never per request. */
export interface Config {
  readonly listen: { readonly hostname: string; readonly port: number };
  readonly cacheDir: string;
  readonly memoryBytes: number;
  readonly diskBytes: number;
  readonly blockBytes: number;
  readonly partBytes: number;
  readonly partSizing: "auto" | "fixed";
  readonly originConcurrency: number;
  readonly originConcurrencyMax: number;
  readonly originTargetBandwidth: number;
  readonly originQueue: number;
  readonly readAheadBlocks: number;
  readonly metadataTtl: number;
  readonly originTimeout: number;
  readonly originRetries: number;
  readonly originBackoff: number;
  readonly originBackoffMax: number;
  readonly originHedge: number;
  readonly s3Http: "auto" | "node" | "fetch";
  readonly diskWriteQueue: number;
  readonly readAheadSeconds: number;
  readonly memoryEviction: "belady" | "lru";
  readonly slowBatch: number;
  readonly prefetchPriority: "background" | "normal";
  readonly readAheadMaxSteps: number;
  readonly maxBatchBytes: number;
  readonly batchPoolBytes: number;
  readonly nativeGather: "auto" | "off";
  /** Threads of the native gather; 0: auto (the runtime binding's own count). */
  readonly nativeGatherThreads: number;
  readonly planningThread: "auto" | "on" | "off";
  readonly batchInflightBytes: number;
  readonly objectInflightBytes: number;
  /** Bytes of request bodies received at once, all requests together. */
  readonly requestBodyBytes: number;
  readonly maxIndexBytes: number;
  /** Memory the indexes of all registered datasets (and builds in flight) may take together. */
  readonly datasetIndexBytes: number;
  readonly readToken: string | undefined;
  /** Absolute directory of the shm rings; undefined when the shm path is off. */
  readonly shmDir: string | undefined;
  /**
   * Whether the shm path was asked for (`--shm-dir`, its env var or the config file): then a
   * failure to start it stops the server; with the default it only costs a warning.
   */
  readonly shmRequested: boolean;
  /** Unix socket path of the shm control channel; undefined: chosen from the port once listening. */
  readonly shmSocket: string | undefined;
  readonly shmSlots: number;
  readonly shmSpareRings: number;
  readonly shmBytes: number;
  readonly shutdownGrace: number;
  readonly adminToken: string | undefined;
  /** PEM certificate and key, read at start-up; undefined serves cleartext. */
  readonly tls: { readonly cert: string; readonly key: string } | undefined;
  readonly origins: readonly OriginSpec[];
  /** Datasets registered at start-up (`--dataset NAME=FILE.json`, `"datasets"` in the config file). */
  readonly datasets: readonly DatasetSpec[];
}

/** A dataset to register at start-up: its name, registration body and where it came from. */
export interface DatasetSpec {
  readonly name: string;
  readonly body: unknown;
  /** The flag or config field, for error messages. */
  readonly source: string;
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
  /**
   * Defaults that replace the table's (the demo's smaller budgets): below flags, environment and
   * config file, so they never override what the operator set.
   */
  readonly defaults?: Readonly<Partial<Record<TunableKey, string>>>;
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
    dataset: { type: "string", multiple: true },
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
  const known = new Set<string>([...Object.keys(TUNABLES), "origins", "datasets"]);
  for (const k of Object.keys(file)) {
    if (!known.has(k)) {
      throw new ConfigError(
        `Unknown field "${k}" in config file ${configPath}; expected one of: ${[...known].join(", ")}`,
      );
    }
  }

  const values: Record<string, unknown> = {};
  const fromDefault = new Set<string>();
  /** Where each value came from (a flag, a variable, the config file): named in later errors. */
  const sourceOf: Record<string, string> = {};
  for (const [key, t] of Object.entries(TUNABLES) as [TunableKey, (typeof TUNABLES)[TunableKey]][]) {
    const candidates: [unknown, string][] = [
      [flags[t.flag.slice(2)], t.flag],
      [src.env[t.env], `environment variable ${t.env}`],
      [file[key], `"${key}" in ${configPath}`],
      [src.defaults?.[key] ?? t.default, `default of ${t.flag}`],
    ];
    const hit = candidates.find(([v]) => v !== undefined);
    if (!hit) {
      values[key] = undefined;
      continue;
    }
    const [raw, what] = hit;
    sourceOf[key] = what;
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
  for (const [name, entry] of Object.entries(fileOrigins as Record<string, unknown>)) {
    const what = `"origins.${name}" in ${configPath}`;
    if (typeof entry === "string") {
      origins.set(name, parseOrigin(name, entry, what, src.cwd, src.env));
    } else if (typeof entry === "object" && entry !== null && !Array.isArray(entry)) {
      origins.set(name, parseOriginObject(name, entry as Record<string, unknown>, what, src.cwd, src.env));
    } else {
      throw new ConfigError(
        `Invalid ${what}: expected a URL string or {"url": "s3://bucket/prefix", "endpoint", "region", "forcePathStyle"}`,
      );
    }
  }
  for (const spec of (flags.origin as string[] | undefined) ?? []) {
    const eq = spec.indexOf("=");
    if (eq <= 0) throw new ConfigError(`Invalid --origin "${spec}": expected NAME=URL, e.g. data=/srv/datasets`);
    const name = spec.slice(0, eq);
    origins.set(name, parseOrigin(name, spec.slice(eq + 1), `--origin ${name}`, src.cwd, src.env));
  }

  const datasets = new Map<string, DatasetSpec>();
  const fileDatasets = file.datasets ?? {};
  if (typeof fileDatasets !== "object" || fileDatasets === null || Array.isArray(fileDatasets)) {
    throw new ConfigError(`Invalid "datasets" in ${configPath}: expected an object of NAME: registration (or NAME: "file.json")`);
  }
  for (const [name, body] of Object.entries(fileDatasets as Record<string, unknown>)) {
    const what = `"datasets.${name}" in ${configPath}`;
    datasets.set(name, {
      name,
      body: typeof body === "string" ? readJsonFile(resolvePath(body, src.cwd), src.readTextFile, what) : body,
      source: what,
    });
  }
  for (const spec of (flags.dataset as string[] | undefined) ?? []) {
    const eq = spec.indexOf("=");
    if (eq <= 0) throw new ConfigError(`Invalid --dataset "${spec}": expected NAME=FILE.json, e.g. pile=/etc/rackfeed/pile.json`);
    const name = spec.slice(0, eq);
    const what = `--dataset ${name}`;
    datasets.set(name, { name, body: readJsonFile(resolvePath(spec.slice(eq + 1), src.cwd), src.readTextFile, what), source: what });
  }

  // A default part size never exceeds a block the user made smaller; an explicit one must fit.
  if (fromDefault.has("partBytes")) values.partBytes = Math.min(values.partBytes as number, values.blockBytes as number);
  if ((values.partBytes as number) > (values.blockBytes as number)) {
    throw new ConfigError(
      `Invalid --part-bytes: ${values.partBytes} exceeds --block-bytes ${values.blockBytes}; a part is a piece of a block`,
    );
  }
  // The adaptive ceiling starts at --origin-concurrency: a default maximum below it follows it.
  if (fromDefault.has("originConcurrencyMax")) {
    values.originConcurrencyMax = Math.max(values.originConcurrencyMax as number, values.originConcurrency as number);
  }
  if ((values.originConcurrencyMax as number) < (values.originConcurrency as number)) {
    throw new ConfigError(
      `Invalid --origin-concurrency-max: ${values.originConcurrencyMax} is below --origin-concurrency ${values.originConcurrency}; the limit grows from the one to the other`,
    );
  }
  // A default in-flight bound never refuses a batch that --max-batch-bytes allows.
  if (fromDefault.has("batchInflightBytes")) {
    values.batchInflightBytes = Math.max(values.batchInflightBytes as number, values.maxBatchBytes as number);
  }
  if ((values.batchInflightBytes as number) < (values.maxBatchBytes as number)) {
    throw new ConfigError(
      `Invalid --batch-inflight-bytes: ${values.batchInflightBytes} is below --max-batch-bytes ${values.maxBatchBytes}; the largest batch could never be sent`,
    );
  }
  // The default (1 GiB) holds four of the largest blocks (--block-bytes is at most 256 MiB).
  if ((values.objectInflightBytes as number) < (values.blockBytes as number)) {
    throw new ConfigError(
      `Invalid --object-inflight-bytes: ${values.objectInflightBytes} is below --block-bytes ${values.blockBytes}; no object could be sent`,
    );
  }
  if ((values.blockBytes as number) > (values.memoryBytes as number)) {
    throw new ConfigError(
      `Invalid --memory-bytes: ${values.memoryBytes} is smaller than one block (--block-bytes ${values.blockBytes})`,
    );
  }

  // A block file is the block plus a header (magic, lengths, CRC and the key, up to 4 KiB).
  if ((values.diskBytes as number) < (values.blockBytes as number) + 8192) {
    throw new ConfigError(
      `Invalid --disk-bytes: ${values.diskBytes} cannot hold one block file (--block-bytes ${values.blockBytes} plus its header); the NVMe tier would never store anything`,
    );
  }
  if ((values.tlsCert === undefined) !== (values.tlsKey === undefined)) {
    throw new ConfigError("Invalid TLS configuration: --tls-cert and --tls-key go together; give both or neither");
  }
  let tls: Config["tls"];
  if (values.tlsCert !== undefined) {
    const read = (flag: string, p: string) => {
      const path = resolvePath(p, src.cwd);
      let pem: string;
      try {
        pem = src.readTextFile(path);
      } catch (e) {
        throw new ConfigError(`Invalid ${flag}: cannot read ${path}: ${(e as Error).message}`, { cause: e });
      }
      if (!pem.includes("-----BEGIN")) throw new ConfigError(`Invalid ${flag}: ${path} is not a PEM file`);
      // Checked here for Deno too, whose createSecureContext checks nothing.
      const want = flag === "--tls-cert" ? { block: /-----BEGIN CERTIFICATE-----/, what: "certificate", label: "CERTIFICATE" } : { block: /-----BEGIN [A-Z ]*PRIVATE KEY-----/, what: "private key", label: "PRIVATE KEY" };
      if (!want.block.test(pem)) throw new ConfigError(`Invalid ${flag}: ${path} holds no ${want.what} (expected a PEM "${want.label}" block)`);
      return pem;
    };
    tls = Object.freeze({ cert: read("--tls-cert", values.tlsCert as string), key: read("--tls-key", values.tlsKey as string) });
    try {
      // A PEM that does not parse, or a key that is not the certificate's, fails here (exit 2)
      // rather than in listen, as "cannot listen" (exit 1).
      createSecureContext({ cert: tls.cert, key: tls.key });
    } catch (e) {
      throw new ConfigError(`Invalid --tls-cert/--tls-key (${values.tlsCert}, ${values.tlsKey}): ${(e as Error).message}`, { cause: e });
    }
  }

  return Object.freeze({
    ...(values as Omit<Config, "listen" | "origins" | "cacheDir" | "datasets" | "tls" | "shmDir" | "shmSocket" | "shmRequested">),
    shmRequested: !fromDefault.has("shmDir") || values.shmSocket !== undefined,
    tls,
    shmDir: values.shmDir === "off" ? undefined : resolvePath(values.shmDir as string, src.cwd),
    shmSocket: values.shmSocket === undefined ? undefined : resolvePath(values.shmSocket as string, src.cwd),
    listen: Object.freeze(parseListen(values.listen as string, sourceOf.listen)),
    cacheDir: resolvePath(values.cacheDir as string, src.cwd),
    origins: Object.freeze([...origins.values()]),
    datasets: Object.freeze([...datasets.values()]),
  });
}

function readJsonFile(path: string, read: (p: string) => string, what: string): unknown {
  let text: string;
  try {
    text = read(path);
  } catch (e) {
    throw new ConfigError(`Invalid ${what}: cannot read ${path}: ${(e as Error).message}`, { cause: e });
  }
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new ConfigError(`Invalid ${what}: ${path} is not JSON: ${(e as Error).message}`, { cause: e });
  }
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
 * @param what where it came from (a flag, a variable, the config file), named in the error
 * @returns hostname and port
 * @throws {ConfigError} when the text is not an address
 */
export function parseListen(text: string, what = "--listen"): { hostname: string; port: number } {
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\[\]]*)):(\d{1,5})$/.exec(text);
  const port = m ? Number(m[3]) : NaN;
  if (!m || port > 65535) {
    throw new ConfigError(`Invalid ${what} "${text}": expected HOST:PORT, e.g. 127.0.0.1:8080 or [::1]:8080`);
  }
  return { hostname: m[1] ?? (m[2] || "127.0.0.1"), port };
}

/** Per-origin overrides an S3 origin accepts in the config file. */
const S3_FIELDS = new Set(["url", "endpoint", "region", "forcePathStyle"]);

function parseOriginObject(
  name: string,
  entry: Record<string, unknown>,
  what: string,
  cwd: string,
  env: Readonly<Record<string, string | undefined>>,
): OriginSpec {
  for (const k of Object.keys(entry)) {
    if (!S3_FIELDS.has(k)) throw new ConfigError(`Unknown field "${k}" in ${what}; expected one of: ${[...S3_FIELDS].join(", ")}`);
  }
  if (typeof entry.url !== "string") throw new ConfigError(`Invalid ${what}: "url" must be a string`);
  for (const k of ["endpoint", "region"]) {
    if (entry[k] !== undefined && (typeof entry[k] !== "string" || entry[k] === "")) {
      throw new ConfigError(`Invalid ${what}: "${k}" must be a non-empty string`);
    }
  }
  if (entry.forcePathStyle !== undefined && typeof entry.forcePathStyle !== "boolean") {
    throw new ConfigError(`Invalid ${what}: "forcePathStyle" must be true or false`);
  }
  const endpoint = entry.endpoint as string | undefined;
  if (endpoint !== undefined && !/^https?:\/\/[^/]/.test(endpoint)) {
    throw new ConfigError(`Invalid ${what}: "endpoint" must be an http:// or https:// URL, received "${endpoint}"`);
  }
  const spec = parseOrigin(name, entry.url, what, cwd, {
    ...env,
    ...(endpoint !== undefined ? { AWS_ENDPOINT_URL_S3: endpoint } : {}),
    ...(entry.region !== undefined ? { AWS_REGION: entry.region as string } : {}),
  });
  if (spec.kind !== "s3") {
    if (Object.keys(entry).length > 1) throw new ConfigError(`Invalid ${what}: endpoint, region and forcePathStyle apply to s3:// origins only`);
    return spec;
  }
  return entry.forcePathStyle === undefined ? spec : { ...spec, forcePathStyle: entry.forcePathStyle as boolean };
}

function parseOrigin(
  name: string,
  url: string,
  what: string,
  cwd: string,
  env: Readonly<Record<string, string | undefined>>,
): OriginSpec {
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
    let prefix = slash < 0 ? "" : rest.slice(slash + 1);
    // The prefix names a folder: s3://b/train and s3://b/train/ both serve the keys under train/.
    if (prefix !== "" && !prefix.endsWith("/")) prefix += "/";
    if (prefix.startsWith("/") || prefix.includes("//")) {
      throw new ConfigError(`Invalid ${what}: "${url}" has an empty segment in its prefix`);
    }
    // The SDK reads these too; resolving them here makes the path-style and region defaults
    // for S3-compatible stores explicit, and puts the effective endpoint in the config.
    const endpoint = env.AWS_ENDPOINT_URL_S3 || env.AWS_ENDPOINT_URL || undefined;
    const region = env.AWS_REGION || env.AWS_DEFAULT_REGION || (endpoint ? "us-east-1" : undefined);
    return {
      name,
      kind: "s3",
      bucket,
      prefix,
      ...(endpoint ? { endpoint, forcePathStyle: true } : {}),
      ...(region ? { region } : {}),
    };
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
