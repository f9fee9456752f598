/**
 * @module The TypeScript SDK: objects and dataset batches from a rackfeed server, with
 * prefetching, retries, resume from any step, and the golden metrics of a data pipeline (t_wait
 * measured here, t_h2d and t_compute given by the caller) reported back to the server. Web
 * standards only (`fetch`, typed arrays), so it runs on Deno, Node, edge runtimes and browsers;
 * given a `LocalTransport` (`client/deno.ts`, `client/node.ts`) it takes the shared-memory path
 * to a co-located server by itself.
 */

import { fullSteps } from "../batch/steps.ts";
import { backoffDelay, sleep } from "../origin/retry.ts";
import { MAX_REPORT_STEPS } from "../metrics/telemetry-report.ts";
import { MAX_RING_SLOTS } from "../shm/protocol.ts";
import { type LocalTransport, ShmError, shmBatches, shmInstance, type SlotBatch } from "./shm-consumer.ts";
import { type ReportedConsumer, type ReportedStep, StepReports } from "./step-reports.ts";

/** Options of `RackfeedClient`. */
export interface RackfeedClientOptions {
  /** The server, e.g. `http://10.0.0.5:8080`. Optional only with `socket` (then only `batches()` works). */
  readonly url?: string;
  /** The server's shm control socket, e.g. `/dev/shm/rackfeed-8080.sock`; unset: asked from `GET /v1/shm`. */
  readonly socket?: string;
  /**
   * Unix socket and ring access for the shared-memory path (`localTransport()` of `client/deno.ts`
   * or `client/node.ts`). With it, `batches()` uses shm when the server is on this host, else HTTP.
   */
  readonly local?: LocalTransport;
  /** Set false to never use the shm path even with `local`. */
  readonly shm?: boolean;
  /** Bearer token for reads (`--read-token`). */
  readonly token?: string;
  /**
   * The `fetch` to use; on Node pass `http2Fetch()` from `client/node.ts` for HTTP/2. One with an
   * `abandonConnections` method (`PooledFetch`, as `http2Fetch()` and the Deno `createClient`'s)
   * is told when an attempt timed out, so that retries do not go down a dead connection.
   */
  readonly fetch?: typeof fetch | PooledFetch;
  /**
   * Retries of a transient failure (network error, timeout, 429, 502, 503, 504), at most.
   * Default 64; `retryForMs` usually ends them first.
   */
  readonly retries?: number;
  /**
   * How long a request (or the shm stream) keeps retrying a transient failure, from its first
   * failure, in ms. Default 60 000: a restarting server (its NVMe index rebuilt) takes seconds.
   */
  readonly retryForMs?: number;
  /** First backoff in ms, doubled per retry with full jitter. Default 50. */
  readonly backoffMs?: number;
  /** Backoff cap in ms. Default 2000. */
  readonly maxBackoffMs?: number;
  /**
   * Timings are sent to the server once this many steps are queued (and `reportIntervalMs` has
   * passed since the last report). Default 32.
   */
  readonly reportEvery?: number;
  /**
   * Least time between two reports of a consumer, in ms: a trainer faster than `reportEvery`
   * steps in this time sends more steps per report, not more reports (a report costs the
   * client 0.1–0.6 ms of CPU, more than a batch over shm). A consumer that has queued
   * `MAX_QUEUED_STEPS` reports at once. Default 1000; 0 = every `reportEvery` steps.
   */
  readonly reportIntervalMs?: number;
  /** Monotonic clock in ms (tests inject one). */
  readonly now?: () => number;
  /** Waits `ms` (tests inject one). */
  readonly sleep?: (ms: number) => Promise<void>;
  /**
   * Longest time one HTTP attempt (headers and body) may take before it is abandoned and
   * retried, in ms, and longest wait for a batch over shm before the shm stream is opened again;
   * 0 = none. Default 120 000 (a batch may wait 30 s for room on the server).
   */
  readonly timeoutMs?: number;
}

/**
 * A `fetch` over a pool of connections it can give up. HTTP/2 sends every request down one
 * connection: when that connection goes silent without closing (a NAT or load balancer that
 * dropped the flow), each retry would time out on it again, while HTTP/1.1 closes a timed-out
 * request's socket and the retry opens a new one.
 */
export interface PooledFetch {
  (input: string | URL | Request, init?: RequestInit): Promise<Response>;
  /**
   * Called when the attempt made with `signal` (its `init.signal`) took longer than `timeoutMs`:
   * the connections that attempt used take no new request any more, and close once the requests
   * on them are over. Attempts made since on new connections are not affected.
   */
  abandonConnections?(signal: AbortSignal): void;
  /** Closes its connections (called by `RackfeedClient.close()`); a later request opens new ones. */
  close?(): Promise<void> | void;
}

/** Consumer of `batches()`. */
export interface BatchesOptions {
  readonly rank: number;
  readonly world: number;
  readonly microBatch: number;
  readonly startStep?: number;
  readonly endStep?: number;
  /** Batches requested (HTTP) or filled (shm) ahead of the caller: 1 to 64, default 2. */
  readonly prefetch?: number;
  /** Ends the iteration (and its requests in flight) with the signal's reason. */
  readonly signal?: AbortSignal;
}

/** One `batches()` iteration as its transports share it: where it stands, and since when its caller waits. */
interface Iteration {
  readonly dataset: string;
  readonly c: BatchesOptions;
  /** The consumer's id in the step reports. */
  readonly id: string;
  /** The step to stop before; undefined only for a socket-only client (the shm stream ends it). */
  readonly end: number | undefined;
  /** The next step to hand out. */
  step: number;
  /** When the caller's wait for the next batch began (t_wait). */
  waitFrom: number;
  /** Ends every request of the iteration. */
  readonly signal: AbortSignal;
  /** Batches in flight (HTTP) or filled (shm) ahead of the caller. */
  readonly depth: number;
}

/** A micro-batch or run of samples: tokens in the dataset's dtype, shape `[n, seq_length + 1]`. */
export interface TokenBatch {
  readonly tokens: Uint16Array | Int32Array | Uint8Array | Int8Array | Int16Array | Float32Array | Float64Array | BigInt64Array;
  readonly dtype: string;
  readonly shape: readonly [number, number];
  readonly firstSample: number;
  /** `hit`, `filling` or `miss`: whether the server had every block in memory. */
  readonly cache: string;
}

/**
 * A batch from `batches()`, with its step and how long the caller waited for it. Over shm its
 * tokens view the ring slot itself and are valid until the next iteration (copy with
 * `tokens.slice()` to keep them).
 */
export interface StepBatch extends TokenBatch {
  readonly step: number;
  /** Seconds `next()` blocked before this batch was there (t_wait). */
  readonly waitSeconds: number;
  /** How it came: `shm` or `http`. */
  readonly transport: "shm" | "http";
}

export type { StepTimings } from "../metrics/telemetry-report.ts";

/** Raised for an answer that retrying cannot fix (4xx), with the server's message. */
export class RackfeedError extends Error {
  /**
   * @param status the HTTP status (0 for network failures after the last retry)
   * @param code the server's error code
   */
  constructor(readonly status: number, readonly code: string, message: string) {
    super(message);
    this.name = "RackfeedError";
  }
}

const TYPED: Record<string, new (b: ArrayBuffer) => TokenBatch["tokens"]> = {
  uint8: Uint8Array,
  int8: Int8Array,
  int16: Int16Array,
  uint16: Uint16Array,
  int32: Int32Array,
  int64: BigInt64Array,
  float32: Float32Array,
  float64: Float64Array,
};

const TRANSIENT = new Set([429, 502, 503, 504]);

/** Most batches `batches()` keeps in flight ahead of the caller. */
const MAX_PREFETCH = MAX_RING_SLOTS;

/** How long a telemetry report is retried, and one attempt may take (ms). */
const TELEMETRY_RETRY_MS = 5000;

export { MAX_QUEUED_STEPS, MAX_REPORTS_IN_FLIGHT } from "./step-reports.ts";

/** A fetch failure that no retry can fix: a bad URL or port, an untrusted certificate (undici's and Deno's causes). */
function permanentFetchFailure(e: unknown): boolean {
  // Only fetch's own failures (a TypeError), never ours (TruncatedBody names the path), and never
  // the URL: Deno's cause reads "error sending request for url (http://host/v1/datasets/NAME...)",
  // so a dataset, key or host holding "cert" would otherwise never be retried.
  if (!(e instanceof TypeError)) return false;
  const cause = (e as { cause?: { code?: unknown; message?: unknown } })?.cause;
  const text = `${String(cause?.code ?? "")} ${String(cause?.message ?? "")} ${String(e.message ?? "")}`.replace(/\b(?:https?|wss?):\/\/\S*/gi, "");
  // A port fetch blocks (the Fetch standard's list: 1, 6000, 6667...) is blocked on every attempt.
  return /CERT|SELF_SIGNED|ERR_TLS|InvalidCertificate|UnknownIssuer|ERR_INVALID_URL|Invalid URL|unsupported scheme|bad port|port \d+ (?:are|is) blocked/i.test(text);
}

/** `e`'s message with its cause's (undici says only "fetch failed"). */
function describeFailure(e: unknown): string {
  const m = (e as Error)?.message ?? String(e);
  const c = (e as { cause?: { message?: unknown; code?: unknown } })?.cause;
  return c ? `${m} (${String(c.code ?? c.message ?? c)})` : m;
}

function checkInt(v: unknown, what: string, min: number, max = Number.MAX_SAFE_INTEGER): void {
  if (typeof v !== "number" || !Number.isInteger(v) || v < min || v > max) {
    throw new RangeError(`Invalid ${what}: ${String(v)}; expected an integer from ${min} to ${max}`);
  }
}

/** A time in ms: a number from 0 (fractions allowed), and Infinity only where `infinite` (a NaN would turn a limit off unseen). */
function checkMs(v: unknown, what: string, infinite: boolean): void {
  if (typeof v !== "number" || Number.isNaN(v) || v < 0 || (!infinite && !Number.isFinite(v))) {
    throw new RangeError(`Invalid ${what}: ${String(v)}; expected milliseconds from 0${infinite ? " (Infinity allowed)" : ", finite"}`);
  }
}

/** How long a client that found the shared-memory path unusable keeps to HTTP before it asks again (ms). */
export const SHM_RECHECK_MS = 30_000;

/**
 * A client of one rackfeed server.
 *
 * @example
 * ```ts
 * const rf = new RackfeedClient({ url: "http://127.0.0.1:8080" });
 * for await (const b of rf.batches("pile", { rank: 0, world: 8, microBatch: 4, startStep: 1200 })) {
 *   const t0 = performance.now(); await toGpu(b.tokens); const h2d = (performance.now() - t0) / 1000;
 *   train(b); rf.reportStep(b.step, { t_h2d: h2d, t_compute: 0.31 });
 * }
 * await rf.close();
 * ```
 */
export class RackfeedClient {
  readonly #url: string | undefined;
  readonly #socket: string | undefined;
  readonly #local: LocalTransport | undefined;
  readonly #token: string | undefined;
  /** Where the shm path leads, once asked (null: not co-located, off, or not usable now). */
  #shmRoute: { socket: string; instance: string | undefined } | null | undefined;
  /** When the shm path was last found unusable (`#now()` ms): asked again `SHM_RECHECK_MS` later. */
  #shmRouteNullAt = 0;
  readonly #fetch: PooledFetch;
  readonly #headers: Record<string, string>;
  readonly #retries: number;
  readonly #retryForMs: number;
  readonly #backoff: number;
  readonly #maxBackoff: number;
  readonly #now: () => number;
  /** The caller's sleep (tests), or undefined: a timer, cleared when the wait is aborted. */
  readonly #sleep: ((ms: number) => Promise<void>) | undefined;
  #retried = 0;
  readonly #timeoutMs: number;
  /** Step timings queued and reported, per consumer. */
  readonly #reports: StepReports;

  /** @param opts server URL, token, transport and retry policy */
  constructor(opts: RackfeedClientOptions) {
    if (opts.url === undefined) {
      if (opts.socket === undefined || opts.local === undefined || opts.shm === false) {
        throw new RangeError("RackfeedClient needs a url, or a socket path with a local transport (and shm not switched off)");
      }
    } else {
      let url: URL;
      try {
        url = new URL(opts.url);
      } catch {
        throw new RangeError(`Invalid rackfeed url "${opts.url}": expected e.g. http://127.0.0.1:8080`);
      }
      // new URL("localhost:8080") parses, with the scheme "localhost:": fetch would then fail every attempt.
      if (url.protocol !== "http:" && url.protocol !== "https:") {
        throw new RangeError(`Invalid rackfeed url "${opts.url}": expected http:// or https://, e.g. http://127.0.0.1:8080`);
      }
      // Paths are appended to it: a query or fragment would swallow them.
      if (url.search !== "" || url.hash !== "") {
        throw new RangeError(`Invalid rackfeed url "${opts.url}": a query or fragment cannot be followed by a path; give the server's address, e.g. http://127.0.0.1:8080`);
      }
      this.#url = url.href.replace(/\/+$/, "");
    }
    this.#socket = opts.socket;
    this.#local = opts.shm === false ? undefined : opts.local;
    // A header cannot carry it: every request would fail in fetch and be retried for retryForMs.
    if (opts.token && !/^[\x21-\x7e]+$/.test(opts.token)) { // "" is none, as before
      throw new RangeError("Invalid token: expected visible ASCII characters only (no spaces, line breaks or other characters), as the server's --read-token");
    }
    this.#token = opts.token;
    this.#fetch = (opts.fetch as PooledFetch | undefined) ?? globalThis.fetch.bind(globalThis);
    this.#headers = opts.token ? { authorization: `Bearer ${opts.token}` } : {};
    this.#retries = opts.retries ?? 64;
    this.#retryForMs = opts.retryForMs ?? 60_000;
    this.#backoff = opts.backoffMs ?? 50;
    this.#maxBackoff = opts.maxBackoffMs ?? 2000;
    // A NaN here would switch a limit off without a word (every comparison with it is false).
    if (this.#retries !== Infinity) checkInt(this.#retries, "retries", 0); // Infinity: retry for as long as retryForMs allows
    checkMs(this.#retryForMs, "retryForMs", true);
    checkMs(this.#backoff, "backoffMs", false);
    checkMs(this.#maxBackoff, "maxBackoffMs", false);
    if (this.#backoff > this.#maxBackoff) {
      throw new RangeError(`Invalid backoffMs ${this.#backoff}: expected at most maxBackoffMs (${this.#maxBackoff})`);
    }
    const reportEvery = opts.reportEvery ?? 32;
    checkInt(reportEvery, "reportEvery", 0);
    const reportIntervalMs = opts.reportIntervalMs ?? 1000;
    checkMs(reportIntervalMs, "reportIntervalMs", false);
    this.#now = opts.now ?? (() => performance.now());
    this.#sleep = opts.sleep;
    this.#timeoutMs = opts.timeoutMs ?? 120_000;
    checkMs(this.#timeoutMs, "timeoutMs", false); // a timer cannot take Infinity (it would fire at once): 0 is none
    this.#reports = new StepReports({
      now: this.#now,
      reportEvery,
      reportIntervalMs,
      post: this.#url === undefined ? undefined : (consumer, steps) => this.#postTimings(consumer, steps),
    });
  }

  /** Steps whose timings are queued for the next report, over all consumers (at most `MAX_QUEUED_STEPS` each). */
  get queuedSteps(): number {
    return this.#reports.queuedSteps;
  }

  /**
   * Steps whose timings were dropped: a consumer's reports could not keep up (a server that does
   * not answer them) and its queue was full, or a report failed after its retries.
   */
  get droppedSteps(): number {
    return this.#reports.droppedSteps;
  }

  /** Requests retried since creation (transient failures survived). */
  get retried(): number {
    return this.#retried;
  }

  /**
   * Bytes of an object, or of `[start, end)` of it.
   *
   * @throws {RackfeedError} for a missing object or a bad range
   */
  async readObject(origin: string, key: string, range: { start?: number; end?: number } = {}, opts: { signal?: AbortSignal } = {}): Promise<Uint8Array> {
    const segments = key.split("/");
    // URLs fold "." and ".." segments (escaped too) before a request leaves: another object would be read.
    if (segments.some((seg) => seg === "." || seg === "..")) {
      throw new RangeError(`Invalid object key "${key}": a "." or ".." segment cannot travel in a URL`);
    }
    const path = `/v1/objects/${encodeURIComponent(origin)}/${segments.map(encodeURIComponent).join("/")}`;
    const headers: Record<string, string> = {};
    const ranged = range.start !== undefined || range.end !== undefined;
    if (ranged) {
      const start = range.start ?? 0;
      checkInt(start, "range start", 0);
      if (range.end !== undefined) checkInt(range.end, "range end", start);
      // The server ignores a malformed Range and sends the whole object: never send one.
      if (range.end === start) return new Uint8Array(0);
      headers.range = `bytes=${start}-${range.end === undefined ? "" : range.end - 1}`;
    }
    return await this.#get(path, headers, opts.signal, async (res) => {
      const bytes = new Uint8Array(await res.arrayBuffer());
      if (ranged && res.status !== 206 && (range.start ?? 0) !== 0) {
        throw new RackfeedError(res.status, "BAD_RESPONSE", `${path}: asked for bytes ${headers.range}, got status ${res.status} (the whole object?)`);
      }
      return ranged && res.status === 200 ? bytes.subarray(0, range.end ?? bytes.length) : bytes;
    });
  }

  /** A dataset's description (`GET /v1/datasets/{name}`). */
  async describe(dataset: string, opts: { signal?: AbortSignal } = {}): Promise<Record<string, unknown>> {
    return await this.#get(`/v1/datasets/${encodeURIComponent(dataset)}`, {}, opts.signal, (res) => res.json());
  }

  /** Samples `[start, start + count)`. */
  async samples(dataset: string, start: number, count: number, opts: { signal?: AbortSignal } = {}): Promise<TokenBatch> {
    checkInt(start, "start", 0);
    checkInt(count, "count", 1);
    return await this.#tokens(`/v1/datasets/${encodeURIComponent(dataset)}/samples?start=${start}&count=${count}`, opts.signal);
  }

  /** Rank `rank`'s micro-batch of `step`. */
  async batch(dataset: string, step: number, c: { rank: number; world: number; microBatch: number; signal?: AbortSignal }): Promise<TokenBatch> {
    checkInt(step, "step", 0);
    checkConsumer(c);
    return await this.#tokens(
      `/v1/datasets/${encodeURIComponent(dataset)}/batches/${step}?rank=${c.rank}&world=${c.world}&micro_batch=${c.microBatch}`,
      c.signal,
    );
  }

  /**
   * Batches of one rank from `startStep` (resume anywhere) to `endStep` (exclusive; default: the
   * last full step), keeping `prefetch` requests in flight ahead of the caller. Each batch carries
   * its t_wait; a failed request is retried (same step), so a server restart costs time, never a
   * duplicate or a gap.
   */
  batches(dataset: string, c: BatchesOptions): AsyncGenerator<StepBatch, void, undefined> {
    // Checked here, not at the first next(): a generator's body runs only then.
    checkConsumer(c);
    if (c.startStep !== undefined) checkInt(c.startStep, "startStep", 0);
    if (c.endStep !== undefined) checkInt(c.endStep, "endStep", c.startStep ?? 0);
    if (c.prefetch !== undefined) checkInt(c.prefetch, "prefetch", 1, MAX_PREFETCH);
    return this.#batches(dataset, c);
  }

  async *#batches(dataset: string, c: BatchesOptions): AsyncGenerator<StepBatch, void, undefined> {
    // Aborted when the caller stops (break, throw, its signal): no request outlives the loop.
    const ac = new AbortController();
    const onAbort = () => ac.abort(c.signal!.reason);
    c.signal?.addEventListener("abort", onAbort, { once: true });
    if (c.signal?.aborted) onAbort();
    const signal = ac.signal;
    // t_wait: from the caller's next() to its batch, whatever happened meanwhile (route lookups,
    // reconnects, backoffs, a switch of transport).
    const waitFrom = this.#now();
    let reportId: string | undefined;
    try {
      let end = c.endStep;
      if (end === undefined && this.#url !== undefined) {
        const d = await this.describe(dataset, { signal });
        end = fullSteps(Number(d.numSamples), c.world, c.microBatch);
        if (!Number.isSafeInteger(end)) throw new RackfeedError(0, "BAD_RESPONSE", `Dataset "${dataset}" has no numSamples in its description`);
        // No step at all is a wrong world or micro-batch, not an empty epoch (an epoch loop would spin on it).
        if (end === 0) {
          throw new RackfeedError(416, "RANGE_NOT_SATISFIABLE", `Dataset "${dataset}" has no full step for world=${c.world}, micro_batch=${c.microBatch}: it has ${Number(d.numSamples)} samples, fewer than world × micro_batch = ${c.world * c.microBatch}`);
        }
        // A resume past the end is a wrong step, not an empty epoch (HTTP answers a batch there with 416).
        if ((c.startStep ?? 0) > end) {
          throw new RackfeedError(416, "RANGE_NOT_SATISFIABLE", `startStep ${c.startStep} is beyond dataset "${dataset}": it has ${end} steps for world=${c.world}, micro_batch=${c.microBatch}`);
        }
      }
      const consumer = { dataset, rank: c.rank, world: c.world, micro_batch: c.microBatch };
      const id = JSON.stringify(consumer);
      this.#reports.begin(id, consumer);
      reportId = id;
      const it: Iteration = { dataset, c, id, end, step: c.startStep ?? 0, waitFrom, signal, depth: c.prefetch ?? 2 };
      // Over shm while a co-located server's ring can be had (in this loop, not in a generator of
      // its own: a delegated generator cost every batch another promise, ~7 % of the SDK's CPU
      // per shm batch on Deno), then over HTTP from the next step.
      let failingSince = NaN; // when the shm stream's current run of failures began
      for (let attempt = 0; end === undefined || it.step < end;) {
        const route = await this.#shmRouteNow(signal);
        if (!route) break;
        // The shm path: the server fills `depth` slots ahead, plus the one the caller holds.
        const stream = shmBatches(this.#local!, route.socket, route.instance, this.#token, {
          dataset,
          rank: c.rank,
          world: c.world,
          microBatch: c.microBatch,
          startStep: it.step,
          endStep: end,
          slots: Math.min(it.depth + 1, MAX_RING_SLOTS),
          signal,
          // A stopped server keeps the socket open and silent: bounded as an HTTP attempt is.
          timeoutMs: this.#timeoutMs,
          onTimings: (send, live) => this.#reports.shmSocket(id, send, live),
        });
        try {
          for (;;) {
            const r = await stream.next();
            // Batches already in the ring come without a read of the (closed) socket: stop here.
            signal.throwIfAborted();
            if (r.done) {
              // The server ends at the dataset's last full step: asked for more, say so as HTTP does (416).
              if (c.endStep !== undefined && it.step < c.endStep) {
                throw new RackfeedError(416, "RANGE_NOT_SATISFIABLE", `Step ${it.step} is beyond dataset "${dataset}" (world=${c.world}, micro_batch=${c.microBatch}): the server ended the shared-memory stream there`);
              }
              this.#reports.sendInBackground(undefined, true); // steps still waiting for their callers' timings stay: close() sends them
              return;
            }
            const waitSeconds = (this.#now() - it.waitFrom) / 1000;
            this.#reports.waited(id, r.value.step, waitSeconds);
            attempt = 0;
            failingSince = NaN;
            it.step = r.value.step + 1;
            yield { ...slotTokens(r.value), step: r.value.step, waitSeconds, transport: "shm" };
            it.waitFrom = this.#now();
            // A consumer whose batches are all in the ring never waits for I/O, so its reports (I/O)
            // would never complete: when they back up, let the event loop run once.
            if (this.#reports.autoFlush(id, it.waitFrom) && this.#local?.nextTurn) await this.#local.nextTurn();
          }
        } catch (e) {
          if (signal.aborted) throw signal.reason;
          if (!(e instanceof ShmError)) throw e;
          if (e.code === "SHM_FULL" || e.code === "SHM_UNREACHABLE") {
            // A client given only a socket has no HTTP to turn to: the server's reason is the caller's error.
            if (this.#url === undefined) throw new RackfeedError(e.status, e.code, e.message);
            this.#noShm(); // no room for a ring on this server, or no way to read it: HTTP for a while
            continue;
          }
          if (e.status !== 0 && !TRANSIENT.has(e.status)) throw new RackfeedError(e.status, e.code, e.message);
          if (Number.isNaN(failingSince)) failingSince = this.#now();
          if (this.#givesUp(attempt, failingSince)) {
            throw new RackfeedError(e.status, "UNAVAILABLE", `Shared-memory path failed after ${attempt + 1} attempts: ${e.message}`);
          }
          this.#shmRoute = undefined; // a restarted server has a new instance (and maybe socket)
          this.#retried++;
          await this.#pause(this.#backoffMs(attempt++), signal);
        } finally {
          await stream.return();
        }
      }
      if (end === undefined) throw new RangeError("batches() over a socket alone needs the shm path; give a url too");
      yield* this.#httpSteps(it, end);
      // Never on the data path: a report that fails must not fail (or hold) the iteration; close()
      // waits for it, and sends the last steps still waiting for the caller's timings.
      this.#reports.sendInBackground(undefined, true);
    } finally {
      c.signal?.removeEventListener("abort", onAbort);
      ac.abort(new DOMException("batches() ended", "AbortError"));
      // Ended early too (a break, an abort, an error): what this consumer queued goes now, not
      // at some later report (the newest steps that still miss the caller's timings stay).
      if (reportId !== undefined) this.#reports.sendInBackground(reportId, true);
    }
  }

  /** An iteration's steps over HTTP, from `it.step` to `end`, with `it.depth` requests in flight beyond the caller's. */
  async *#httpSteps(it: Iteration, end: number): AsyncGenerator<StepBatch, void, undefined> {
    const { dataset, c, id, signal, depth } = it;
    const inFlight = new Map<number, Promise<TokenBatch>>();
    let next = it.step;
    const fill = (upTo: number) => {
      for (; next < Math.min(end, upTo); next++) {
        const p = this.batch(dataset, next, { ...c, signal });
        p.catch(() => {}); // surfaced when awaited, in order
        inFlight.set(next, p);
      }
    };
    for (; it.step < end; it.step++) {
      const step = it.step;
      // `depth` requests beyond this step: in flight while the caller works on this one.
      fill(step + depth + 1);
      const b = await inFlight.get(step)!;
      inFlight.delete(step);
      signal.throwIfAborted(); // a batch that arrived before the abort is not handed out after it
      const waitSeconds = (this.#now() - it.waitFrom) / 1000;
      this.#reports.waited(id, step, waitSeconds);
      yield { ...b, step, waitSeconds, transport: "http" };
      it.waitFrom = this.#now();
      this.#reports.autoFlush(id, it.waitFrom);
    }
  }

  /** The transport `batches()` would take now: `shm` when a co-located server's socket answers, else `http`. */
  async transport(): Promise<"shm" | "http"> {
    return (await this.#shmRouteNow(undefined)) ? "shm" : "http";
  }

  /** Finds the shm socket (asking `GET /v1/shm` unless given) and checks it leads to the same server. */
  async #shmRouteNow(signal: AbortSignal | undefined): Promise<{ socket: string; instance: string | undefined } | null> {
    // Not usable is not for ever: a restarted server, freed room, a socket that came up late.
    if (this.#shmRoute === null && this.#local && this.#now() - this.#shmRouteNullAt >= SHM_RECHECK_MS) this.#shmRoute = undefined;
    if (this.#shmRoute !== undefined) return this.#shmRoute;
    if (!this.#local) return (this.#shmRoute = null);
    if (this.#socket !== undefined && this.#url === undefined) return (this.#shmRoute = { socket: this.#socket, instance: undefined });
    let info: { socket: string; instance: string };
    try {
      info = await this.#get("/v1/shm", {}, signal, (res) => res.json());
    } catch (e) {
      if (e instanceof RackfeedError && e.status === 404) return this.#noShm(); // shm off
      throw e;
    }
    const socket = this.#socket ?? info.socket;
    try {
      // The same path on this host may be another server's, or none: only the same instance counts.
      const instance = await shmInstance(this.#local, socket, this.#token);
      return instance === info.instance ? (this.#shmRoute = { socket, instance }) : this.#noShm();
    } catch {
      return this.#noShm();
    }
  }

  /** Marks the shm path unusable for now; the next `batches()` after `SHM_RECHECK_MS` asks again. */
  #noShm(): null {
    this.#shmRouteNullAt = this.#now();
    return (this.#shmRoute = null);
  }

  /**
   * Adds the caller's timings of a step (host-to-device copy, compute) to what is reported; the
   * consumer is the last `batches()` iteration unless given.
   */
  reportStep(step: number, t: { t_h2d?: number; t_compute?: number }, consumer?: { dataset: string; rank: number; world: number; microBatch: number }): void {
    this.#reports.add(step, t, consumer);
  }

  /** Sends the queued timings now. */
  async flush(): Promise<void> {
    // A step still waiting for a timing its caller reports stays queued (sent apart, its timings
    // would never be judged together); close() sends those too.
    await this.#reports.flush();
  }

  /** Sends one consumer's steps by HTTP, in reports of at most `MAX_REPORT_STEPS`. */
  async #postTimings(body: ReportedConsumer, steps: ReportedStep[]): Promise<void> {
    for (let i = 0; i < steps.length; i += MAX_REPORT_STEPS) {
      await this.#request("/v1/telemetry", {
        method: "POST",
        headers: { ...this.#headers, "content-type": "application/json" },
        // An id the server counts once: a retry after a lost answer (a cut connection, a timeout)
        // would otherwise count every step of the report twice.
        body: JSON.stringify({ ...body, report: reportId(), steps: steps.slice(i, i + MAX_REPORT_STEPS) }),
      }, undefined, async (res) => void (await res.body?.cancel()), {
        // Short: close() waits for reports, and a trainer at its end must not wait a minute
        // for a server that is gone (its timings are lost then, its batches are not).
        retryForMs: Math.min(this.#retryForMs, TELEMETRY_RETRY_MS),
        timeoutMs: Math.min(this.#timeoutMs || TELEMETRY_RETRY_MS, TELEMETRY_RETRY_MS),
      });
    }
  }

  /**
   * Waits for the reports in flight, then sends the rest of the timings, then closes the
   * connections of its `fetch` where it can (`PooledFetch.close`; a later call opens new ones).
   * Never rejects: a report that fails is telemetry's loss, not the caller's error.
   */
  async close(): Promise<void> {
    await this.#reports.close();
    // The fetch's own connections (createClient's): a program that makes a client per epoch
    // would otherwise keep each one's idle connections open until the server closes them.
    await Promise.resolve(this.#fetch.close?.()).catch(() => {});
  }

  /** Waits `ms`, ended early (rejecting with its reason) by `signal`; an aborted wait leaves no timer behind. */
  async #pause(ms: number, signal: AbortSignal | undefined): Promise<void> {
    if (!signal) return await (this.#sleep ?? sleep)(ms);
    signal.throwIfAborted();
    // Its own controller, linked: many requests pausing at once add no listener each to `signal`.
    const ac = new AbortController();
    const unlink = linkAbort(signal, ac);
    try {
      if (!this.#sleep) return await sleep(ms, ac.signal);
      const aborted = new Promise<never>((_, reject) => ac.signal.addEventListener("abort", () => reject(ac.signal.reason), { once: true }));
      aborted.catch(() => {});
      await Promise.race([this.#sleep(ms), aborted]);
    } finally {
      unlink();
    }
  }

  /** Whether a run of transient failures that began at `since` has had its retries or its time. */
  #givesUp(attempt: number, since: number, retryForMs = this.#retryForMs): boolean {
    return attempt >= this.#retries || this.#now() - since >= retryForMs;
  }

  /**
   * The wait a server's `Retry-After` (seconds) asks for, capped at `maxBackoffMs`, plus up to half
   * of it at random: the ranks of a job that got the same answer at once must not all come back
   * in the same instant (a server restarting answers every one of them 503, Retry-After: 1).
   */
  #retryAfterMs(seconds: number): number {
    const ms = Math.min(seconds * 1000, this.#maxBackoff);
    return ms + Math.random() * ms / 2;
  }

  /** Full-jitter backoff before retry `attempt` (the origins' policy, `backoffDelay`). */
  #backoffMs(attempt: number): number {
    return backoffDelay(attempt, { retries: this.#retries, baseMs: this.#backoff, capMs: this.#maxBackoff }, Math.random);
  }

  async #tokens(path: string, signal?: AbortSignal): Promise<TokenBatch> {
    return await this.#get(path, {}, signal, async (res) => {
      const dtype = res.headers.get("x-rackfeed-dtype") ?? "uint16";
      const shapeHeader = res.headers.get("x-rackfeed-shape");
      if (shapeHeader === null) {
        await res.body?.cancel();
        throw new RackfeedError(res.status, "BAD_RESPONSE", `${path}: no X-Rackfeed-Shape header, so not rackfeed's answer; is ${this.#url} a rackfeed server?`);
      }
      const shape = shapeHeader.split(",").map(Number) as [number, number];
      const Typed = TYPED[dtype];
      if (!Typed) {
        await res.body?.cancel(); // else the connection stays held until the response is collected
        throw new RackfeedError(res.status, "BAD_RESPONSE", `Unknown dtype "${dtype}" from ${path}`);
      }
      // A body cut short throws here, inside the attempt: it is retried like a failed request.
      const body = await res.arrayBuffer();
      const want = shape[0] * shape[1] * (Typed as unknown as { BYTES_PER_ELEMENT: number }).BYTES_PER_ELEMENT;
      if (body.byteLength !== want) throw new TruncatedBody(`${path}: ${body.byteLength} body bytes for shape ${shape.join("x")} ${dtype} (${want})`);
      return {
        tokens: new Typed(body),
        dtype,
        shape,
        firstSample: Number(res.headers.get("x-rackfeed-first-sample") ?? 0),
        cache: res.headers.get("x-rackfeed-cache") ?? "",
      };
    });
  }

  #get<T>(path: string, headers: Record<string, string>, signal: AbortSignal | undefined, read: (res: Response) => Promise<T>): Promise<T> {
    if (this.#url === undefined) throw new RangeError(`${path} needs HTTP: this client was made with a socket path only`);
    return this.#request(path, { headers: { ...this.#headers, ...headers } }, signal, read);
  }

  /**
   * One request with retries; `read` consumes the body of a 2xx answer inside the attempt, so a
   * connection lost mid-body (a server restart) is retried too, and a stalled one times out.
   */
  async #request<T>(
    path: string,
    init: RequestInit,
    signal: AbortSignal | undefined,
    read: (res: Response) => Promise<T>,
    budget: { readonly retryForMs: number; readonly timeoutMs: number } = { retryForMs: this.#retryForMs, timeoutMs: this.#timeoutMs },
  ): Promise<T> {
    if (this.#url === undefined) throw new RangeError(`${path} needs HTTP: this client was made with a socket path only`);
    const timeoutMs = budget.timeoutMs;
    let failingSince = NaN;
    for (let attempt = 0;; attempt++) {
      signal?.throwIfAborted();
      const ac = new AbortController();
      const unlink = signal && linkAbort(signal, ac);
      const timer = timeoutMs > 0
        ? setTimeout(() => ac.abort(new DOMException(`No complete answer in ${timeoutMs} ms`, "TimeoutError")), timeoutMs)
        : undefined;
      let status = 0;
      let why: string;
      let retryAfter = NaN;
      try {
        const res = await this.#fetch(`${this.#url}${path}`, { ...init, signal: ac.signal });
        status = res.status;
        if (res.ok) {
          try {
            return await read(res);
          } catch (e) {
            // Not a body cut short (a network error, retried) but one that is no answer of ours:
            // a wrong port or a proxy's page. Retrying would only hide that for a minute.
            if (e instanceof SyntaxError) throw new RackfeedError(res.status, "BAD_RESPONSE", `${path}: the answer is not rackfeed's (${e.message}); is ${this.#url} a rackfeed server?`);
            throw e;
          }
        }
        if (!TRANSIENT.has(res.status)) {
          const body = await res.json().catch(() => ({})) as { error?: string; message?: string };
          throw new RackfeedError(res.status, body.error ?? "HTTP_ERROR", body.message ?? `HTTP ${res.status} for ${path}`);
        }
        retryAfter = Number(res.headers.get("retry-after"));
        await res.body?.cancel().catch(() => {});
        why = `HTTP ${res.status}`;
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        if (e instanceof RackfeedError) throw e;
        if (permanentFetchFailure(e)) throw new RackfeedError(0, "FETCH_FAILED", `${path}: ${describeFailure(e)}`);
        why = ac.signal.aborted ? String((ac.signal.reason as Error)?.message ?? ac.signal.reason) : describeFailure(e);
        status = 0;
        // Timed out: its connection may be dead without closing, and over HTTP/2 the retry would
        // take the same one.
        if (ac.signal.aborted) this.#fetch.abandonConnections?.(ac.signal);
      } finally {
        clearTimeout(timer);
        unlink?.();
      }
      if (Number.isNaN(failingSince)) failingSince = this.#now();
      if (this.#givesUp(attempt, failingSince, budget.retryForMs)) {
        throw new RackfeedError(status, "UNAVAILABLE", `${path} failed after ${attempt + 1} attempts: ${why}`);
      }
      this.#retried++;
      await this.#pause(Number.isFinite(retryAfter) && retryAfter > 0 ? this.#retryAfterMs(retryAfter) : this.#backoffMs(attempt), signal);
    }
  }
}

const linked = new WeakMap<AbortSignal, Set<AbortController>>();

/**
 * Aborts `ac` when `signal` aborts, through one listener per signal however many requests share
 * it (a `batches()` loop's requests in flight: one listener each warned of a leak past 10 on
 * Node; `AbortSignal.any` leaks with a long-lived source on Node and Deno). Returns the unlink.
 */
function linkAbort(signal: AbortSignal, ac: AbortController): () => void {
  if (signal.aborted) {
    ac.abort(signal.reason);
    return () => {};
  }
  let set = linked.get(signal);
  if (set === undefined) {
    const fresh = new Set<AbortController>();
    linked.set(signal, fresh);
    signal.addEventListener("abort", () => {
      for (const c of fresh) c.abort(signal.reason);
      fresh.clear();
    }, { once: true });
    set = fresh;
  }
  set.add(ac);
  return () => void set.delete(ac);
}

/** 32 random hex digits (getRandomValues: crypto.randomUUID needs a secure context in browsers). */
function reportId(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  let id = "";
  for (const b of bytes) id += b.toString(16).padStart(2, "0");
  return id;
}

/** A 2xx body shorter or longer than its headers say: retried like a lost connection. */
class TruncatedBody extends Error {}

function checkConsumer(c: { rank: number; world: number; microBatch: number }): void {
  checkInt(c.world, "world", 1);
  checkInt(c.rank, "rank", 0, c.world - 1);
  checkInt(c.microBatch, "microBatch", 1);
}

function slotTokens(b: SlotBatch): TokenBatch {
  const Typed = TYPED[b.dtype];
  if (!Typed) throw new RackfeedError(0, "BAD_RESPONSE", `Unknown dtype "${b.dtype}" from the shm path`);
  const T = Typed as unknown as { new (buf: ArrayBufferLike, offset: number, length: number): TokenBatch["tokens"]; BYTES_PER_ELEMENT: number };
  return {
    tokens: new T(b.bytes.buffer, b.bytes.byteOffset, b.bytes.length / T.BYTES_PER_ELEMENT),
    dtype: b.dtype,
    shape: b.shape,
    firstSample: b.firstSample,
    cache: b.cache,
  };
}
