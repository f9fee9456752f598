/** @module `rackfeed prefetch` and `rackfeed stats`: operator commands that talk to a running server over HTTP. */

import { parseArgs } from "node:util";
import cliProgress from "cli-progress";
import { formatBytes } from "../config/size.ts";
import type { PrefetchProgress } from "../prefetch/prefetch-jobs.ts";

/** What the admin commands need from the runtime. */
export interface AdminHost {
  readonly env: Readonly<Record<string, string | undefined>>;
  readonly print: (line: string) => void;
  readonly printError: (line: string) => void;
  /** A TTY-like stream for the progress bar (stderr), or undefined to print plain lines. */
  readonly progressStream?: NodeJS.WritableStream;
  readonly fetch?: typeof fetch;
}

/** Usage of the admin commands. */
export const ADMIN_USAGE = `  rackfeed prefetch --server URL ((--objects ORIGIN/PREFIX)... | --dataset NAME --steps A:B
                    --micro-batch B [--rank R] [--world W]) [--tier disk|memory] [--watch]
                    [--admin-token T]   (or RACKFEED_ADMIN_TOKEN)     steps A to B-1
  rackfeed stats    --server URL [--read-token T]   hit rate per tier, tier usage, origin traffic, consumers`;

class UsageError extends Error {}

/** A failure's message with its cause's: fetch says only "fetch failed", its cause why (ECONNREFUSED, a certificate). */
function withCause(e: unknown): string {
  const err = e as Error;
  return err.cause instanceof Error ? `${err.message} (${err.cause.message})` : String(err?.message ?? e);
}

/**
 * `rackfeed prefetch`: starts a warm job; with `--watch`, follows its progress until it ends.
 *
 * @returns 0 when the job was started (or, with --watch, finished), 1 when it failed or was
 *   cancelled, 2 on bad usage
 */
export async function prefetchCommand(args: readonly string[], host: AdminHost): Promise<0 | 1 | 2> {
  let v;
  try {
    v = parseArgs({
      args: [...args],
      strict: true,
      options: {
        server: { type: "string" },
        objects: { type: "string", multiple: true },
        dataset: { type: "string" },
        steps: { type: "string" },
        rank: { type: "string" },
        world: { type: "string" },
        "micro-batch": { type: "string" },
        tier: { type: "string" },
        watch: { type: "boolean" },
        "admin-token": { type: "string" },
      },
    }).values;
    if (!v.server) throw new UsageError("--server URL is required, e.g. --server http://127.0.0.1:8080");
    if (!v.objects === !v.dataset) throw new UsageError("give either --objects ORIGIN/PREFIX... or --dataset NAME --steps A:B");
  } catch (e) {
    host.printError(`rackfeed prefetch: ${(e as Error).message.replace(/\. To specify.*$/s, "")}\n\n${ADMIN_USAGE}`);
    return 2;
  }
  const body: Record<string, unknown> = { tier: v.tier ?? "disk" };
  try {
    if (v.objects) {
      body.objects = v.objects;
    } else {
      const m = /^(\d+):(\d+)$/.exec(v.steps ?? "");
      if (!m) throw new UsageError(`--steps must be A:B (steps A to B-1), received "${v.steps ?? ""}"`);
      Object.assign(body, {
        dataset: v.dataset,
        steps: [Number(m[1]), Number(m[2])],
        rank: intFlag("--rank", v.rank, 0),
        world: intFlag("--world", v.world, 1),
        micro_batch: intFlag("--micro-batch", v["micro-batch"], undefined),
      });
    }
  } catch (e) {
    host.printError(`rackfeed prefetch: ${(e as Error).message}`);
    return 2;
  }
  const token = v["admin-token"] ?? host.env.RACKFEED_ADMIN_TOKEN;
  const headers: Record<string, string> = { "content-type": "application/json" };
  if (token) headers.authorization = `Bearer ${token}`;
  const doFetch = host.fetch ?? fetch;
  const server = v.server.replace(/\/+$/, "");
  let res: Response;
  try {
    res = await doFetch(`${server}/prefetch`, { method: "POST", headers, body: JSON.stringify(body) });
  } catch (e) {
    host.printError(`rackfeed prefetch: cannot reach ${server}: ${withCause(e)}`);
    return 1;
  }
  const job = await res.json().catch(() => ({})) as PrefetchProgress & { message?: string };
  if (res.status !== 202) {
    const hint = res.status === 401 ? " (pass --admin-token T or set RACKFEED_ADMIN_TOKEN)" : "";
    host.printError(`rackfeed prefetch: the server answered ${res.status}: ${job.message ?? res.statusText}${hint}`);
    return res.status >= 500 ? 1 : 2;
  }
  const size = job.state === "queued" && job.blocksTotal === 0
    ? "still planning (listing and stat'ing objects)"
    : `${formatBytes(job.bytesTotal)} in ${job.blocksTotal} blocks`;
  host.print(`prefetch ${job.id}: ${job.what} → ${job.tier} tier, ${size}`);
  if (!v.watch) {
    host.print(`follow it: GET ${server}/prefetch/${job.id} (its events: curl -N -H 'Authorization: Bearer …' ${server}/prefetch/${job.id}/events); next time add --watch`);
    return 0;
  }
  let last: PrefetchProgress | undefined;
  try {
    last = await watch(doFetch, `${server}/prefetch/${job.id}/events`, headers, host);
  } catch (e) {
    // The server went away (or the stream broke) while we watched: say so, not a stack trace.
    host.printError(`rackfeed prefetch: lost ${server} while watching job ${job.id}: ${(e as Error).message}; the job may still run (GET ${server}/prefetch/${job.id})`);
    return 1;
  }
  if (!last) {
    host.printError("rackfeed prefetch: the event stream ended before the job did");
    return 1;
  }
  host.print(summary(last));
  return last.state === "done" ? 0 : 1;
}

async function watch(
  doFetch: typeof fetch,
  url: string,
  headers: Record<string, string>,
  host: AdminHost,
): Promise<PrefetchProgress | undefined> {
  const res = await doFetch(url, { headers });
  if (!res.ok || !res.body) return undefined;
  const bar = host.progressStream
    ? new cliProgress.SingleBar({
      stream: host.progressStream,
      // Not {total}: cli-progress fills that name with the raw byte count itself.
      format: "{bar} {percentage}% | {done}/{total_text} | {rate}/s | ETA {eta_text} | {state}",
      hideCursor: true,
    }, cliProgress.Presets.shades_classic)
    : undefined;
  let last: PrefetchProgress | undefined;
  const decoder = new TextDecoder();
  let buffered = "";
  try {
    await readEvents();
  } finally {
    bar?.stop();
  }
  return last && ["done", "failed", "cancelled"].includes(last.state) ? last : undefined;

  async function readEvents(): Promise<void> {
    for await (const chunk of res.body as unknown as AsyncIterable<Uint8Array>) {
      buffered += decoder.decode(chunk, { stream: true });
      let cut;
      while ((cut = buffered.indexOf("\n\n")) >= 0) {
        const event = buffered.slice(0, cut);
        buffered = buffered.slice(cut + 2);
        const data = event.split("\n").find((l) => l.startsWith("data: "));
        if (!data) continue;
        const p = JSON.parse(data.slice(6)) as PrefetchProgress;
        const values = {
          done: formatBytes(p.bytesDone),
          total_text: formatBytes(p.bytesTotal),
          rate: formatBytes(Math.round(p.rate)),
          eta_text: p.etaSeconds === null ? "?" : `${p.etaSeconds.toFixed(1)}s`,
          state: p.state,
        };
        if (bar) {
          if (!last) bar.start(Math.max(1, p.bytesTotal), p.bytesDone, values);
          else {
            // A job planned in the background learns its total after it started.
            if (p.bytesTotal !== last.bytesTotal) bar.setTotal(Math.max(1, p.bytesTotal));
            bar.update(p.bytesDone, values);
          }
        } else if (!last || p.state !== last.state) {
          host.print(`${p.state}: ${values.done} of ${values.total_text}`);
        }
        last = p;
      }
    }
  }
}

function summary(p: PrefetchProgress): string {
  const seconds = p.startedAt && p.finishedAt ? (Date.parse(p.finishedAt) - Date.parse(p.startedAt)) / 1000 : 0;
  const head = `prefetch ${p.id} ${p.state}: ${formatBytes(p.bytesDone)} of ${formatBytes(p.bytesTotal)}, ` +
    `${p.objectsDone}/${p.objectsTotal} objects, ${p.blocksDone}/${p.blocksTotal} blocks (${p.blocksCached} already cached) ` +
    `in ${seconds.toFixed(1)} s, ${formatBytes(Math.round(p.rate))}/s`;
  return p.error ? `${head}; error: ${p.error}` : head;
}

function intFlag(flag: string, raw: string | undefined, fallback: number | undefined): number {
  if (raw === undefined) {
    if (fallback === undefined) throw new UsageError(`${flag} is required with --dataset`);
    return fallback;
  }
  if (!/^\d+$/.test(raw)) throw new UsageError(`${flag} must be a non-negative integer, received "${raw}"`);
  return Number(raw);
}

/**
 * `rackfeed stats`: reads `/metrics` of a server and prints hit rates, tier usage, origin
 * traffic and dataset consumers with their look-ahead.
 *
 * @returns 0, 1 when the server cannot be read, 2 on bad usage
 */
export async function statsCommand(args: readonly string[], host: AdminHost): Promise<0 | 1 | 2> {
  let v;
  try {
    v = parseArgs({ args: [...args], strict: true, options: { server: { type: "string" }, "read-token": { type: "string" } } }).values;
    if (!v.server) throw new UsageError("--server URL is required");
  } catch (e) {
    host.printError(`rackfeed stats: ${(e as Error).message.replace(/\. To specify.*$/s, "")}\n\n${ADMIN_USAGE}`);
    return 2;
  }
  const server = v.server.replace(/\/+$/, "");
  const token = v["read-token"] ?? host.env.RACKFEED_READ_TOKEN;
  let text: string;
  try {
    const res = await (host.fetch ?? fetch)(`${server}/metrics`, token ? { headers: { authorization: `Bearer ${token}` } } : {});
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    text = await res.text();
  } catch (e) {
    host.printError(`rackfeed stats: cannot read ${server}/metrics: ${withCause(e)}`);
    return 1;
  }
  for (const line of renderStats(parseMetrics(text))) host.print(line);
  return 0;
}

/** One sample of a Prometheus text exposition. */
export interface MetricSample {
  readonly name: string;
  readonly labels: Readonly<Record<string, string>>;
  readonly value: number;
}

/** Parses the samples of a Prometheus text exposition (comments skipped). */
export function parseMetrics(text: string): MetricSample[] {
  const out: MetricSample[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = Object.fromEntries([...(m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)].map((x) => [x[1], x[2]]));
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

/** The lines `rackfeed stats` prints for a set of samples. */
export function renderStats(samples: readonly MetricSample[]): string[] {
  const get = (name: string, labels: Record<string, string> = {}) =>
    samples.find((s) => s.name === name && Object.entries(labels).every(([k, v]) => s.labels[k] === v))?.value ?? 0;
  const all = (name: string) => samples.filter((s) => s.name === name);
  const memHits = get("rackfeed_cache_hits_total", { tier: "memory" });
  const diskHits = get("rackfeed_cache_hits_total", { tier: "disk" });
  const misses = get("rackfeed_cache_misses_total");
  const lookups = memHits + diskHits + misses;
  const pct = (n: number) => (lookups === 0 ? "-" : `${((100 * n) / lookups).toFixed(1)}%`);
  const lines = [
    "cache",
    `  hit rate    memory ${pct(memHits)} (${memHits})   disk ${pct(diskHits)} (${diskHits})   miss ${pct(misses)} (${misses})   coalesced ${get("rackfeed_cache_coalesced_total")}`,
  ];
  for (const tier of ["memory", "disk"]) {
    const bytes = get("rackfeed_cache_bytes", { tier });
    const budget = get("rackfeed_cache_budget_bytes", { tier });
    const share = budget > 0 ? ` (${((100 * bytes) / budget).toFixed(1)}%)` : "";
    lines.push(`  ${tier.padEnd(6)} tier ${formatBytes(bytes)} of ${formatBytes(budget)}${share}, ${get("rackfeed_cache_blocks", { tier })} blocks, ${get("rackfeed_cache_evictions_total", { tier })} evictions`);
  }
  lines.push("origins");
  const origins = [...new Set(all("rackfeed_origin_bytes_total").map((s) => s.labels.origin))];
  if (origins.length === 0) lines.push("  (none)");
  for (const origin of origins) {
    lines.push(
      `  ${origin}: ${formatBytes(get("rackfeed_origin_bytes_total", { origin }))} read, ` +
        `${get("rackfeed_origin_requests_total", { origin, op: "read" })} reads, ${get("rackfeed_origin_requests_total", { origin, op: "stat" })} stats, ` +
        `${get("rackfeed_origin_errors_total", { origin })} errors, ${get("rackfeed_origin_inflight_requests", { origin })} in flight`,
    );
  }
  const served = (transport: string) => formatBytes(get("rackfeed_served_bytes_total", { transport }));
  lines.push(`served ${served("http1")} over HTTP/1.1, ${served("http2")} over HTTP/2, ${served("shm")} over shared memory`);
  const consumers = all("rackfeed_readahead_steps");
  lines.push("consumers (dataset rank/world × micro_batch: look-ahead, step time)");
  if (consumers.length === 0) lines.push("  (none)");
  for (const c of consumers) {
    const l = c.labels;
    lines.push(
      `  ${l.dataset} ${l.rank}/${l.world} × ${l.micro_batch}: ${c.value} steps, ${get("rackfeed_readahead_seconds", l).toFixed(2)} s buffered, ` +
        `${(1000 * get("rackfeed_consumer_step_seconds", l)).toFixed(1)} ms/step`,
    );
  }
  return lines;
}
