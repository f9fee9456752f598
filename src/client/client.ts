/**
 * @module The TypeScript SDK: objects and dataset batches from a rackfeed server, with
 * prefetching, retries, resume from any step, and the golden metrics of a data pipeline (t_wait
 * measured here, t_h2d and t_compute given by the caller) reported back to the server. Web
 * standards only (`fetch`, typed arrays), so it runs on Deno, Node, edge runtimes and browsers;
 * given a `LocalTransport` (`client/deno.ts`, `client/node.ts`) it takes the shared-memory path
 * to a co-located server by itself.
 */

import { backoffDelay } from "../origin/retry.ts";
import { MAX_REPORT_STEPS } from "../metrics/telemetry-report.ts";
import { MAX_RING_SLOTS } from "../shm/protocol.ts";
import { type LocalTransport, ShmError, shmBatches, shmInstance, type SlotBatch } from "./shm-consumer.ts";

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
  /** The `fetch` to use; on Node pass `http2Fetch()` from `client/node.ts` for HTTP/2. */
  readonly fetch?: typeof fetch;
  /** Retries of a transient failure (network error, 429, 502, 503, 504). Default 8. */
  readonly retries?: number;
  /** First backoff in ms, doubled per retry with full jitter. Default 50. */
  readonly backoffMs?: number;
  /** Backoff cap in ms. Default 2000. */
  readonly maxBackoffMs?: number;
  /** Timings sent to the server once this many steps are queued. Default 32. */
  readonly reportEvery?: number;
  /** Monotonic clock in ms (tests inject one). */
  readonly now?: () => number;
  /** Waits `ms` (tests inject one). */
  readonly sleep?: (ms: number) => Promise<void>;
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

/** One step's timings, as reported to `POST /v1/telemetry`. */
export interface StepTimings {
  readonly step: number;
  readonly t_wait: number;
  readonly t_h2d?: number;
  readonly t_compute?: number;
}

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
  readonly #fetch: typeof fetch;
  readonly #headers: Record<string, string>;
  readonly #retries: number;
  readonly #backoff: number;
  readonly #maxBackoff: number;
  readonly #reportEvery: number;
  readonly #now: () => number;
  readonly #sleep: (ms: number) => Promise<void>;
  /** Per dataset consumer: timings not yet sent. */
  readonly #pending = new Map<string, { body: { dataset: string; rank: number; world: number; micro_batch: number }; steps: Map<number, StepTimings> }>();
  #lastConsumer: string | undefined;
  #retried = 0;

  /** @param opts server URL, token, transport and retry policy */
  constructor(opts: RackfeedClientOptions) {
    if (opts.url === undefined) {
      if (opts.socket === undefined || opts.local === undefined) {
        throw new RangeError("RackfeedClient needs a url, or a socket path with a local transport");
      }
    } else {
      let url: URL;
      try {
        url = new URL(opts.url);
      } catch {
        throw new RangeError(`Invalid rackfeed url "${opts.url}": expected e.g. http://127.0.0.1:8080`);
      }
      this.#url = url.href.replace(/\/+$/, "");
    }
    this.#socket = opts.socket;
    this.#local = opts.shm === false ? undefined : opts.local;
    this.#token = opts.token;
    this.#fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.#headers = opts.token ? { authorization: `Bearer ${opts.token}` } : {};
    this.#retries = opts.retries ?? 8;
    this.#backoff = opts.backoffMs ?? 50;
    this.#maxBackoff = opts.maxBackoffMs ?? 2000;
    this.#reportEvery = opts.reportEvery ?? 32;
    this.#now = opts.now ?? (() => performance.now());
    this.#sleep = opts.sleep ?? ((ms) => new Promise((r) => setTimeout(r, ms)));
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
  async readObject(origin: string, key: string, range: { start?: number; end?: number } = {}): Promise<Uint8Array> {
    const path = `/v1/objects/${encodeURIComponent(origin)}/${key.split("/").map(encodeURIComponent).join("/")}`;
    const headers: Record<string, string> = {};
    if (range.start !== undefined || range.end !== undefined) {
      headers.range = `bytes=${range.start ?? 0}-${range.end === undefined ? "" : range.end - 1}`;
    }
    const res = await this.#get(path, headers);
    return new Uint8Array(await res.arrayBuffer());
  }

  /** A dataset's description (`GET /v1/datasets/{name}`). */
  async describe(dataset: string): Promise<Record<string, unknown>> {
    return await (await this.#get(`/v1/datasets/${encodeURIComponent(dataset)}`)).json();
  }

  /** Samples `[start, start + count)`. */
  async samples(dataset: string, start: number, count: number): Promise<TokenBatch> {
    return await this.#tokens(`/v1/datasets/${encodeURIComponent(dataset)}/samples?start=${start}&count=${count}`);
  }

  /** Rank `rank`'s micro-batch of `step`. */
  async batch(dataset: string, step: number, c: { rank: number; world: number; microBatch: number }): Promise<TokenBatch> {
    return await this.#tokens(
      `/v1/datasets/${encodeURIComponent(dataset)}/batches/${step}?rank=${c.rank}&world=${c.world}&micro_batch=${c.microBatch}`,
    );
  }

  /**
   * Batches of one rank from `startStep` (resume anywhere) to `endStep` (exclusive; default: the
   * last full step), keeping `prefetch` requests in flight ahead of the caller. Each batch carries
   * its t_wait; a failed request is retried (same step), so a server restart costs time, never a
   * duplicate or a gap.
   */
  async *batches(
    dataset: string,
    c: { rank: number; world: number; microBatch: number; startStep?: number; endStep?: number; prefetch?: number },
  ): AsyncGenerator<StepBatch, void, undefined> {
    const depth = Math.max(1, c.prefetch ?? 2);
    let end = c.endStep;
    if (end === undefined && this.#url !== undefined) {
      const d = await this.describe(dataset);
      end = Math.floor(Number(d.numSamples) / (c.world * c.microBatch));
    }
    const consumer = { dataset, rank: c.rank, world: c.world, micro_batch: c.microBatch };
    const id = JSON.stringify(consumer);
    if (!this.#pending.has(id)) this.#pending.set(id, { body: consumer, steps: new Map() });
    this.#lastConsumer = id;
    let step = c.startStep ?? 0;
    for (let attempt = 0; end === undefined || step < end;) {
      const route = await this.#shmRouteNow();
      if (!route) break;
      // The shm path: the server fills `depth` slots ahead, plus the one the caller holds.
      const it = shmBatches(this.#local!, route.socket, route.instance, this.#token, {
        dataset,
        rank: c.rank,
        world: c.world,
        microBatch: c.microBatch,
        startStep: step,
        endStep: end,
        slots: Math.min(depth + 1, MAX_RING_SLOTS),
      });
      try {
        for (;;) {
          const t0 = this.#now();
          const r = await it.next();
          if (r.done) {
            await this.flush();
            return;
          }
          const waitSeconds = (this.#now() - t0) / 1000;
          this.#record(id, { step: r.value.step, t_wait: waitSeconds });
          attempt = 0;
          step = r.value.step + 1;
          yield { ...slotTokens(r.value), step: r.value.step, waitSeconds, transport: "shm" };
        }
      } catch (e) {
        if (!(e instanceof ShmError)) throw e;
        if (e.code === "SHM_FULL" || e.code === "SHM_UNREACHABLE") {
          this.#noShm(); // no room for a ring on this server, or no way to read it: HTTP for a while
          continue;
        }
        if (e.status !== 0 && !TRANSIENT.has(e.status)) throw new RackfeedError(e.status, e.code, e.message);
        if (attempt >= this.#retries) throw new RackfeedError(e.status, "UNAVAILABLE", `Shared-memory path failed after ${attempt + 1} attempts: ${e.message}`);
        this.#shmRoute = undefined; // a restarted server has a new instance (and maybe socket)
        this.#retried++;
        await this.#sleep(this.#backoffMs(attempt++));
      } finally {
        await it.return();
      }
    }
    if (end === undefined) throw new RangeError("batches() over a socket alone needs the shm path; give a url too");
    const inFlight = new Map<number, Promise<TokenBatch>>();
    let next = step;
    const fill = (upTo: number) => {
      for (; next < Math.min(end!, upTo); next++) {
        const p = this.batch(dataset, next, c);
        p.catch(() => {}); // surfaced when awaited, in order
        inFlight.set(next, p);
      }
    };
    for (; step < end; step++) {
      fill(step + depth);
      const t0 = this.#now();
      const b = await inFlight.get(step)!;
      inFlight.delete(step);
      const waitSeconds = (this.#now() - t0) / 1000;
      this.#record(id, { step, t_wait: waitSeconds });
      yield { ...b, step, waitSeconds, transport: "http" };
    }
    await this.flush();
  }

  /** The transport `batches()` would take now: `shm` when a co-located server's socket answers, else `http`. */
  async transport(): Promise<"shm" | "http"> {
    return (await this.#shmRouteNow()) ? "shm" : "http";
  }

  /** Finds the shm socket (asking `GET /v1/shm` unless given) and checks it leads to the same server. */
  async #shmRouteNow(): Promise<{ socket: string; instance: string | undefined } | null> {
    // Not usable is not for ever: a restarted server, freed room, a socket that came up late.
    if (this.#shmRoute === null && this.#local && this.#now() - this.#shmRouteNullAt >= SHM_RECHECK_MS) this.#shmRoute = undefined;
    if (this.#shmRoute !== undefined) return this.#shmRoute;
    if (!this.#local) return (this.#shmRoute = null);
    if (this.#socket !== undefined && this.#url === undefined) return (this.#shmRoute = { socket: this.#socket, instance: undefined });
    let info: { socket: string; instance: string };
    try {
      info = await (await this.#get("/v1/shm")).json();
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
    const id = consumer
      ? JSON.stringify({ dataset: consumer.dataset, rank: consumer.rank, world: consumer.world, micro_batch: consumer.microBatch })
      : this.#lastConsumer;
    if (id === undefined) throw new RangeError("reportStep() before any batches(): pass the consumer");
    if (!this.#pending.has(id)) this.#pending.set(id, { body: JSON.parse(id), steps: new Map() });
    this.#record(id, { step, t_wait: this.#pending.get(id)!.steps.get(step)?.t_wait ?? NaN, ...t });
  }

  /** Sends the queued timings now. */
  async flush(): Promise<void> {
    if (this.#url === undefined) return; // a socket-only client has nowhere to report
    for (const p of this.#pending.values()) {
      if (p.steps.size === 0) continue;
      const steps = [...p.steps.values()].map((s) => (Number.isNaN(s.t_wait) ? { ...s, t_wait: undefined } : s));
      p.steps.clear();
      // The server takes at most MAX_REPORT_STEPS per report (a large reportEvery queues more).
      for (let i = 0; i < steps.length; i += MAX_REPORT_STEPS) {
        await this.#request("/v1/telemetry", {
          method: "POST",
          headers: { ...this.#headers, "content-type": "application/json" },
          body: JSON.stringify({ ...p.body, steps: steps.slice(i, i + MAX_REPORT_STEPS) }),
        });
      }
    }
  }

  /** Flushes the timings. */
  async close(): Promise<void> {
    await this.flush();
  }

  /** Full-jitter backoff before retry `attempt` (the origins' policy, `backoffDelay`). */
  #backoffMs(attempt: number): number {
    return backoffDelay(attempt, { retries: this.#retries, baseMs: this.#backoff, capMs: this.#maxBackoff }, Math.random);
  }

  #record(id: string, t: StepTimings): void {
    const p = this.#pending.get(id)!;
    p.steps.set(t.step, { ...p.steps.get(t.step), ...t });
    if (p.steps.size >= this.#reportEvery) {
      // Fire and forget: telemetry must never stall the data path.
      this.flush().catch(() => {});
    }
  }

  async #tokens(path: string): Promise<TokenBatch> {
    const res = await this.#get(path);
    const dtype = res.headers.get("x-rackfeed-dtype") ?? "uint16";
    const shape = (res.headers.get("x-rackfeed-shape") ?? "0,0").split(",").map(Number) as [number, number];
    const Typed = TYPED[dtype];
    if (!Typed) throw new RackfeedError(res.status, "BAD_RESPONSE", `Unknown dtype "${dtype}" from ${path}`);
    return {
      tokens: new Typed(await res.arrayBuffer()),
      dtype,
      shape,
      firstSample: Number(res.headers.get("x-rackfeed-first-sample") ?? 0),
      cache: res.headers.get("x-rackfeed-cache") ?? "",
    };
  }

  #get(path: string, headers: Record<string, string> = {}): Promise<Response> {
    if (this.#url === undefined) throw new RangeError(`${path} needs HTTP: this client was made with a socket path only`);
    return this.#request(path, { headers: { ...this.#headers, ...headers } });
  }

  async #request(path: string, init: RequestInit): Promise<Response> {
    if (this.#url === undefined) throw new RangeError(`${path} needs HTTP: this client was made with a socket path only`);
    for (let attempt = 0;; attempt++) {
      let res: Response | undefined;
      let failure: unknown;
      try {
        res = await this.#fetch(`${this.#url}${path}`, init);
      } catch (e) {
        failure = e;
      }
      if (res && res.ok) return res;
      if (res && !TRANSIENT.has(res.status)) {
        const body = await res.json().catch(() => ({})) as { error?: string; message?: string };
        throw new RackfeedError(res.status, body.error ?? "HTTP_ERROR", body.message ?? `HTTP ${res.status} for ${path}`);
      }
      if (attempt >= this.#retries) {
        const why = res ? `HTTP ${res.status}` : (failure as Error)?.message ?? String(failure);
        throw new RackfeedError(res?.status ?? 0, "UNAVAILABLE", `${path} failed after ${attempt + 1} attempts: ${why}`);
      }
      await res?.body?.cancel();
      const retryAfter = Number(res?.headers.get("retry-after"));
      this.#retried++;
      await this.#sleep(Number.isFinite(retryAfter) && retryAfter > 0 ? Math.min(retryAfter * 1000, this.#maxBackoff) : this.#backoffMs(attempt));
    }
  }
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
