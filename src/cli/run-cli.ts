/** @module The `rackfeed` command line: `serve`, and the embedded demo when no command is given. */

import { ConfigError, loadConfig } from "../config/load.ts";
import { checkMemoryBudgets } from "../config/memory-check.ts";
import { MIN_GROUP_THREADS } from "../batch/assemble-batch.ts";
import type { MemoryLimit } from "../runtime/memory-limit.ts";
import { ADMIN_USAGE, prefetchCommand, statsCommand } from "./admin-commands.ts";
import { TUNABLES } from "../config/defaults.ts";
import { DEMO_TOKEN_DATASET, ensureDemoDataset } from "../demo/demo-dataset.ts";
import type { ClientGone, Listen, WhenDone } from "../runtime/listener.ts";
import type { IndexBuilder } from "../runtime/index-builder.ts";
import { CacheDirStartupError, createServer, DatasetStartupError, OriginStartupError, type ServerEnv } from "../server.ts";

/** What the CLI needs from the runtime it runs on (built in `runtime/deno.ts` or `runtime/node.ts`). */
export interface CliHost {
  readonly args: readonly string[];
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly cwd: string;
  readonly readTextFile: (path: string) => string;
  readonly listen: Listen;
  readonly now: () => number;
  readonly print: (line: string) => void;
  readonly printError: (line: string) => void;
  /** Registers the graceful-shutdown handler for SIGINT/SIGTERM. */
  readonly onShutdown: (handler: () => void) => void;
  /** e.g. "deno 2.9.6", for the start-up line. */
  readonly runtime: string;
  /** See `ServerEnv.wrapBody`: how this runtime sends one view of cached bytes without a copy. */
  readonly wrapBody?: (bytes: Uint8Array) => BodyInit;
  /** See `ServerEnv.whenDone`: when a response is over (HTTP batch bodies are reused and bounded by it). */
  readonly whenDone?: WhenDone;
  /** See `ServerEnv.clientGone`. */
  readonly clientGone?: ClientGone;
  /** This process's id, and whether another one runs (shm rings of dead servers are removed). */
  readonly pid?: number;
  readonly isAlive?: (pid: number) => boolean;
  /** The memory this process may use (physical, or a container's cgroup limit); budgets over it are refused at start-up. */
  readonly memoryLimit?: () => Promise<MemoryLimit | undefined>;
  /** See `ServerEnv.lockFile`: the cache directory's lock from the kernel. */
  readonly lockFile?: ServerEnv["lockFile"];
  /** See `ServerEnv.fileSystem`: the size of the cache's file system. */
  readonly fileSystem?: ServerEnv["fileSystem"];
  /** Maps a file shared and writable (FFI / koffi); without it rings are written with pwrite. */
  readonly mapFile?: (path: string, bytes: number) => { readonly bytes: Uint8Array; unmap(): void };
  /** See `ServerEnv.copier`: the native gather, where the runtime loads it. */
  readonly copier?: ServerEnv["copier"];
  /** See `ServerEnv.peers`: shm peers' Unix credentials, where the runtime can read them. */
  readonly peers?: ServerEnv["peers"];
  /** See `ServerEnv.buildOffThread`. */
  readonly buildOffThread?: IndexBuilder;
  /** See `ServerEnv.startPlanningThread`. */
  readonly startPlanningThread?: ServerEnv["startPlanningThread"];
  /** See `ServerEnv.cpus`. */
  readonly cpus?: number;
  /** See `ServerEnv.s3HttpAuto`. */
  readonly s3HttpAuto?: ServerEnv["s3HttpAuto"];
  /** See `ServerEnv.s3FetchPool`. */
  readonly s3FetchPool?: ServerEnv["s3FetchPool"];
  /** Where `prefetch --watch` draws its progress bar (stderr when it is a terminal). */
  readonly progressStream?: NodeJS.WritableStream;
}

/** Exit codes: 0 ok, 1 runtime failure, 2 bad usage or configuration. */
export type ExitCode = 0 | 1 | 2;

const USAGE = `Usage:
  rackfeed serve [--config FILE.json] [--listen HOST:PORT] [--origin NAME=URL]...
                 [--cache-dir DIR] [--memory-bytes SIZE] [--disk-bytes SIZE] [--block-bytes SIZE]
                 [--dataset NAME=FILE.json]... [--read-token T] [--admin-token T] [more: see README]
  rackfeed demo  [serve flags]   (also: no command) serve a generated local demo dataset
${ADMIN_USAGE}

  URL: s3://bucket/prefix (endpoint, region, credentials: AWS SDK chain, e.g. AWS_ENDPOINT_URL),
       a path (relative ones from the working directory) or file:///path
  SIZE: bytes or with a unit: 512MiB, 64GiB, 1TB

Options of serve (flag, environment variable, default):
${Object.values(TUNABLES).map((t) => `  ${t.flag.padEnd(22)} ${t.env.padEnd(30)} ${t.default ?? "(unset)"}`).join("\n")}`;

/**
 * Runs one command line. `serve` and `demo` resolve only after a shutdown signal.
 *
 * @param host the runtime's arguments, environment and I/O
 * @returns the process exit code
 */
export async function runCli(host: CliHost): Promise<ExitCode> {
  const [command, ...rest] = host.args;
  if (command === "--help" || command === "-h" || command === "help") {
    host.print(USAGE);
    return 0;
  }
  if (command === undefined || command === "demo" || command.startsWith("--")) {
    return await serve(host, command === "demo" ? rest : host.args, true);
  }
  if (command === "serve") {
    if (wantsHelp(rest)) {
      host.print(USAGE);
      return 0;
    }
    return await serve(host, rest, false);
  }
  if ((command === "prefetch" || command === "stats") && wantsHelp(rest)) {
    host.print(`Usage:\n${ADMIN_USAGE}`);
    return 0;
  }
  if (command === "prefetch") return await prefetchCommand(rest, host);
  if (command === "stats") return await statsCommand(rest, host);
  host.printError(`Unknown command "${command}"; expected serve, demo, prefetch or stats\n\n${USAGE}`);
  return 2;
}

/** Whether a command's arguments ask for its usage. */
function wantsHelp(args: readonly string[]): boolean {
  return args.includes("--help") || args.includes("-h");
}

async function serve(host: CliHost, args: readonly string[], demo: boolean): Promise<ExitCode> {
  let config;
  try {
    const demoArgs = demo ? await demoDefaults(host, args) : [];
    config = loadConfig({
      args: [...demoArgs, ...args],
      env: host.env,
      readTextFile: host.readTextFile,
      cwd: host.cwd,
      // The demo's small budgets are defaults: a flag, variable or config file still wins.
      defaults: demo ? DEMO_BUDGETS : undefined,
    });
  } catch (e) {
    if (e instanceof ConfigError) {
      host.printError(`rackfeed: ${e.message}`);
      return 2;
    }
    throw e;
  }
  if (config.origins.length === 0) {
    host.printError('rackfeed: no origin configured; add --origin NAME=/path (or "origins" in --config)');
    return 2;
  }
  const memory = checkMemoryBudgets(config, await host.memoryLimit?.());
  if (memory.refuse) {
    host.printError(`rackfeed: ${memory.refuse}`);
    return 2;
  }
  if (memory.warn) host.printError(memory.warn);
  const log = (m: string, err?: unknown) => host.printError(err === undefined ? m : `${m}: ${describe(err)}`);
  // Installed before anything starts: a signal while starting (or right after "listening" is
  // printed, which is when supervisors and tests send one) must shut down cleanly, not kill.
  let stopping = false;
  const shutdown = new Promise<void>((resolve) => host.onShutdown(() => {
    stopping = true;
    resolve();
  }));
  // Not even loaded when turned off (on Deno, loading asks for the FFI permission).
  const copier = config.nativeGather === "off" ? undefined : host.copier;
  let server;
  try {
    server = await createServer(config, {
      now: host.now,
      log,
      wrapBody: host.wrapBody,
      whenDone: host.whenDone,
      clientGone: host.clientGone,
      pid: host.pid,
      isAlive: host.isAlive,
      lockFile: host.lockFile,
      fileSystem: host.fileSystem,
      mapFile: host.mapFile,
      copier,
      peers: host.peers,
      buildOffThread: host.buildOffThread,
      startPlanningThread: host.startPlanningThread,
      cpus: host.cpus,
      s3HttpAuto: host.s3HttpAuto,
      s3FetchPool: host.s3FetchPool,
    });
  } catch (e) {
    if (e instanceof DatasetStartupError || e instanceof CacheDirStartupError || e instanceof OriginStartupError) {
      host.printError(`rackfeed: ${e.message}`);
      return 2;
    }
    throw e;
  }
  if (stopping) {
    // Signalled while starting: stop here rather than bind the port, print "listening" and then
    // shut down. (Better still: hand createServer an AbortSignal so the NVMe index rebuild and the
    // configured registrations stop early; today they run to the end first.)
    host.print("rackfeed: stopped while starting");
    await server.close(0);
    return 0;
  }
  let listener;
  try {
    listener = await host.listen(server.fetch, config.listen, config.tls, { queuedBytes: config.batchInflightBytes });
  } catch (e) {
    const why = describe(e);
    // Deno checks a certificate and key only when it listens (Node at start-up, exit 2): a key
    // that is not the certificate's is bad configuration there too, not a port to change.
    if (config.tls && /\b(key|cert|certificate|pem)/i.test(why) && !/EADDRINUSE|EACCES|EADDRNOTAVAIL/.test(why)) {
      host.printError(`rackfeed: Invalid --tls-cert/--tls-key: ${why}`);
      await server.close();
      return 2;
    }
    host.printError(`rackfeed: cannot listen on ${config.listen.hostname}:${config.listen.port}: ${why}; pass --listen HOST:PORT (port 0 picks a free one)`);
    await server.close();
    return 1;
  }
  let shm;
  try {
    shm = await server.startShm(Number(new URL(listener.url).port));
  } catch (e) {
    if (config.shmRequested) {
      host.printError(`rackfeed: ${describe(e)}; or pass --shm-dir off`);
      await listener.close();
      await server.close();
      return 2;
    }
    // The default /dev/shm may be unusable here (Deno without -A treats /dev as special files,
    // a read-only or missing tmpfs): serve HTTP and say how to get the shm path.
    host.printError(`rackfeed: warning: shared-memory path off: ${describe(e)}. Pass --shm-dir DIR to require it (Deno needs -A for sockets under /dev)`);
  }
  host.print(`rackfeed (${host.runtime}) listening on ${listener.url}`);
  if (shm) host.print(`Shared memory: control socket ${shm.socketPath}, rings in ${config.shmDir} (${host.mapFile ? "mapped" : "pwrite"})`);
  const used = server.copier;
  host.print(used
    ? `Batch copies: native gather (memcpy; large batches on up to ${used.threads} threads${used.threads >= MIN_GROUP_THREADS ? ", small shm batches a group of steps at a time on one" : ""})`
    : `Batch copies: JavaScript (${config.nativeGather === "off" ? "--native-gather off" : "native/build/librackfeed.so not built or not loadable: node scripts/build-native.mjs; on Deno, --allow-ffi"})`);
  if (demo) {
    const u = listener.url;
    host.print(`Demo dataset: origin "demo" -> ${config.origins[0].kind === "fs" ? config.origins[0].root : ""}`);
    // With a read token, /v1/ needs it: the lines name a variable, never the token itself.
    const auth = config.readToken === undefined ? "" : ' -H "Authorization: Bearer $RACKFEED_READ_TOKEN"';
    host.print(`Try${auth ? " (with the read token in RACKFEED_READ_TOKEN)" : ""}:`);
    host.print(`  curl${auth} ${u}/v1/objects/demo/hello.txt\n  curl -s${auth} -r 0-15 ${u}/v1/objects/demo/shards/shard-00000.bin | od -A d -t x1`);
    host.print(`  curl -sI${auth} ${u}/v1/objects/demo/shards/shard-00001.bin\n  curl -s${auth} ${u}/v1/datasets/demo`);
    host.print(`  curl -s${auth} '${u}/v1/datasets/demo/batches/0?rank=0&world=2&micro_batch=4' | od -A d -t u2 | head -3`);
    host.print(`  curl -s ${u}/metrics | grep rackfeed_cache`);
  }
  await shutdown;
  host.print("rackfeed: shutting down (draining requests, flushing the disk tier)");
  // A request or fill waiting on an origin that stopped answering must not hold the process:
  // requests get --shutdown-grace, and whatever is left of it goes to fills; the server's own
  // close (shm rings and socket removed, disk writes finished) always runs.
  const deadline = host.now() + config.shutdownGrace;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const answered = await Promise.race([
    listener.close().then(() => true),
    new Promise<false>((r) => (timer = setTimeout(() => r(false), config.shutdownGrace))),
  ]);
  clearTimeout(timer);
  await server.close(Math.max(0, deadline - host.now()));
  if (answered) return 0;
  host.printError(`rackfeed: requests still in flight after --shutdown-grace (${config.shutdownGrace} ms); exiting without them`);
  return 1;
}

/** Flags the demo adds in front of the user's own, so the user's still win. */
async function demoDefaults(host: CliHost, args: readonly string[]): Promise<string[]> {
  const dir = `${host.cwd.replace(/\/+$/, "")}/.rackfeed-demo`;
  await ensureDemoDataset(dir);
  const out = ["--origin", `demo=${dir}`];
  if (!args.includes("--dataset")) out.push("--dataset", `${DEMO_TOKEN_DATASET.name}=${dir}/${DEMO_TOKEN_DATASET.registration}`);
  return out;
}

/** The demo's budgets, as defaults (flags, environment and a config file override them). */
const DEMO_BUDGETS = { memoryBytes: "256MiB", diskBytes: "1GiB" } as const;

function describe(e: unknown): string {
  if (!(e instanceof Error)) return String(e);
  const cause = e.cause instanceof Error ? ` (cause: ${e.cause.message})` : "";
  return `${e.message}${cause}`;
}
