/** @module How the cache talks to one origin: bounded concurrency, a short-lived metadata cache, and counters per decision. */

import { setMaxListeners } from "node:events";
import { LRUCache } from "lru-cache";
import { isCacheServerError, OriginError } from "../errors.ts";
import { ConcurrencyLimiter } from "./limiter.ts";
import { PartSizer } from "./part-sizer.ts";
import type { ListedObject, ObjectInfo, Origin } from "./origin.ts";

/** Counters of one origin, read by `metrics/` at scrape time. */
export interface OriginStats {
  readonly name: string;
  /** Requests sent, by operation. */
  readonly requests: { stat: number; read: number; list: number };
  /** Payload bytes read. */
  readonly bytes: number;
  /** Failed requests (not-found answers are not failures); each failed attempt counts, retried ones too. */
  readonly errors: number;
  /** Requests tried again after a failure (remote origins). */
  readonly retries: number;
  /** Attempts abandoned by the per-request timeout. */
  readonly timeouts: number;
  /** Hedged second requests sent, and how many of them finished first. */
  readonly hedges: number;
  readonly hedgeWins: number;
  /** Stat answers served from the metadata cache. */
  readonly metadataHits: number;
  readonly active: number;
  readonly queued: number;
  /** Origin reads allowed in flight now (halved on throttling, regained one per window). */
  readonly concurrencyLimit: number;
  /** What the limit may grow to now: the reads Little's law asks for the target bandwidth at the measured latency and bandwidth. */
  readonly concurrencyCeiling: number;
  /** Throttled attempts reported by the origin. */
  readonly throttled: number;
  /** Whether the origin is judged down (its last requests all failed; see `OriginGateway`). */
  readonly down: boolean;
  /** Origin read size now, and what it comes from (remote origins with adaptive parts). */
  readonly partBytes?: number;
  readonly firstByteSeconds?: number;
  readonly streamBytesPerSecond?: number;
}

/** Options of `OriginGateway`. */
export interface OriginGatewayOptions {
  /** Origin reads in flight at once, at first; the limit never adapts below 1 or above `maxConcurrency`. */
  readonly concurrency: number;
  /**
   * Most reads in flight the limit may grow to when the origin's measured latency × bandwidth
   * needs them for `targetBytesPerSecond` (default `concurrency`: a fixed limit). Needs read
   * timings from the origin (`Origin.observeReads`, with `parts`).
   */
  readonly maxConcurrency?: number;
  /** The bandwidth the adaptive limit aims to sustain, in bytes per second (default 1 GiB/s). */
  readonly targetBytesPerSecond?: number;
  /** Reads that may wait for a slot. */
  readonly maxQueue: number;
  /** How long a stat answer is trusted, in ms; 0 asks the origin every time. */
  readonly metadataTtl: number;
  /** Clock for the metadata TTL (injected in tests). */
  readonly now?: () => number;
  /**
   * Adaptive parts: the configured part size (the minimum) and the block size (the maximum).
   * Used when the origin reports read timings (`Origin.observeReads`); absent: fixed parts.
   */
  readonly parts?: { readonly minBytes: number; readonly maxBytes: number };
}

/**
 * Wraps an `Origin` with what every origin needs the same way: a limit on requests in flight
 * (with a bounded queue), a TTL cache of object metadata (single-flight, so a burst of
 * requests for one object asks the origin once), and counters.
 *
 * @example
 * ```ts
 * const gw = new OriginGateway(new FsOrigin({ name: "data", root }), { concurrency: 16, maxQueue: 4096, metadataTtl: 1000 });
 * const info = await gw.stat("a.bin");
 * ```
 */
export class OriginGateway {
  readonly origin: Origin;
  readonly #limiter: ConcurrencyLimiter;
  readonly #meta: LRUCache<string, ObjectInfo> | undefined;
  readonly #statFlights = new Map<string, Promise<ObjectInfo>>();
  readonly #requests = { stat: 0, read: 0, list: 0 };
  #bytes = 0;
  #errors = 0;
  #metadataHits = 0;
  readonly #sizer: PartSizer | undefined;
  readonly #minCeiling: number;
  readonly #maxConcurrency: number;
  readonly #targetBytesPerMs: number;
  readonly #clock: () => number;
  /** False until the first throttle: until then the limit doubles per window (slow start), then it grows by one. */
  #everThrottled = false;
  #throttled = 0;
  #lastCut = -Infinity;
  #sinceRaise = 0;
  /** Requests in a row that failed for good with the origin down or silent; a success resets it. */
  #failuresInRow = 0;
  /** While the origin is judged down: the error queued and new requests get. */
  #down: OriginError | undefined;
  /** Aborted when the origin goes down: requests waiting for a slot leave the queue at once. */
  #queueGate = queueGate();
  /** While down, one request at a time goes to the origin to see whether it is back. */
  #probing = false;

  /**
   * @param origin the origin to wrap
   * @param opts limits and TTL
   * @throws {RangeError} on a bad option
   */
  constructor(origin: Origin, opts: OriginGatewayOptions) {
    this.origin = origin;
    this.#limiter = new ConcurrencyLimiter({
      concurrency: opts.concurrency,
      maxQueue: opts.maxQueue,
      what: `origin "${origin.name}"`,
    });
    this.#minCeiling = opts.concurrency;
    this.#maxConcurrency = opts.maxConcurrency ?? opts.concurrency;
    if (!Number.isSafeInteger(this.#maxConcurrency) || this.#maxConcurrency < opts.concurrency) {
      throw new RangeError(`Cannot create OriginGateway: maxConcurrency must be an integer >= concurrency (${opts.concurrency}), received ${opts.maxConcurrency}`);
    }
    const target = opts.targetBytesPerSecond ?? 2 ** 30;
    if (!(target > 0)) throw new RangeError(`Cannot create OriginGateway: targetBytesPerSecond must be > 0, received ${target}`);
    this.#targetBytesPerMs = target / 1000;
    this.#clock = opts.now ?? (() => performance.now());
    origin.observeThrottling?.(() => this.#onThrottle());
    if (opts.parts && origin.observeReads) {
      const sizer = new PartSizer(opts.parts);
      origin.observeReads((t) => sizer.observe(t));
      this.#sizer = sizer;
    }
    if (!(opts.metadataTtl >= 0)) {
      throw new RangeError(`Cannot create OriginGateway: metadataTtl must be >= 0 ms, received ${opts.metadataTtl}`);
    }
    if (opts.metadataTtl > 0) {
      const now = opts.now;
      this.#meta = new LRUCache<string, ObjectInfo>({
        max: 100_000,
        ttl: opts.metadataTtl,
        ttlAutopurge: false,
        // lru-cache otherwise re-reads the clock through a 1 ms timer; 100 ms is ample for a TTL.
        ttlResolution: 100,
        ...(now ? { perf: { now } } : {}),
      });
    }
  }

  /** The origin's name. */
  get name(): string {
    return this.origin.name;
  }

  /** The read size for a new block fill: adaptive for remote origins, else undefined (the cache's own). */
  partBytes(): number | undefined {
    return this.#sizer?.partBytes;
  }

  /** Size and version of an object, from the metadata cache when fresh. */
  stat(key: string): Promise<ObjectInfo> {
    const cached = this.#meta?.get(key);
    if (cached) {
      this.#metadataHits++;
      return Promise.resolve(cached);
    }
    let flight = this.#statFlights.get(key);
    if (!flight) {
      flight = this.#count("stat", () => this.origin.stat(key)).then((info) => {
        this.#meta?.set(key, info);
        return info;
      }).finally(() => this.#statFlights.delete(key));
      this.#statFlights.set(key, flight);
    }
    return flight;
  }

  /** Forgets the metadata of `key` (after the origin said it changed). */
  invalidate(key: string): void {
    this.#meta?.delete(key);
  }

  /**
   * Positional read into `dest`, under the concurrency limit (`background`: behind foreground
   * reads). Reads of one `group` (the parts of a block) fail together: the first that fails aborts
   * the group before its slot passes on, and the others then leave the queue unread (an S3 read
   * in flight is aborted too), so a dead origin does not keep slots busy for bytes nobody wants.
   */
  async read(
    key: string,
    info: ObjectInfo,
    offset: number,
    dest: Uint8Array,
    opts: { background?: boolean; group?: AbortController; promote?: AbortSignal } = {},
  ): Promise<void> {
    const group = opts.group;
    await this.#count("read", () => this.origin.read(key, info, offset, dest, group?.signal), opts.background === true, group, opts.promote);
    this.#bytes += dest.length;
    this.#onSuccess();
  }

  /** Lists objects under a prefix. */
  list(prefix: string, limit: number): Promise<ListedObject[]> {
    return this.#count("list", () => this.origin.list(prefix, limit));
  }

  /** A snapshot of the counters. */
  stats(): OriginStats {
    const l = this.#limiter.stats();
    const r = this.origin.requestStats?.();
    const parts = this.#sizer?.stats();
    return {
      name: this.origin.name,
      requests: { ...this.#requests },
      bytes: this.#bytes,
      // Final failures are counted here; the attempts an origin retried (each one a failed
      // request) are added from its own counters.
      errors: this.#errors + (r?.retries ?? 0),
      retries: r?.retries ?? 0,
      timeouts: r?.timeouts ?? 0,
      hedges: r?.hedges ?? 0,
      hedgeWins: r?.hedgeWins ?? 0,
      metadataHits: this.#metadataHits,
      active: l.active,
      queued: l.queued,
      concurrencyLimit: this.#limiter.concurrency,
      concurrencyCeiling: this.#ceiling(),
      throttled: this.#throttled,
      down: this.#down !== undefined,
      ...(parts ? { partBytes: parts.partBytes, firstByteSeconds: parts.firstByteSeconds, streamBytesPerSecond: parts.bytesPerSecond } : {}),
    };
  }

  /**
   * AIMD, as TCP does with its window: a throttled attempt halves the reads in flight (at most
   * once a second, so one burst of SlowDowns is one cut), and each window's worth of successful
   * reads gives one slot back, up to the ceiling. Before the first throttle each window doubles
   * the limit instead (TCP's slow start), so a far origin reaches its ceiling in a few windows.
   */
  #onThrottle(): void {
    this.#throttled++;
    this.#everThrottled = true;
    const now = this.#clock();
    if (now - this.#lastCut < 1000) return;
    this.#lastCut = now;
    this.#sinceRaise = 0;
    this.#limiter.setConcurrency(Math.max(1, Math.floor(this.#limiter.concurrency / 2)));
  }

  #onSuccess(): void {
    const limit = this.#limiter.concurrency;
    const ceiling = this.#ceiling();
    if (limit > ceiling) {
      // The origin got nearer or faster: fewer reads in flight sustain the target.
      this.#sinceRaise = 0;
      this.#limiter.setConcurrency(ceiling);
      return;
    }
    if (limit === ceiling) return;
    if (++this.#sinceRaise >= limit) {
      this.#sinceRaise = 0;
      this.#limiter.setConcurrency(Math.min(ceiling, this.#everThrottled ? limit + 1 : limit * 2));
    }
  }

  /**
   * The reads in flight that sustain the target bandwidth (Little's law): each read of a part
   * takes first byte + part ÷ one connection's bandwidth, so `target × that time ÷ part` of them
   * must overlap. Between `concurrency` and `maxConcurrency`; `concurrency` until reads are timed.
   * From the shortest first byte and fastest connection seen, not the recent averages: our own
   * reads share the origin, so under load each connection looks slower, and averages would ask
   * for ever more reads from an origin that is simply full (a runaway to the maximum).
   */
  #ceiling(): number {
    const est = this.#sizer?.stats();
    if (this.#maxConcurrency === this.#minCeiling || !est || !est.warm) return this.#minCeiling;
    const part = est.partBytes;
    const readMs = est.minFirstByteSeconds * 1000 + part / (est.maxBytesPerSecond / 1000);
    const needed = Math.ceil((this.#targetBytesPerMs * readMs) / part);
    return Math.min(this.#maxConcurrency, Math.max(this.#minCeiling, needed));
  }

  /**
   * Runs one origin request in a slot. Circuit breaking: once as many requests in a row as there
   * are slots have failed for good with the origin out of reach (no answer, refused, server
   * errors after the origin's own retries; not a forbidden key or a throttle, which are
   * answers), the origin is judged down. Requests queued behind those would each wait for a slot
   * and then the whole retry bound again, so they fail at once instead; new ones do too, except
   * one at a time, which goes to the origin as a probe. Any answer from the origin ends it.
   */
  async #count<T>(op: "stat" | "read" | "list", fn: () => Promise<T>, background = false, group?: AbortController, promote?: AbortSignal): Promise<T> {
    let probe = false;
    if (this.#down) {
      if (this.#probing) throw this.#down;
      this.#probing = probe = true;
    }
    try {
      return await this.#limiter.run(async () => {
        this.#requests[op]++;
        try {
          const result = await fn();
          this.#answered();
          return result;
        } catch (e) {
          // A read cancelled with its group (another part failed) is not an origin error.
          if (group?.signal.aborted) throw e;
          if (!(isCacheServerError(e) && e.code === "OBJECT_NOT_FOUND")) this.#errors++;
          if (e instanceof OriginError && e.unreachable) this.#unreachable(e);
          else this.#answered();
          // Here, inside the slot: once it is released the next in line starts at once.
          group?.abort(e);
          throw e;
        }
      }, { background, signal: group?.signal, gate: this.#queueGate.signal, promote });
    } finally {
      if (probe) this.#probing = false;
    }
  }

  /** The origin answered (an object, or that it is missing or changed, or forbidden): it is up. */
  #answered(): void {
    this.#failuresInRow = 0;
    this.#down = undefined;
  }

  #unreachable(e: OriginError): void {
    if (++this.#failuresInRow < Math.max(2, this.#limiter.concurrency) || this.#down) return;
    // Another request's key stays out of the message: it goes to every client while down.
    this.#down = new OriginError(
      e.code,
      `Origin "${this.name}" is down: its last ${this.#failuresInRow} requests ` +
        `${e.code === "ORIGIN_TIMEOUT" ? "got no answer in time" : "could not reach it"}; requests fail at once while one at a time tries it again`,
      { unreachable: true },
    );
    const gate = this.#queueGate;
    this.#queueGate = queueGate();
    gate.abort(this.#down);
  }
}

/**
 * The breaker's gate: every request waiting for a slot listens to it (thousands, within
 * `--origin-queue`), which is not the leak Node's warning past 10 listeners is about.
 */
function queueGate(): AbortController {
  const gate = new AbortController();
  setMaxListeners(0, gate.signal);
  return gate;
}
