/**
 * @module The SDK's step timings on their way to the server: per consumer, a bounded queue of
 * steps (t_wait measured by `batches()`, t_h2d and t_compute given by the caller), sent in
 * reports over the consumer's shm socket when it has one, else by HTTP (`POST /v1/telemetry`),
 * always in the background: telemetry never stalls or fails the data path. Web standards only.
 */

import { MAX_REPORT_STEPS, MAX_TIMING_SECONDS, type StepTimings } from "../metrics/telemetry-report.ts";

/**
 * Most steps' timings a consumer queues: one report carries them at once, whatever `reportEvery`
 * and `reportIntervalMs` say, so the queue stays bounded (and within the server's limit per report).
 * 1024: the server handles a report in one go on its event loop, ~1.6 µs per step with all three
 * timings (prom-client histograms), so a report of 4096 held every other consumer's batches ~7 ms.
 */
export const MAX_QUEUED_STEPS = Math.min(1024, MAX_REPORT_STEPS);

/** Most reports of one consumer in flight at once (each of at most `MAX_QUEUED_STEPS` steps: 32 768 steps in all, ~2 MB). */
export const MAX_REPORTS_IN_FLIGHT = 32;

/** A consumer as a report names it (the body of `POST /v1/telemetry`, less its steps). */
export interface ReportedConsumer {
  readonly dataset: string;
  readonly rank: number;
  readonly world: number;
  readonly micro_batch: number;
}

/** A step as an HTTP report carries it: a t_wait not measured (NaN in the queue) is left out. */
export type ReportedStep = Omit<StepTimings, "t_wait"> & { readonly t_wait?: number };

/** What `StepReports` needs: its clock, when to send, and how to send over HTTP. */
export interface StepReportsOptions {
  /** Monotonic clock in ms. */
  readonly now: () => number;
  /** A consumer's steps are sent once this many are queued (and `reportIntervalMs` has passed). */
  readonly reportEvery: number;
  /** Least time between two reports of a consumer, in ms. */
  readonly reportIntervalMs: number;
  /** Sends steps of a consumer by HTTP, in as many reports as it takes; unset: a client with no URL (its shm socket is the only way). */
  readonly post: ((consumer: ReportedConsumer, steps: ReportedStep[]) => Promise<void>) | undefined;
}

/** Sends a consumer's steps over its shm socket; false when it cannot (the socket is gone). */
export type ShmTimingsSender = (steps: readonly StepTimings[]) => boolean;

/** One consumer's timings not yet sent, and when its last report went out (`now()` ms). */
interface QueuedTimings {
  readonly body: ReportedConsumer;
  readonly steps: Map<number, StepTimings>;
  sentAt: number;
  /** Its reports in flight. */
  sending: number;
  /** Which of the caller's timings it has reported: a step waits for those (see `#send`). */
  reportsH2d: boolean;
  reportsCompute: boolean;
}

/**
 * The timings of every consumer of one client, queued and reported. Consumers are named by an id
 * (the JSON of their `ReportedConsumer`).
 */
export class StepReports {
  readonly #opts: StepReportsOptions;
  /** Per consumer: timings not yet sent. */
  readonly #pending = new Map<string, QueuedTimings>();
  /** Consumers reading over shm whose server takes `timings` on their socket: their reports skip HTTP. */
  readonly #shmTimings = new Map<string, ShmTimingsSender>();
  #lastConsumer: string | undefined;
  #dropped = 0;
  /** Reports sent in the background (never on the data path); `close()` waits for them. */
  readonly #reporting = new Set<Promise<void>>();

  /** @param opts clock, thresholds and the HTTP sender */
  constructor(opts: StepReportsOptions) {
    this.#opts = opts;
  }

  /** Steps whose timings are queued for the next report, over all consumers (at most `MAX_QUEUED_STEPS` each). */
  get queuedSteps(): number {
    let n = 0;
    for (const p of this.#pending.values()) n += p.steps.size;
    return n;
  }

  /** Steps whose timings were dropped unsent (see `RackfeedClient.droppedSteps`). */
  get droppedSteps(): number {
    return this.#dropped;
  }

  /** A consumer starts iterating: its queue is made, and it is the one `add` reports for by default. */
  begin(id: string, body: ReportedConsumer): void {
    this.#queueOf(id, body);
    this.#lastConsumer = id;
  }

  /**
   * A consumer's shm socket takes its timings (`live`), or is about to close: then what is queued
   * goes on it now (the newest steps that still miss a timing the caller reports stay queued,
   * for HTTP). Another iteration of the same consumer may have registered its own since, which stays.
   */
  shmSocket(id: string, send: ShmTimingsSender, live: boolean): void {
    if (live) this.#shmTimings.set(id, send);
    else if (this.#shmTimings.get(id) === send) {
      this.sendInBackground(id, true);
      this.#shmTimings.delete(id);
    }
  }

  /** The t_wait `batches()` measured for a step it handed out. */
  waited(id: string, step: number, tWait: number): void {
    this.#record(id, { step, t_wait: tWait }, true);
  }

  /**
   * Adds the caller's timings of a step (see `RackfeedClient.reportStep`).
   *
   * @throws {RangeError} before any consumer began and none is given, or for a timing out of range
   */
  add(step: number, t: { t_h2d?: number; t_compute?: number }, consumer?: { dataset: string; rank: number; world: number; microBatch: number }): void {
    const id = consumer
      ? JSON.stringify({ dataset: consumer.dataset, rank: consumer.rank, world: consumer.world, micro_batch: consumer.microBatch })
      : this.#lastConsumer;
    if (id === undefined) throw new RangeError("reportStep() before any batches(): pass the consumer");
    if (!Number.isSafeInteger(step) || step < 0) {
      throw new RangeError(`Invalid step: ${String(step)}; expected an integer from 0 to ${Number.MAX_SAFE_INTEGER}`);
    }
    for (const k of ["t_h2d", "t_compute"] as const) {
      const v = t[k];
      // The server refuses a whole report for one bad value: refuse it here, where the caller sees it.
      if (v !== undefined && !(typeof v === "number" && v >= 0 && v <= MAX_TIMING_SECONDS)) {
        throw new RangeError(`Invalid ${k} for step ${step}: ${String(v)}; expected seconds from 0 to ${MAX_TIMING_SECONDS}`);
      }
    }
    const q = this.#pending.get(id) ?? this.#queueOf(id, JSON.parse(id));
    if (t.t_h2d !== undefined) q.reportsH2d = true;
    if (t.t_compute !== undefined) q.reportsCompute = true;
    // An explicit undefined must not erase a timing given before for this step.
    this.#record(id, {
      step,
      t_wait: q.steps.get(step)?.t_wait ?? NaN,
      ...(t.t_h2d !== undefined && { t_h2d: t.t_h2d }),
      ...(t.t_compute !== undefined && { t_compute: t.t_compute }),
    });
    this.autoFlush(id);
  }

  /** Sends the queued timings now; steps still waiting for a timing their caller reports stay queued. */
  async flush(): Promise<void> {
    await this.#send(undefined, true);
  }

  /** Sends queued timings in the background (see `#send`). */
  sendInBackground(only: string | undefined, holdIncomplete: boolean): void {
    this.#background(this.#send(only, holdIncomplete));
  }

  /**
   * Sends queued timings: every consumer's, or `only` this one's. Each consumer's steps leave the
   * queue before the first report is sent, so one slow report holds back no other consumer's
   * steps and no step goes twice. `holdIncomplete`: each consumer sent keeps back its newest two
   * steps while they still miss a timing its caller reports (t_h2d, t_compute): a step's timings
   * must travel in one report, as the server judges a step healthy only from all three.
   *
   * @throws the error of a report that failed (after the others were sent)
   */
  async #send(only: string | undefined, holdIncomplete: boolean): Promise<void> {
    const reports: Promise<void>[] = [];
    for (const [id, p] of this.#pending) {
      if (p.steps.size === 0 || (only !== undefined && id !== only)) continue;
      // Only steps served in this client's loops are held (they have a t_wait): a timing that
      // came for a step already sent can never be completed, and must not count as the newest.
      let newest = -Infinity;
      if (holdIncomplete) for (const [k, s] of p.steps) if (!Number.isNaN(s.t_wait)) newest = Math.max(newest, k);
      const out: StepTimings[] = [];
      for (const [k, s] of p.steps) {
        // A step still missing a timing the caller reports (t_compute often comes a step late,
        // at the next synchronisation) waits while it is one of the newest two.
        const incomplete = !Number.isNaN(s.t_wait) && ((p.reportsH2d && s.t_h2d === undefined) || (p.reportsCompute && s.t_compute === undefined));
        if (holdIncomplete && k >= newest - 1 && incomplete) continue;
        out.push(s);
        p.steps.delete(k);
      }
      if (out.length === 0) continue;
      p.sentAt = this.#opts.now();
      // Over the consumer's shm socket, when it has one: a frame of float64s, where an HTTP
      // report cost the server's event loop ~1.5 µs per step (parsing, HTTP) and the SDK a fetch.
      if (this.#shmTimings.get(id)?.(out)) continue;
      const post = this.#opts.post;
      if (post === undefined) {
        // A socket-only client whose consumer's socket is gone has nowhere else to send them.
        this.#dropped += out.length;
        continue;
      }
      p.sending++;
      const steps: ReportedStep[] = out.map((s) => (Number.isNaN(s.t_wait) ? { ...s, t_wait: undefined } : s));
      // A report that failed after its retries is lost: counted, as steps dropped from a full queue are.
      reports.push(post(p.body, steps).catch((e) => {
        this.#dropped += steps.length;
        throw e;
      }).finally(() => p.sending--));
    }
    const failed = (await Promise.allSettled(reports)).find((r) => r.status === "rejected");
    if (failed) throw (failed as PromiseRejectedResult).reason;
  }

  /**
   * Waits for the reports in flight, then sends the rest of the timings. Never rejects: a report
   * that fails is telemetry's loss, not the caller's error.
   */
  async close(): Promise<void> {
    await Promise.allSettled([...this.#reporting]);
    await this.#send(undefined, false).catch(() => {});
  }

  /**
   * Sends a consumer's timings when enough are queued and its last report is old enough, or its
   * queue is full; fire and forget (telemetry must never stall the data path). One report in
   * flight per consumer: steps queue meanwhile and go in the next. A full queue may send while
   * others are in flight, up to `MAX_REPORTS_IN_FLIGHT`; past that (a server that does not
   * answer) the oldest steps are dropped, so the client stays bounded. `now`: the caller's clock
   * reading, if it has one.
   *
   * @returns true when the consumer's reports are backing up (one in flight, half a queue waiting)
   */
  autoFlush(id: string, now?: number): boolean {
    const p = this.#pending.get(id)!;
    const n = p.steps.size;
    if (n >= MAX_QUEUED_STEPS) {
      if (p.sending < MAX_REPORTS_IN_FLIGHT) this.sendInBackground(id, true);
      else this.#dropOldest(p, n - MAX_QUEUED_STEPS);
    } else if (p.sending === 0 && n >= this.#opts.reportEvery && (now ?? this.#opts.now()) - p.sentAt >= this.#opts.reportIntervalMs) {
      this.sendInBackground(id, true);
    }
    return p.sending > 0 && p.steps.size >= MAX_QUEUED_STEPS / 2;
  }

  /** Drops a consumer's `count` oldest queued steps (a Map iterates in insertion order). */
  #dropOldest(p: QueuedTimings, count: number): void {
    for (const k of p.steps.keys()) {
      if (count-- <= 0) break;
      p.steps.delete(k);
      this.#dropped++;
    }
  }

  #background(p: Promise<void>): void {
    const q = p.catch(() => {});
    this.#reporting.add(q);
    void q.then(() => this.#reporting.delete(q));
  }

  /** A consumer's queue of timings, made on first use. */
  #queueOf(id: string, body: ReportedConsumer): QueuedTimings {
    let q = this.#pending.get(id);
    if (!q) this.#pending.set(id, (q = { body, steps: new Map(), sentAt: -Infinity, sending: 0, reportsH2d: false, reportsCompute: false }));
    return q;
  }

  /** `measured`: a t_wait of a step handed out (a reading), not the caller's timings for it. */
  #record(id: string, t: StepTimings, measured = false): void {
    // A socket-only client reports on its consumer's shm socket only: without one, keep nothing.
    if (this.#opts.post === undefined && !this.#shmTimings.has(id)) return;
    // A measured wait the server would refuse (an injected clock that stepped back) is sent as
    // not measured: a refused report must not cost the other timings, nor, over shm, the batches.
    if (!(t.t_wait >= 0 && t.t_wait <= MAX_TIMING_SECONDS) && !Number.isNaN(t.t_wait)) t = { ...t, t_wait: NaN };
    const p = this.#pending.get(id)!;
    let had = p.steps.get(t.step);
    if (measured && had !== undefined && !Number.isNaN(had.t_wait)) {
      // A step read again while its first reading is still queued (a resume from an earlier
      // step, a new iteration of the same consumer): the queue goes first, as it is, or the
      // second reading would be merged into the first and one of them never counted.
      this.sendInBackground(id, false);
      had = p.steps.get(t.step);
    }
    p.steps.set(t.step, had ? { ...had, ...t } : t);
  }
}
