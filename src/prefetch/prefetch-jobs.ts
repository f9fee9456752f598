/**
 * @module Prefetch jobs: warm the cache by object prefix (listing the origin) or by dataset step
 * range, into the memory or NVMe tier, with live progress. Jobs read at background priority, so
 * trainers keep the origin's foreground slots.
 */

import { setMaxListeners } from "node:events";
import { blockIndex, blockSource, planSamples } from "../batch/block-plans.ts";
import type { DatasetCatalog } from "../batch/dataset-catalog.ts";
import { fullSteps, MAX_MICRO_BATCH, MAX_WORLD, stepSamples } from "../batch/steps.ts";
import type { BlockCache } from "../cache/block-cache.ts";
import { badRequest, CacheServerError, OverloadedError } from "../errors.ts";
import { validateObjectKey } from "../origin/object-key.ts";
import type { ObjectInfo } from "../origin/origin.ts";
import type { OriginGateway } from "../origin/origin-gateway.ts";
import { backoffDelay, type RetryPolicy, sleep } from "../origin/retry.ts";

/** Lifecycle of a job. */
export type PrefetchState = "queued" | "running" | "done" | "failed" | "cancelled";

/** What `POST /prefetch` accepts. */
export type PrefetchRequest =
  | { readonly objects: readonly string[]; readonly tier: "memory" | "disk" }
  | {
    readonly dataset: string;
    readonly steps: readonly [number, number];
    readonly rank: number;
    readonly world: number;
    readonly microBatch: number;
    readonly tier: "memory" | "disk";
  };

/** A job's progress, as `GET /prefetch/{id}` and its event stream report it. */
export interface PrefetchProgress {
  readonly id: string;
  readonly state: PrefetchState;
  readonly tier: "memory" | "disk";
  /** What was asked, in words. */
  readonly what: string;
  readonly objectsDone: number;
  readonly objectsTotal: number;
  readonly blocksDone: number;
  readonly blocksTotal: number;
  /** Blocks that were already in the tier (no origin read). */
  readonly blocksCached: number;
  readonly bytesDone: number;
  readonly bytesTotal: number;
  /** Bytes per second since the job started running. */
  readonly rate: number;
  /** Seconds until done at the current rate; null when unknown. */
  readonly etaSeconds: number | null;
  readonly startedAt: string | null;
  readonly finishedAt: string | null;
  readonly error: string | null;
}

/** Options of `PrefetchJobs`. */
export interface PrefetchJobsOptions {
  readonly origins: ReadonlyMap<string, OriginGateway>;
  readonly cache: BlockCache;
  readonly catalog: DatasetCatalog;
  /** Byte budgets of the tiers in force, read when a job is planned, to refuse a job that cannot fit. */
  readonly tierBytes: { readonly memory: number; readonly disk: number };
  /** Blocks fetched at once per job. */
  readonly parallelBlocks: number;
  /** Most jobs remembered (finished ones are forgotten oldest first). */
  readonly maxJobs: number;
  /** Most objects one job may list. */
  readonly maxObjects: number;
  /** Wall clock, ms since the epoch (for timestamps and rates). */
  readonly clock: () => number;
  readonly log: (message: string, err?: unknown) => void;
  /** Read at background priority (behind trainers); default true. */
  readonly background?: boolean;
}

interface Job {
  progress: {
    -readonly [K in keyof PrefetchProgress]: PrefetchProgress[K];
  };
  readonly abort: AbortController;
  readonly listeners: Set<(p: PrefetchProgress) => void>;
  startedMs: number;
}

interface BlockTask {
  readonly gw: OriginGateway;
  readonly key: string;
  readonly info: ObjectInfo;
  readonly index: number;
  readonly bytes: number;
  /** Index of the object this block belongs to, for objectsDone. */
  readonly object: number;
}

const FINAL: ReadonlySet<PrefetchState> = new Set(["done", "failed", "cancelled"]);

/** A planned job: its blocks, objects and bytes. */
interface Plan {
  readonly tasks: BlockTask[];
  readonly objects: number;
  readonly bytesTotal: number;
  /** What the job warms, in words, where it differs from what was asked (steps cut at the dataset's end). */
  readonly what?: string;
}

/** How long `POST /prefetch` waits for a plan before it answers with the job queued (ms). */
const PLAN_WAIT_MS = 2000;
/** Objects stat'ed at once while a job is planned (the origin's limiter bounds them further). */
const PLAN_STATS = 32;
/** Longest stretch of step planning between two turns of the event loop (ms). */
const PLAN_SLICE_MS = 10;
/** Waits before a block whose read was refused for a full origin queue is tried again (full jitter, doubled each time). */
const OVERLOAD_BACKOFF: RetryPolicy = { retries: Infinity, baseMs: 20, capMs: 1000 };

/** A job's controller: each of its workers listens to it while waiting, more than Node's default warning count of 10. */
function listenedBy(c: AbortController): AbortController {
  setMaxListeners(0, c.signal);
  return c;
}


function sumBytes(tasks: readonly BlockTask[]): number {
  let n = 0;
  for (const t of tasks) n += t.bytes;
  return n;
}

/** What a request asks for, in words (a job's `what`). */
function describeRequest(req: PrefetchRequest): string {
  return "objects" in req
    ? `objects ${req.objects.join(", ")}`
    : `dataset ${req.dataset} steps ${req.steps[0]}-${req.steps[1] - 1} (rank ${req.rank}, world ${req.world}, micro_batch ${req.microBatch})`;
}

/**
 * The prefetch jobs of a server.
 *
 * @example
 * ```ts
 * const jobs = new PrefetchJobs({ origins, cache, catalog, tierBytes, parallelBlocks: 8, maxJobs: 100, maxObjects: 100_000, clock: Date.now, log });
 * const { id } = await jobs.submit(parsePrefetchRequest(body));
 * jobs.subscribe(id, (p) => console.log(p.bytesDone, p.bytesTotal));
 * ```
 */
export class PrefetchJobs {
  readonly #opts: PrefetchJobsOptions;
  readonly #jobs = new Map<string, Job>();
  #seq = 0;

  /** @param opts origins, cache, catalog and bounds */
  constructor(opts: PrefetchJobsOptions) {
    this.#opts = opts;
  }

  /**
   * Plans a job (listing objects or planning steps), refuses one that cannot fit its tier, and
   * starts it.
   *
   * @throws {CacheServerError} `BAD_REQUEST` when it names nothing, or more than the tier holds
   */
  async submit(req: PrefetchRequest): Promise<PrefetchProgress> {
    const id = `p${(++this.#seq).toString(36)}-${Math.floor(this.#opts.clock()).toString(36)}`;
    const job: Job = {
      progress: {
        id,
        state: "queued",
        tier: req.tier,
        what: describeRequest(req),
        objectsDone: 0,
        objectsTotal: 0,
        blocksDone: 0,
        blocksTotal: 0,
        blocksCached: 0,
        bytesDone: 0,
        bytesTotal: 0,
        rate: 0,
        etaSeconds: null,
        startedAt: null,
        finishedAt: null,
        error: null,
      },
      abort: listenedBy(new AbortController()),
      listeners: new Set(),
      startedMs: 0,
    };
    // Remembered while it plans: planning counts against --max jobs, and can be cancelled.
    this.#remember(id, job);
    const planned = this.#plan(req, job.abort.signal).then((plan) => this.#checkFits(req, plan));
    // A plan ready within PLAN_WAIT_MS is answered as before (its errors as 400s). A longer one
    // (listing many objects, stat'ing each, or planning many steps) goes on in the background:
    // the job answers 202 as queued, and fails there if the plan cannot run.
    let stopWaiting = () => {};
    const quick = await Promise.race([
      planned.then((plan) => ({ plan }), (error: unknown) => ({ error })),
      new Promise<undefined>((r) => {
        const timer = setTimeout(() => r(undefined), PLAN_WAIT_MS);
        stopWaiting = () => clearTimeout(timer);
      }),
    ]);
    stopWaiting();
    if (job.abort.signal.aborted) {
      // Cancelled while it planned (DELETE, or close() at shutdown): it stays cancelled, whatever
      // the plan did meanwhile (finished, or threw the AbortError).
      void planned.catch(() => {});
      return { ...job.progress };
    }
    if (quick && "error" in quick) {
      this.#jobs.delete(id);
      throw quick.error;
    }
    if (quick) {
      this.#start(job, quick.plan);
    } else {
      planned.then((plan) => {
        if (!job.abort.signal.aborted) this.#start(job, plan);
      }, (e: unknown) => {
        if (FINAL.has(job.progress.state)) return; // cancelled while planning
        this.#opts.log(`Prefetch ${id} could not be planned`, e);
        this.#finish(job, "failed", (e as Error).message);
      });
    }
    return { ...job.progress };
  }

  #checkFits(req: PrefetchRequest, plan: Plan): Plan {
    const budget = this.#opts.tierBytes[req.tier];
    if (plan.bytesTotal > budget) {
      throw badRequest(
        `Prefetch of ${describeRequest(req)} needs ${plan.bytesTotal} bytes, more than the ${req.tier} tier holds (${budget} bytes); ` +
          `it would evict its own blocks. Prefetch less, or ${req.tier === "memory" ? 'into the disk tier ("tier": "disk")' : "into a larger disk tier (--disk-bytes)"}`,
      );
    }
    return plan;
  }

  #start(job: Job, plan: Plan): void {
    const p = job.progress;
    if (plan.what !== undefined) p.what = plan.what;
    p.objectsTotal = plan.objects;
    p.blocksTotal = plan.tasks.length;
    p.bytesTotal = plan.bytesTotal;
    void this.#run(job, plan.tasks);
  }

  /** A job's progress now. */
  get(id: string): PrefetchProgress {
    return { ...this.#job(id).progress };
  }

  /** Every remembered job, newest first. */
  list(): PrefetchProgress[] {
    return [...this.#jobs.values()].reverse().map((j) => ({ ...j.progress }));
  }

  /** Cancels a job: no new reads start; reads in flight finish. */
  cancel(id: string): PrefetchProgress {
    const job = this.#job(id);
    if (!FINAL.has(job.progress.state)) {
      job.abort.abort();
      this.#finish(job, "cancelled", null);
    }
    return { ...job.progress };
  }

  /**
   * Calls `fn` with the job's progress now and on every change until it ends.
   *
   * @returns a function that stops the calls
   */
  subscribe(id: string, fn: (p: PrefetchProgress) => void): () => void {
    const job = this.#job(id);
    fn({ ...job.progress });
    if (FINAL.has(job.progress.state)) return () => {};
    job.listeners.add(fn);
    return () => job.listeners.delete(fn);
  }

  /** Cancels every job (shutdown). */
  close(): void {
    for (const j of this.#jobs.values()) if (!FINAL.has(j.progress.state)) this.cancel(j.progress.id);
  }

  #job(id: string): Job {
    const job = this.#jobs.get(id);
    if (!job) throw new CacheServerError("NOT_FOUND", `Unknown prefetch job "${id}"`);
    return job;
  }

  #remember(id: string, job: Job): void {
    if (this.#jobs.size >= this.#opts.maxJobs) {
      for (const [k, j] of this.#jobs) {
        if (FINAL.has(j.progress.state)) {
          this.#jobs.delete(k);
          break;
        }
      }
      if (this.#jobs.size >= this.#opts.maxJobs) {
        // Full for now, not a bad request: a retry succeeds once a job ends.
        throw new OverloadedError(`Too many prefetch jobs running (${this.#opts.maxJobs}); retry when one has finished, or cancel one`);
      }
    }
    this.#jobs.set(id, job);
  }

  /**
   * The blocks a job reads. Cancellable (`signal`), and never long on the event loop: objects are
   * stat'ed PLAN_STATS at a time, and step planning yields every PLAN_SLICE_MS.
   */
  async #plan(req: PrefetchRequest, signal: AbortSignal): Promise<Plan> {
    const blockBytes = this.#opts.cache.blockBytes;
    const tasks: BlockTask[] = [];
    if ("objects" in req) {
      let objects = 0;
      for (const spec of req.objects) {
        const slash = spec.indexOf("/");
        const originName = slash < 0 ? spec : spec.slice(0, slash);
        const prefix = slash < 0 ? "" : spec.slice(slash + 1);
        const gw = this.#opts.origins.get(originName);
        if (!gw) {
          throw badRequest(
            `Invalid prefetch object prefix "${spec}": unknown origin "${originName}"; configured: ${[...this.#opts.origins.keys()].join(", ")}`,
          );
        }
        if (prefix !== "") validateObjectKey(prefix.replace(/\/+$/, "") || "x");
        const listed = await gw.list(prefix, this.#opts.maxObjects - objects + 1);
        signal.throwIfAborted();
        if (objects + listed.length > this.#opts.maxObjects) {
          throw badRequest(`Prefetch of "${spec}" lists more than ${this.#opts.maxObjects} objects; name narrower prefixes`);
        }
        // Each object's version (the ETag or mtime in its block keys) needs a stat: many at once.
        const infos = new Array<ObjectInfo>(listed.length);
        let next = 0;
        let failed = false; // one failed stat fails the plan: the other workers stop too
        const stat = async () => {
          while (next < listed.length && !failed) {
            signal.throwIfAborted();
            const i = next++;
            try {
              infos[i] = await gw.stat(listed[i].key);
            } catch (e) {
              failed = true;
              throw e;
            }
          }
        };
        await Promise.all(Array.from({ length: Math.min(PLAN_STATS, listed.length) }, stat));
        signal.throwIfAborted(); // cancelled during the last stats
        for (let i = 0; i < listed.length; i++) {
          const info = infos[i];
          for (let b = 0; b * blockBytes < info.size; b++) {
            tasks.push({ gw, key: listed[i].key, info, index: b, bytes: Math.min(blockBytes, info.size - b * blockBytes), object: objects });
          }
          objects++;
        }
      }
      if (objects === 0) throw badRequest(`Prefetch of ${req.objects.join(", ")} found no objects`);
      return { tasks, objects, bytesTotal: sumBytes(tasks) };
    }
    const reg = await this.#opts.catalog.get(req.dataset);
    const [from, wanted] = req.steps;
    const steps = fullSteps(reg.dataset.numSamples, req.world, req.microBatch);
    if (from >= steps) {
      // As the batches route says it: with micro-batches larger than the dataset there is no step 0.
      const has = steps === 0 ? "no full step" : `steps 0-${steps - 1}`;
      throw badRequest(
        `Invalid prefetch "steps": dataset "${req.dataset}" has ${has} with world ${req.world} and micro_batch ${req.microBatch} (${reg.dataset.numSamples} samples); received [${from}, ${wanted}]`,
      );
    }
    const to = Math.min(wanted, steps);
    const seen = new Set<number>();
    let sliceStart = performance.now();
    for (let step = from; step < to; step++) {
      if (performance.now() - sliceStart > PLAN_SLICE_MS) {
        await new Promise((r) => setTimeout(r, 0)); // let batches be served
        signal.throwIfAborted();
        sliceStart = performance.now();
      }
      const first = stepSamples(step, req.rank, req.world, req.microBatch);
      const plan = planSamples(reg, first, req.microBatch, blockBytes, "once");
      for (const packed of plan.blocks) {
        if (seen.has(packed)) continue;
        seen.add(packed);
        const source = blockSource(packed);
        const index = blockIndex(packed);
        const f = reg.files[source];
        tasks.push({
          gw: f.gw,
          key: f.binKey,
          info: f.bin,
          index,
          bytes: Math.min(blockBytes, f.bin.size - index * blockBytes),
          object: source,
        });
      }
    }
    // Steps past the end are cut, not refused (`[from, 1e12]` warms to the end): the job says so.
    const what = to < wanted
      ? `${describeRequest({ ...req, steps: [from, to] })}; asked for steps ${from}-${wanted - 1}, the dataset's last is ${steps - 1}`
      : undefined;
    return { tasks, objects: reg.files.length, bytesTotal: sumBytes(tasks), what };
  }

  async #run(job: Job, tasks: BlockTask[]): Promise<void> {
    const p = job.progress;
    p.state = "running";
    job.startedMs = this.#opts.clock();
    p.startedAt = new Date(job.startedMs).toISOString();
    this.#emit(job);
    const remainingPerObject = new Map<number, number>();
    for (const t of tasks) remainingPerObject.set(t.object, (remainingPerObject.get(t.object) ?? 0) + 1);
    // An empty object has no block to fetch: it is done from the start.
    p.objectsDone = p.objectsTotal - remainingPerObject.size;
    let next = 0;
    const worker = async () => {
      while (next < tasks.length && !job.abort.signal.aborted) {
        const t = tasks[next++];
        let cached = false;
        for (let attempt = 0;; attempt++) {
          try {
            cached = await this.#opts.cache.prefetch(t.gw, t.key, t.info, t.index, { tier: p.tier, background: this.#opts.background ?? true, signal: job.abort.signal });
            break;
          } catch (e) {
            if (job.abort.signal.aborted) return; // cancelled: its fills nobody else needs are given up
            // The origin's queue is full (its reads gave way to trainers'): try the block again
            // later instead of failing the job.
            if (!(e instanceof OverloadedError)) throw e;
            try {
              await sleep(backoffDelay(attempt, OVERLOAD_BACKOFF, Math.random), job.abort.signal);
            } catch {
              return; // cancelled while it waited
            }
          }
        }
        if (job.abort.signal.aborted) return;
        p.blocksDone++;
        if (cached) p.blocksCached++;
        p.bytesDone += t.bytes;
        const left = remainingPerObject.get(t.object)! - 1;
        remainingPerObject.set(t.object, left);
        if (left === 0) p.objectsDone++;
        this.#emit(job);
      }
    };
    try {
      await Promise.all(Array.from({ length: Math.min(this.#opts.parallelBlocks, tasks.length) }, worker));
      if (!job.abort.signal.aborted) this.#finish(job, "done", null);
    } catch (e) {
      job.abort.abort();
      this.#opts.log(`Prefetch ${p.id} failed`, e);
      if (!FINAL.has(p.state)) this.#finish(job, "failed", (e as Error).message);
    }
  }

  #finish(job: Job, state: PrefetchState, error: string | null): void {
    job.progress.state = state;
    job.progress.error = error;
    job.progress.finishedAt = new Date(this.#opts.clock()).toISOString();
    this.#emit(job);
    job.listeners.clear();
  }

  #emit(job: Job): void {
    const p = job.progress;
    const seconds = (this.#opts.clock() - job.startedMs) / 1000;
    p.rate = seconds > 0 ? p.bytesDone / seconds : 0;
    p.etaSeconds = p.state === "done" ? 0 : p.rate > 0 ? (p.bytesTotal - p.bytesDone) / p.rate : null;
    const snapshot = { ...p };
    for (const fn of job.listeners) fn(snapshot);
  }
}

/**
 * Validates a `POST /prefetch` body.
 *
 * @throws {CacheServerError} `BAD_REQUEST` naming the field
 */
export function parsePrefetchRequest(body: unknown): PrefetchRequest {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    throw badRequest('Invalid prefetch request: expected a JSON object with "objects" or "dataset"');
  }
  const b = body as Record<string, unknown>;
  const tier = b.tier ?? "disk";
  if (tier !== "disk" && tier !== "memory") throw badRequest(`Invalid prefetch "tier": expected "disk" or "memory", received ${JSON.stringify(b.tier)}`);
  // Both named: which one was meant is a guess, and warming the other silently costs a tier's worth of reads.
  if ("objects" in b && "dataset" in b) {
    throw badRequest('Invalid prefetch request: it has both "objects" and "dataset"; give one of them (one job each)');
  }
  if ("objects" in b) {
    if (!Array.isArray(b.objects) || b.objects.length === 0 || b.objects.length > 1000 || !b.objects.every((o) => typeof o === "string" && o.length > 0)) {
      throw badRequest('Invalid prefetch "objects": expected 1-1000 strings "{origin}/prefix"');
    }
    return { objects: b.objects as string[], tier };
  }
  if (typeof b.dataset !== "string") throw badRequest('Invalid prefetch request: expected "objects" or "dataset"');
  const int = (name: string, min: number, max: number, fallback?: number): number => {
    const v = b[name] ?? fallback;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min || v > max) {
      throw badRequest(`Invalid prefetch "${name}": expected an integer from ${min} to ${max}, received ${JSON.stringify(b[name])}`);
    }
    return v;
  };
  const steps = b.steps;
  if (!Array.isArray(steps) || steps.length !== 2 || !steps.every((s) => Number.isSafeInteger(s) && s >= 0) || steps[1] <= steps[0]) {
    throw badRequest(`Invalid prefetch "steps": expected [from, to] with 0 <= from < to, received ${JSON.stringify(steps)}`);
  }
  // The batches route's bounds (GET /v1/datasets/{name}/batches/{step}): a job warms what a
  // trainer could ask for, and world × micro_batch stays far inside a safe integer.
  const world = int("world", 1, MAX_WORLD, 1);
  const rank = int("rank", 0, Number.MAX_SAFE_INTEGER, 0);
  if (rank >= world) throw badRequest(`Invalid prefetch "rank": ${rank} is not below "world" ${world}`);
  return { dataset: b.dataset, steps: [steps[0], steps[1]], rank, world, microBatch: int("micro_batch", 1, MAX_MICRO_BATCH), tier };
}
