/**
 * @module A planning thread for read-ahead: it makes the plans of consumers' coming steps, so the
 * event loop copies each plan out of shared memory instead of making it (see `plan-exchange.ts`).
 */

import { datasetVersionId, type SamplePlan } from "../batch/block-plans.ts";
import type { RegisteredDataset } from "../batch/dataset-catalog.ts";
import { PLAN_EXCHANGE_BYTES, PlanExchange, type PlanningThreadHandle } from "../batch/plan-exchange.ts";
import { shareArrays, tokenDatasetParts, unsharedBytes } from "../dataset/mod.ts";
import type { PlanWorkerMessage } from "./plan-worker.ts";
import { startThread, type Thread } from "./threads.ts";

const WORKER = new URL("./plan-worker.ts", import.meta.url);

/**
 * A dataset whose index arrays are not in shared memory (built on the event loop: small ones) is
 * copied into shared memory for the thread up to this many bytes; a larger one is planned on the
 * event loop, so no registration stalls it.
 */
const MAX_COPIED_INDEX_BYTES = 16 * 2 ** 20;

/**
 * Starts a planning thread, given the datasets it is asked about as they come (their index arrays
 * shared, not copied). On Node the thread does not keep the process alive; on Deno it does until
 * `close()` (a web Worker has no unref).
 *
 * @example
 * ```ts
 * const planner = new PlanningThread("node");
 * const readAhead = new ReadAhead({ ...opts, plansAhead: planner });
 * await planner.close();
 * ```
 */
export class PlanningThread implements PlanningThreadHandle {
  readonly #exchange = new PlanExchange(new SharedArrayBuffer(PLAN_EXCHANGE_BYTES));
  readonly #worker: Thread;
  /** Dataset versions seen: whether the thread holds each. */
  readonly #held = new Map<number, boolean>();
  /** Tells the thread to forget a dataset version once nothing here holds it. */
  readonly #forget: FinalizationRegistry<number>;
  #closed = false;
  #forgotten = 0;
  /** Resolves once the thread runs and takes requests (until then steps are planned on the event loop). */
  readonly ready: Promise<void>;

  /**
   * @param runtime which runtime loads the worker (see `startThread`)
   * @param log where the thread's failure is told (the server goes on without it)
   */
  constructor(runtime: "node" | "deno", log: (message: string, err?: unknown) => void = () => {}) {
    const worker = startThread(runtime, WORKER, false);
    this.ready = new Promise((resolve) => worker.onMessage(() => resolve()));
    // A thread that fails leaves every plan to the event loop, as if there were none.
    worker.onFailure((e) => {
      if (this.#closed) return;
      log("rackfeed: the planning thread failed; steps are planned on the event loop from now on", e);
      void this.close();
    });
    this.#worker = worker;
    this.#post({ exchange: this.#exchange.buffer });
    this.#forget = new FinalizationRegistry((regId) => {
      if (this.#held.get(regId)) {
        this.#post({ forget: regId });
        this.#forgotten++;
      }
      this.#held.delete(regId);
    });
  }

  /** Dataset versions the thread was told to forget (nothing here held them any more). */
  get forgotten(): number {
    return this.#forgotten;
  }

  /** Plans the event loop took from the thread (made there, not on the event loop). */
  get plansTaken(): number {
    return this.#exchange.taken;
  }

  /** See `PlansAhead.request`; a dataset version is sent to the thread on its first request. */
  request(reg: RegisteredDataset, first: number, count: number, blockBytes: number): void {
    if (this.#closed) return;
    const regId = datasetVersionId(reg);
    let held = this.#held.get(regId);
    if (held === undefined) held = this.#offer(reg, regId);
    if (held) this.#exchange.request(regId, first, count, blockBytes);
  }

  /** See `PlansAhead.flush`. */
  flush(): void {
    this.#exchange.flush();
  }

  /** See `PlansAhead.take`; undefined once the thread is closed. */
  take(regId: number, first: number, count: number, blockBytes: number): SamplePlan | undefined {
    return this.#closed ? undefined : this.#exchange.take(regId, first, count, blockBytes);
  }

  /** Ends the thread; plans are made on the event loop from then on. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    await this.#worker.terminate();
  }

  /**
   * Sends a dataset version to the thread: its arrays shared, or copied into shared memory when small.
   *
   * @returns whether the thread holds it (false: too large to copy; its steps are planned on the event loop)
   */
  #offer(reg: RegisteredDataset, regId: number): boolean {
    let parts = tokenDatasetParts(reg.dataset);
    const unshared = unsharedBytes(parts);
    // Registered whether or not the thread gets it: the finalizer deletes its #held entry either way.
    this.#forget.register(reg, regId);
    if (unshared > MAX_COPIED_INDEX_BYTES) {
      this.#held.set(regId, false);
      return false;
    }
    if (unshared > 0) parts = shareArrays(parts);
    this.#post({ regId, name: reg.name, parts });
    this.#held.set(regId, true);
    return true;
  }

  #post(m: PlanWorkerMessage): void {
    if (!this.#closed) this.#worker.postMessage(m);
  }
}
