/**
 * @module An origin in an S3 bucket (AWS or any S3-compatible store): HeadObject for size and
 * ETag, ranged GetObject with `If-Match` straight into the caller's buffer, ListObjectsV2 with
 * continuation; every request with a stall timeout, capped exponential backoff with jitter,
 * and a hedged second GET for a part much slower than its peers.
 */

import {
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  S3Client,
  type S3ClientConfig,
} from "@aws-sdk/client-s3";
import { FetchHttpHandler } from "@smithy/fetch-http-handler";
import { isCacheServerError, OriginError } from "../errors.ts";
import type { ReadTiming } from "./part-sizer.ts";
import { type ListedObject, MIN_ORIGIN_BYTES_PER_S, type ObjectInfo, type Origin, type OriginRequestStats, readDeadlineMs } from "./origin.ts";
import { backoffDelay, type RetryPolicy, sleep } from "./retry.ts";

/** The HTTP client an S3 origin's requests go through (see `S3OriginOptions.http`). */
export type S3Http = "node" | "fetch";

/**
 * A connection pool of the runtime's fetch for one origin (Deno: an `HttpClient`), so that the
 * origin's idle connections are bounded and closed with it; without one, fetch uses the
 * process's shared pool, which nothing closes.
 */
export interface FetchPool {
  /** Fetch options that send a request through this pool (e.g. `{ client }` on Deno). */
  readonly init: Readonly<Record<string, unknown>>;
  /** Closes the pool and its connections. */
  close(): void;
}

/** Options of `S3Origin`. Everything not given comes from the AWS SDK's default chain. */
export interface S3OriginOptions {
  /** Origin name. */
  readonly name: string;
  readonly bucket: string;
  /** Key prefix inside the bucket, "" or ending in "/"; object keys are appended to it. */
  readonly prefix: string;
  /** Region; default: the SDK chain (`AWS_REGION`, profile), else `us-east-1` when an endpoint is set. */
  readonly region?: string;
  /** Endpoint URL for S3-compatible stores; default: the SDK chain (`AWS_ENDPOINT_URL_S3`, `AWS_ENDPOINT_URL`). */
  readonly endpoint?: string;
  /** Path-style addressing (`endpoint/bucket/key`); default: true when an endpoint is set. */
  readonly forcePathStyle?: boolean;
  /** Static credentials (tests); default: the SDK chain (environment, profiles, SSO, IMDS, ...). */
  readonly credentials?: { readonly accessKeyId: string; readonly secretAccessKey: string; readonly sessionToken?: string };
  /**
   * The HTTP client of every request: `node` (node:http with a keep-alive pool sized to the
   * concurrency, the SDK's default) or `fetch` (the runtime's own fetch and connection pool).
   * Default `node`.
   */
  readonly http?: S3Http;
  /** With `http: "fetch"`: makes this origin's pool, keeping at most `maxIdle` idle connections. */
  readonly fetchPool?: (maxIdle: number) => FetchPool;
  /** Requests in flight this origin gets from the gateway at first; bounds hedges. */
  readonly concurrency: number;
  /** Most requests in flight the gateway's adaptive limit may allow (default `concurrency`); sizes the keep-alive pool. */
  readonly maxConcurrency?: number;
  /** An attempt that receives no byte for this long is abandoned (ms). */
  readonly timeoutMs: number;
  /** Retries and backoff. */
  readonly retry: RetryPolicy;
  /** Hedge a read still running after this many times the median read time; 0 disables hedging. */
  readonly hedgeFactor: number;
  /** Keys asked for per ListObjectsV2 page (at most 1000, S3's own limit). */
  readonly listPageSize?: number;
  /** Hedges never start sooner than this (ms). */
  readonly hedgeMinMs?: number;
  /** Uniform [0, 1) source for jitter (injected in tests). */
  readonly random?: () => number;
  /** Monotonic clock in ms. */
  readonly now?: () => number;
  /** A ready client (tests); replaces every client option above. */
  readonly client?: S3Client;
}

/** Why one attempt failed, and what to do about it. */
type Failure =
  | { kind: "not-found"; error: unknown }
  | { kind: "changed"; detail: string; error: unknown }
  | { kind: "fatal"; detail: string; error: unknown }
  | { kind: "retry"; detail: string; error: unknown; timeout: boolean };

class AttemptTimeout extends Error {
  constructor(message: string) {
    super(message);
    this.name = "AttemptTimeout";
  }
}

/** Recent read durations (ms), for the hedge delay. */
const HEDGE_WINDOW = 64;
const HEDGE_MIN_SAMPLES = 8;

/**
 * Serves the objects under `s3://bucket/prefix`. The object's ETag is its version: every
 * range GET carries `If-Match`, so a changed object fails the read with `OBJECT_CHANGED`
 * (the cache then re-reads its metadata) instead of mixing bytes of two versions.
 *
 * @example
 * ```ts
 * const origin = new S3Origin({
 *   name: "data", bucket: "datasets", prefix: "gpt/", concurrency: 16, timeoutMs: 5000,
 *   retry: { retries: 4, baseMs: 50, capMs: 2000 }, hedgeFactor: 3,
 * });
 * const info = await origin.stat("shard-0001.bin");
 * ```
 */
export class S3Origin implements Origin {
  readonly name: string;
  /** The HTTP client its requests go through. */
  readonly http: S3Http;
  readonly #bucket: string;
  readonly #prefix: string;
  readonly #client: S3Client;
  readonly #pool: FetchPool | undefined;
  readonly #timeoutMs: number;
  readonly #retry: RetryPolicy;
  readonly #hedgeFactor: number;
  readonly #hedgeMinMs: number;
  readonly #maxHedges: number;
  readonly #listPageSize: number;
  readonly #random: () => number;
  readonly #now: () => number;
  /** Recent reads: duration and size (for the hedge delay of a read of another size). */
  readonly #recent: { ms: number; bytes: number }[] = [];
  #recentNext = 0;
  #hedgesInFlight = 0;
  readonly #stats = { retries: 0, failedAttempts: 0, timeouts: 0, hedges: 0, hedgeWins: 0 };
  #readObserver: ((t: ReadTiming) => void) | undefined;
  #throttleObserver: (() => void) | undefined;

  /**
   * @param opts bucket, prefix, client settings and fault policy
   * @throws {RangeError} on a bad option
   */
  constructor(opts: S3OriginOptions) {
    if (!/^[a-z0-9][a-z0-9.-]{1,62}$/.test(opts.bucket)) {
      throw new RangeError(`Cannot create S3Origin "${opts.name}": invalid bucket name "${opts.bucket}"`);
    }
    if (opts.prefix !== "" && !opts.prefix.endsWith("/")) {
      throw new RangeError(`Cannot create S3Origin "${opts.name}": prefix must be empty or end in "/", received "${opts.prefix}"`);
    }
    if (!(opts.timeoutMs > 0)) {
      throw new RangeError(`Cannot create S3Origin "${opts.name}": timeoutMs must be > 0, received ${opts.timeoutMs}`);
    }
    if (opts.http !== undefined && opts.http !== "node" && opts.http !== "fetch") {
      throw new RangeError(`Cannot create S3Origin "${opts.name}": http must be "node" or "fetch", received ${JSON.stringify(opts.http)}`);
    }
    if (!Number.isSafeInteger(opts.concurrency) || opts.concurrency < 1) {
      throw new RangeError(`Cannot create S3Origin "${opts.name}": concurrency must be an integer >= 1, received ${opts.concurrency}`);
    }
    this.name = opts.name;
    this.http = opts.http ?? "node";
    this.#bucket = opts.bucket;
    this.#prefix = opts.prefix;
    this.#timeoutMs = opts.timeoutMs;
    this.#retry = opts.retry;
    this.#hedgeFactor = opts.hedgeFactor;
    this.#hedgeMinMs = opts.hedgeMinMs ?? 20;
    // Hedges add load exactly when the origin is slow; a quarter of the slots bounds that.
    this.#maxHedges = Math.max(1, Math.floor(opts.concurrency / 4));
    this.#listPageSize = Math.min(1000, Math.max(1, opts.listPageSize ?? 1000));
    this.#random = opts.random ?? Math.random;
    this.#now = opts.now ?? (() => performance.now());
    const maxConnections = Math.max(opts.concurrency, opts.maxConcurrency ?? 0) + this.#maxHedges;
    this.#pool = !opts.client && this.http === "fetch" ? opts.fetchPool?.(maxConnections) : undefined;
    this.#client = opts.client ?? new S3Client(clientConfig(opts, maxConnections, this.#pool));
  }

  async stat(key: string, signal?: AbortSignal): Promise<ObjectInfo> {
    const full = this.#prefix + key;
    const out = await this.#withRetries(`stat "${key}"`, signal, async (s) => {
      return await this.#client.send(new HeadObjectCommand({ Bucket: this.#bucket, Key: full }), { abortSignal: s });
    }, key);
    const size = out.ContentLength;
    if (size === undefined || !Number.isSafeInteger(size) || size < 0) {
      throw new OriginError("ORIGIN_UNAVAILABLE", `Origin "${this.name}" gave no size for "${key}"`);
    }
    const lastModified = out.LastModified ?? new Date(0);
    const tag = out.ETag?.replace(/^W\//, "").replace(/^"|"$/g, "");
    // Without an ETag (unusual) the version is size + mtime, and reads cannot use If-Match.
    const version = tag ? tag : `mtime:${size.toString(36)}-${lastModified.getTime().toString(36)}`;
    return { size, version, etag: `"${version}"`, lastModified };
  }

  async read(key: string, info: ObjectInfo, offset: number, dest: Uint8Array, signal?: AbortSignal): Promise<void> {
    if (dest.length === 0) return;
    if (offset < 0 || offset + dest.length > info.size) {
      throw new RangeError(`Cannot read "${key}": range ${offset}-${offset + dest.length - 1} exceeds size ${info.size}`);
    }
    const what = `reading "${key}" bytes ${offset}-${offset + dest.length - 1}`;
    await this.#withRetries(what, signal, (s, progress) => this.#readHedged(key, info, offset, dest, s, progress), key, dest.length);
  }

  async list(prefix: string, limit: number): Promise<ListedObject[]> {
    const out: ListedObject[] = [];
    let token: string | undefined;
    do {
      const page = await this.#withRetries(`listing "${prefix}"`, undefined, (s) =>
        this.#client.send(
          new ListObjectsV2Command({
            Bucket: this.#bucket,
            Prefix: this.#prefix + prefix,
            MaxKeys: Math.min(this.#listPageSize, limit - out.length),
            ContinuationToken: token,
          }),
          { abortSignal: s },
        ), prefix);
      for (const o of page.Contents ?? []) {
        if (out.length >= limit) break;
        if (o.Key === undefined || !o.Key.startsWith(this.#prefix)) continue;
        out.push({ key: o.Key.slice(this.#prefix.length), size: o.Size ?? 0 });
      }
      token = page.IsTruncated ? page.NextContinuationToken : undefined;
    } while (token !== undefined && out.length < limit);
    return out;
  }

  observeReads(observer: (t: ReadTiming) => void): void {
    this.#readObserver = observer;
  }

  observeThrottling(observer: () => void): void {
    this.#throttleObserver = observer;
  }

  requestStats(): OriginRequestStats {
    return { ...this.#stats };
  }

  close(): Promise<void> {
    this.#client.destroy();
    this.#pool?.close();
    return Promise.resolve();
  }

  /** Runs `attempt` until it succeeds, fails for good, or the retries are spent. */
  async #withRetries<T>(
    what: string,
    signal: AbortSignal | undefined,
    attempt: (s: AbortSignal, progress: () => void) => Promise<T>,
    key: string,
    bytes = 0,
  ): Promise<T> {
    for (let retry = 0;; retry++) {
      let failure: Failure;
      try {
        // A body that keeps trickling re-arms the stall timeout for ever: the attempt has a deadline too.
        return await this.#timed(signal, attempt, readDeadlineMs(this.#timeoutMs, bytes));
      } catch (e) {
        if (signal?.aborted) throw signal.reason;
        failure = classify(e);
        if (isThrottle(e)) this.#throttleObserver?.();
      }
      if (failure.kind === "not-found") {
        throw new OriginError("OBJECT_NOT_FOUND", `Object "${key}" not found in origin "${this.name}"`, { cause: failure.error });
      }
      this.#stats.failedAttempts++;
      if (failure.kind === "changed") {
        throw new OriginError(
          "OBJECT_CHANGED",
          `Object "${key}" in origin "${this.name}" changed while ${what} (${failure.detail})`,
          { cause: failure.error },
        );
      }
      if (failure.kind === "retry" && failure.timeout) this.#stats.timeouts++;
      if (failure.kind === "fatal" || retry >= this.#retry.retries) {
        const attempts = retry + 1;
        const timeout = failure.kind === "retry" && failure.timeout;
        throw new OriginError(
          timeout ? "ORIGIN_TIMEOUT" : "ORIGIN_UNAVAILABLE",
          `Origin "${this.name}" failed ${what}: ${failure.detail}` +
            (failure.kind === "retry" ? ` (${attempts} attempt${attempts === 1 ? "" : "s"})` : ""),
          // Retries spent on silence, refusals or server errors: the store is out of reach. A
          // store that throttles or refuses this one request (403, 400) is answering.
          { cause: failure.error, unreachable: failure.kind === "retry" && !isThrottle(failure.error) },
        );
      }
      this.#stats.retries++;
      await sleep(backoffDelay(retry, this.#retry, this.#random), signal);
    }
  }

  /**
   * One attempt under a stall timeout: the attempt's signal aborts when `timeoutMs` passes
   * with no progress (`progress()` re-arms it, called per body chunk), when the whole attempt
   * outlasts `deadlineMs` (a body that trickles), or when the caller aborts.
   */
  async #timed<T>(outer: AbortSignal | undefined, attempt: (s: AbortSignal, progress: () => void) => Promise<T>, deadlineMs: number): Promise<T> {
    const ctl = new AbortController();
    // Progress only stamps the time (it runs per body chunk); the one timer checks the stamp
    // when it fires and sleeps again for what is left.
    const start = this.#now();
    let last = start;
    const check = () => {
      const now = this.#now();
      const idle = now - last;
      const left = deadlineMs - (now - start);
      if (idle >= this.#timeoutMs) ctl.abort(new AttemptTimeout(`no answer within ${this.#timeoutMs} ms`));
      else if (left <= 0) ctl.abort(new AttemptTimeout(`the body still incomplete after ${deadlineMs} ms (slower than ${MIN_ORIGIN_BYTES_PER_S} bytes/s)`));
      else timer = setTimeout(check, Math.min(this.#timeoutMs - idle, left));
    };
    let timer: ReturnType<typeof setTimeout> | undefined = setTimeout(check, this.#timeoutMs);
    const onOuter = () => ctl.abort(outer!.reason);
    outer?.addEventListener("abort", onOuter, { once: true });
    try {
      return await attempt(ctl.signal, () => (last = this.#now()));
    } catch (e) {
      // An abort surfaces as the SDK's AbortError or a socket error; report the real reason.
      if (ctl.signal.aborted) throw ctl.signal.reason;
      throw e;
    } finally {
      clearTimeout(timer);
      outer?.removeEventListener("abort", onOuter);
    }
  }

  /** One GET, plus a second one if the first is much slower than recent reads; first to finish wins. */
  async #readHedged(
    key: string,
    info: ObjectInfo,
    offset: number,
    dest: Uint8Array,
    signal: AbortSignal,
    progress: () => void,
  ): Promise<void> {
    const t0 = this.#now();
    const delay = this.#hedgeDelay(dest.length);
    if (delay === undefined) {
      await this.#readOnce(key, info, offset, dest, signal, progress, () => false);
      this.#record(this.#now() - t0, dest.length);
      return;
    }
    // Both GETs write the same bytes (If-Match pins the version) into the same buffer; once one
    // has finished, `stopped` keeps the other from writing at all, and it is aborted.
    let winner = -1;
    const ctls = [new AbortController(), new AbortController()];
    const link = () => ctls.forEach((c) => c.abort(signal.reason));
    signal.addEventListener("abort", link, { once: true });
    let hedgeTimer: ReturnType<typeof setTimeout> | undefined;
    try {
      await new Promise<void>((resolve, reject) => {
        let running = 0;
        let firstError: unknown;
        const start = (i: number) => {
          running++;
          return this.#readOnce(key, info, offset, dest, ctls[i].signal, progress, () => winner !== -1 && winner !== i)
            .then(() => {
              if (winner === -1) {
                winner = i;
                resolve();
              }
            }, (e) => {
              firstError ??= e;
              // Fail only when every GET started has failed; a running one may still win.
              if (--running === 0 && winner === -1) reject(firstError);
            });
        };
        start(0);
        hedgeTimer = setTimeout(() => {
          if (winner !== -1 || running === 0 || this.#hedgesInFlight >= this.#maxHedges) return;
          this.#hedgesInFlight++;
          this.#stats.hedges++;
          start(1).finally(() => this.#hedgesInFlight--);
        }, delay);
      });
      if (winner === 1) this.#stats.hedgeWins++;
      this.#record(this.#now() - t0, dest.length);
    } finally {
      clearTimeout(hedgeTimer);
      signal.removeEventListener("abort", link);
      for (const c of ctls) c.abort(new Error("hedged read settled"));
    }
  }

  /** One ranged GET with If-Match, copied chunk by chunk into `dest`. */
  async #readOnce(
    key: string,
    info: ObjectInfo,
    offset: number,
    dest: Uint8Array,
    signal: AbortSignal,
    progress: () => void,
    stopped: () => boolean,
  ): Promise<void> {
    const end = offset + dest.length - 1;
    // A version without an ETag (see `stat`) contains ":"; S3 ETags never do.
    const originEtag = info.version.includes(":") ? undefined : info.etag;
    const t0 = this.#now();
    const out = await this.#client.send(
      new GetObjectCommand({
        Bucket: this.#bucket,
        Key: this.#prefix + key,
        Range: `bytes=${offset}-${end}`,
        ...(originEtag ? { IfMatch: originEtag } : {}),
      }),
      { abortSignal: signal },
    );
    const firstByte = this.#now();
    const body = bodyChunks(out.Body, signal);
    try {
      // Servers that ignore If-Match would answer with another version: check what came back.
      const total = /\/(\d+)$/.exec(out.ContentRange ?? "")?.[1];
      if (total !== undefined && Number(total) !== info.size) {
        throw new ChangedError(`size ${info.size} -> ${total}`);
      }
      if (originEtag && out.ETag && out.ETag !== originEtag) throw new ChangedError(`ETag ${originEtag} -> ${out.ETag}`);
      if (!body) throw new ShortBodyError(0, dest.length);
      let at = 0;
      for (let chunk = await body.next(); chunk !== undefined; chunk = await body.next()) {
        if (stopped()) return;
        if (at + chunk.length > dest.length) throw new ShortBodyError(at + chunk.length, dest.length);
        dest.set(chunk, at);
        at += chunk.length;
        progress();
      }
      if (at !== dest.length && !stopped()) throw new ShortBodyError(at, dest.length);
      if (!stopped()) this.#readObserver?.({ bytes: dest.length, firstByteMs: firstByte - t0, totalMs: this.#now() - t0 });
    } finally {
      body?.close();
    }
  }

  #hedgeDelay(bytes: number): number | undefined {
    if (this.#hedgeFactor <= 0 || this.#recent.length < HEDGE_MIN_SAMPLES) return undefined;
    // A read larger than its peers (adaptive parts grew) may take longer: scale their times up
    // to its size (never down: small reads are dominated by latency), so it is not hedged early.
    const sorted = this.#recent.map((r) => r.ms * Math.max(1, bytes / Math.max(1, r.bytes))).sort((a, b) => a - b);
    return Math.max(this.#hedgeMinMs, this.#hedgeFactor * sorted[sorted.length >> 1]);
  }

  #record(ms: number, bytes: number): void {
    this.#recent[this.#recentNext] = { ms, bytes };
    this.#recentNext = (this.#recentNext + 1) % HEDGE_WINDOW;
  }
}

/** A response body read chunk by chunk, that ends when its signal aborts (see `bodyChunks`). */
interface BodyChunks {
  /** The next chunk; `undefined` at the end; rejects with the signal's reason once it aborts. */
  next(): Promise<Uint8Array | undefined>;
  /** Lets the body go (read whole or not): its connection is closed or given back. */
  close(): void;
}

/**
 * Wraps a GetObject body: node:http's Readable (ended by `destroy`) or fetch's ReadableStream
 * (ended by its reader's `cancel`). A read waiting for a chunk rejects as soon as `signal`
 * aborts, without waiting for the HTTP client to act on the abort: Deno's fetch, aborted while
 * a body stalled, left the body's read pending for good (reads hung past every timeout in a
 * fault soak), so a stall timeout must not depend on the client's cooperation.
 */
function bodyChunks(raw: unknown, signal: AbortSignal): BodyChunks | undefined {
  if (!raw) return undefined;
  const readable = raw as { destroy?: (e?: Error) => void; getReader?: () => ReadableStreamDefaultReader<Uint8Array> } & AsyncIterable<Uint8Array>;
  const reader = typeof readable.getReader === "function" ? readable.getReader() : undefined;
  const iterator = reader ? undefined : readable[Symbol.asyncIterator]();
  let closed = false;
  let ended = false;
  const close = () => {
    if (closed) return;
    closed = true;
    signal.removeEventListener("abort", onAbort);
    // A body read to its end leaves its connection to the keep-alive pool; any other is cut.
    if (ended) return;
    if (reader) reader.cancel().catch(() => {});
    else readable.destroy?.();
  };
  // The read in progress, if any: the abort rejects it at once. No promise outlives its read
  // (racing every read against one long-lived "aborted" promise kept every chunk reachable from
  // that promise's reactions until the body ended: twice the part's bytes in memory).
  let pending: ((reason: unknown) => void) | undefined;
  const onAbort = () => {
    const reject = pending;
    pending = undefined;
    reject?.(signal.reason);
    close();
  };
  if (signal.aborted) onAbort();
  else signal.addEventListener("abort", onAbort, { once: true });
  return {
    next() {
      if (signal.aborted) return Promise.reject(signal.reason);
      return new Promise<Uint8Array | undefined>((resolve, reject) => {
        pending = reject;
        (reader ? reader.read() : iterator!.next()).then(
          (r) => {
            // Abandoned by an abort: the chunk is dropped, never handed out.
            if (pending !== reject) return;
            pending = undefined;
            if (signal.aborted) return reject(signal.reason);
            if (r.done) ended = true;
            resolve(r.done ? undefined : r.value);
          },
          (e) => {
            if (pending !== reject) return;
            pending = undefined;
            reject(e);
          },
        );
      });
    },
    close,
  };
}

class ChangedError extends Error {
  constructor(detail: string) {
    super(detail);
    this.name = "ChangedError";
  }
}

class ShortBodyError extends Error {
  constructor(got: number, want: number) {
    super(got > want ? `response body longer than the ${want} bytes asked for` : `response body ended after ${got} of ${want} bytes`);
    this.name = "ShortBodyError";
  }
}

const RETRY_CODES = new Set([
  "ECONNRESET",
  "ECONNREFUSED",
  "EPIPE",
  "ETIMEDOUT",
  "ECONNABORTED",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EAI_AGAIN",
  "UND_ERR_SOCKET",
  "ERR_STREAM_PREMATURE_CLOSE",
]);

/** Whether a failed attempt was the store asking us to slow down (503 SlowDown, 429, throttling errors). */
function isThrottle(e: unknown): boolean {
  const err = e as { name?: string; $metadata?: { httpStatusCode?: number } };
  const status = err?.$metadata?.httpStatusCode;
  return status === 503 || status === 429 || /Throttl|SlowDown/.test(err?.name ?? "");
}

/** Decides what a failed attempt means: not found, changed, retry, or give up. */
function classify(e: unknown): Failure {
  if (isCacheServerError(e)) return { kind: "fatal", detail: e.message, error: e };
  if (e instanceof AttemptTimeout) return { kind: "retry", detail: e.message, error: e, timeout: true };
  if (e instanceof ChangedError) return { kind: "changed", detail: e.message, error: e };
  if (e instanceof ShortBodyError) return { kind: "retry", detail: e.message, error: e, timeout: false };
  const err = e as { name?: string; code?: string; message?: string; cause?: { code?: string; message?: string }; $metadata?: { httpStatusCode?: number } };
  const status = err.$metadata?.httpStatusCode;
  const name = err.name ?? "Error";
  // fetch says only "fetch failed"; what went wrong (refused, reset, DNS) is in its cause.
  const cause = err.cause?.message ? `: ${err.cause.message}` : "";
  const detail = status ? `HTTP ${status} ${name}` : `${err.code ?? name}: ${err.message ?? String(e)}${cause}`;
  if (status === 404 || name === "NoSuchKey" || name === "NotFound") {
    if (name === "NoSuchBucket") return { kind: "fatal", detail: `bucket does not exist (${detail})`, error: e };
    return { kind: "not-found", error: e };
  }
  if (status === 412 || name === "PreconditionFailed") return { kind: "changed", detail: "ETag no longer matches (HTTP 412)", error: e };
  if (status === 416 || name === "InvalidRange") return { kind: "changed", detail: "object is shorter now (HTTP 416)", error: e };
  if (status !== undefined && (status >= 500 || status === 429 || status === 408)) {
    return { kind: "retry", detail, error: e, timeout: false };
  }
  if (/Throttl|SlowDown|RequestTimeout|ServiceUnavailable|InternalError/.test(name)) {
    return { kind: "retry", detail, error: e, timeout: false };
  }
  if (status !== undefined) return { kind: "fatal", detail, error: e };
  if (name === "TimeoutError") return { kind: "retry", detail, error: e, timeout: true };
  // No HTTP status: the connection failed (refused, reset, closed early) or the answer was garbled.
  const code = err.code ?? err.cause?.code;
  if (code && RETRY_CODES.has(code)) return { kind: "retry", detail, error: e, timeout: false };
  // An endpoint whose TLS certificate is refused answers the same way every time: no retries,
  // and the message says what to fix. Messages are read without URLs (fetch's name the request,
  // whose key may hold any word).
  const text = `${err.message ?? ""} ${err.cause?.message ?? ""}`.replace(/https?:\/\/\S*/g, "");
  if (code === "ERR_TLS_CERT_ALTNAME_INVALID" || /NotValidForName|does not match certificate/i.test(text)) {
    return { kind: "fatal", detail: `${detail} (the endpoint's TLS certificate does not name its host: check the endpoint, and use path-style addressing for bucket names with dots)`, error: e };
  }
  if (
    /^(SELF_SIGNED_CERT_IN_CHAIN|DEPTH_ZERO_SELF_SIGNED_CERT|UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT(_LOCALLY)?|CERT_HAS_EXPIRED|CERT_NOT_YET_VALID|CERT_UNTRUSTED|CERT_REJECTED)$/.test(code ?? "") ||
    /invalid peer certificate|self[- ]signed certificate|unable to (verify|get local issuer)|certificate has expired/i.test(text)
  ) {
    return {
      kind: "fatal",
      detail: `${detail} (the endpoint's TLS certificate is refused: expired, or signed by a CA not trusted here; for a private CA set NODE_EXTRA_CA_CERTS, or DENO_CERT for Deno's fetch)`,
      error: e,
    };
  }
  if (/socket hang up|aborted|premature|ECONNRESET|terminated|other side closed/i.test(err.message ?? "")) {
    return { kind: "retry", detail, error: e, timeout: false };
  }
  if (name === "CredentialsProviderError" || /Region is missing|credential/i.test(err.message ?? "")) {
    return { kind: "fatal", detail: `${err.message} (configure credentials/region: AWS_* environment or profile)`, error: e };
  }
  return { kind: "retry", detail, error: e, timeout: false };
}

function clientConfig(opts: S3OriginOptions, maxSockets: number, pool: FetchPool | undefined): S3ClientConfig {
  const hasEndpoint = opts.endpoint !== undefined;
  return {
    ...(opts.region ? { region: opts.region } : {}),
    ...(opts.endpoint ? { endpoint: opts.endpoint } : {}),
    forcePathStyle: opts.forcePathStyle ?? hasEndpoint,
    ...(opts.credentials ? { credentials: opts.credentials } : {}),
    // rackfeed retries itself (backoff, stall timeouts, hedges, counters); SDK retries would compound.
    maxAttempts: 1,
    // Ranged GETs carry no full-object checksum, and the block cache checks sizes and ETags itself.
    requestChecksumCalculation: "WHEN_REQUIRED",
    responseChecksumValidation: "WHEN_REQUIRED",
    requestHandler: opts.http === "fetch"
      // The runtime's fetch keeps its own pool (never more connections than requests in flight,
      // which the gateway bounds); the origin's own when the runtime gives one.
      ? new FetchHttpHandler(pool ? { requestInit: () => pool.init as RequestInit } : {})
      // A keep-alive pool as large as the requests this origin may have in flight (hedges included).
      : { httpAgent: { keepAlive: true, maxSockets }, httpsAgent: { keepAlive: true, maxSockets } },
  } as S3ClientConfig;
}
