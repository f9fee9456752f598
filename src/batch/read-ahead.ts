/**
 * @module Schedule-aware read-ahead. The server knows every consumer's whole sample order, so
 * after serving step `s` to a consumer (dataset, rank, world, micro_batch) it starts the fills
 * of the blocks that steps `s+1 … s+K` will need, with K set by a time budget at the observed
 * step rate. A steady trainer then finds every block in memory.
 */

import type { BlockCache } from "../cache/block-cache.ts";
import { blockIndex, blockKeys, blockSource, planSamples } from "./block-plans.ts";
import type { RegisteredDataset } from "./dataset-catalog.ts";
import type { PlansAhead } from "./plan-exchange.ts";
import { fullSteps, stepSamples } from "./steps.ts";

/** Who reads: one trainer rank's view of a dataset. */
export interface ConsumerKey {
  readonly dataset: string;
  readonly rank: number;
  readonly world: number;
  readonly microBatch: number;
}

/** Look-ahead of one consumer, for `/metrics`. */
export interface ConsumerLookahead extends ConsumerKey {
  /** Last step served. */
  readonly step: number;
  /** Seconds between the consumer's steps (moving average); 0 until known. */
  readonly stepSeconds: number;
  /** Steps after `step` whose blocks are all in memory now. */
  readonly stepsBuffered: number;
  /** `stepsBuffered × stepSeconds`. */
  readonly secondsBuffered: number;
  /** Steps after `step` whose fills have been started. */
  readonly stepsScheduled: number;
}

/** Options of `ReadAhead`. */
export interface ReadAheadOptions {
  readonly cache: BlockCache;
  readonly now: () => number;
  /** Seconds of consumption to keep ahead (0 turns read-ahead off). */
  readonly budgetSeconds: number;
  /** Most steps ahead, whatever the step rate. */
  readonly maxSteps: number;
  /** Most bytes of blocks scheduled ahead per consumer (keeps look-ahead within the memory tier). */
  readonly maxBytesPerConsumer: number;
  /** Most consumers tracked; the least recently seen is forgotten beyond it. */
  readonly maxConsumers: number;
  /**
   * A planning thread: asked for the plans of the steps beyond those warmed (`PLAN_LEAD`), so
   * that warming finds them made. Unset: every step is planned on the event loop.
   */
  readonly plansAhead?: PlansAhead;
}

interface Consumer {
  key: ConsumerKey;
  reg: RegisteredDataset;
  step: number;
  /** When `step` was reached (a move forward); the step time is measured from it. */
  movedAt: number;
  /** When the consumer was last served anything (late steps included); idle consumers are forgotten. */
  seenAt: number;
  stepSeconds: number;
  /** Highest step whose blocks have been warmed. */
  warmedThrough: number;
  /** Highest step whose plan has been asked of the planning thread (`plansAhead`). */
  requestedThrough: number;
  /**
   * Steps after `step` that are scheduled, in step order from `head`: the block keys each needs,
   * when, and their bytes. A queue, not a map: steps are scheduled in order and released from the
   * front, and a map's set and delete per step cost more.
   */
  scheduled: ScheduledStep[];
  /** The first entry of `scheduled` still scheduled (those before it are dropped a batch at a time). */
  head: number;
  /** Sum of `scheduled` bytes: the consumer's outstanding window. */
  windowBytes: number;
  /** For each block key of `scheduled`, the dues of the steps that need it, in step order (kept once Belady eviction asks). */
  dues: Map<string, number[]>;
  /** Steps skipped on the way to `step` and not served yet (at most `OWED_STEPS`). */
  owed: number[];
}

/** A step whose blocks read-ahead has warmed, not served yet. */
interface ScheduledStep {
  readonly step: number;
  readonly keys: readonly string[];
  readonly due: number;
  readonly bytes: number;
}

/**
 * Steps beyond those warmed whose plans are asked of the planning thread, in groups of half as
 * many (one wake-up of the thread per group): a group is planned while the event loop serves the
 * group before it, so warming a step finds its plan made.
 */
const PLAN_LEAD = 64;

/** Released entries a consumer's queue keeps at its front before it drops them in one go. */
const RELEASED_KEPT = 64;

/** How often `observe` looks for idle consumers (ms): they are forgotten after minutes, not per step. */
const IDLE_CHECK_MS = 1000;

/** A scheduled use this far in the past no longer protects its block. */
const STALE_AFTER_MS = 2000;
/**
 * A consumer not seen for this long is forgotten: it holds its dataset version (whose indexes
 * may be gigabytes, and stay alive after the dataset is replaced) and costs every `/metrics`.
 */
export const IDLE_CONSUMER_MS = 10 * 60_000;
/**
 * Steps skipped by a consumer's move forward that are remembered as owed (at most this many). A
 * client with several requests in flight (the SDK's prefetch, HTTP/2 streams) has its steps
 * arrive out of order, and an owed step that comes late is a straggler, not a jump back: treated
 * as a jump, each one dropped and rebuilt the whole look-ahead window (a third of the server's
 * time for 64 KiB batches at 4 in flight). A step already served is a jump (a resume).
 */
const OWED_STEPS = 16;

/**
 * Tracks consumers and warms the blocks of their next steps.
 *
 * @example
 * ```ts
 * const ra = new ReadAhead({ cache, now, budgetSeconds: 2, maxSteps: 64, maxBytesPerConsumer: 2 ** 30, maxConsumers: 1024 });
 * ra.observe(reg, { dataset: "pile", rank: 0, world: 8, microBatch: 8 }, step);
 * ```
 */
export class ReadAhead {
  readonly #opts: ReadAheadOptions;
  /** Map order is recency order, so the first entry is the consumer seen longest ago. */
  readonly #consumers = new Map<string, Consumer>();
  /** Block cache key → the consumers whose windows need it (each has it in its `dues`). */
  readonly #holders = new Map<string, Consumer[]>();
  /**
   * Whether the consumers' `dues` and `#holders` are kept: from the first `nextUse` question on.
   * Only Belady eviction asks, and only once the memory tier is full, so a tier that holds the
   * datasets (or evicts by LRU) never pays this bookkeeping: map updates per block of every
   * step, a tenth of a warm 64 KiB token batch's server time.
   */
  #tracking = false;
  #blocksWarmed = 0;
  #stepsWarmed = 0;
  /** The last consumer seen and its id: the shm path passes one key object for all its steps. */
  #lastKey: ConsumerKey | undefined;
  #lastId = "";
  /** When `observe` last looked for idle consumers (clock ms). */
  #idleCheckedAt = -Infinity;
  /**
   * Dataset versions replaced since (held weakly: they may be gigabytes): a consumer that has
   * moved on is never switched back to one by a request begun before the replacement.
   */
  readonly #replaced = new WeakSet<RegisteredDataset>();
  /** The id of the consumer last in `#consumers`' recency order (undefined when unknown). */
  #newestId: string | undefined;

  /** @param opts cache, clock and bounds */
  constructor(opts: ReadAheadOptions) {
    this.#opts = opts;
  }

  /**
   * When block `key` (a `BlockCache.keyOf`) is next needed by a known schedule, in ms of the
   * injected clock: the earliest step still scheduled that needs it, over every consumer;
   * `Infinity` when none does (or their times have long passed). The memory tier's Belady
   * eviction asks this.
   */
  nextUse(key: string): number {
    if (!this.#tracking) this.#startTracking();
    const holders = this.#holders.get(key);
    if (holders === undefined) return Infinity;
    // A late consumer still needs its scheduled blocks; one that stopped long ago does not.
    const since = this.#opts.now() - STALE_AFTER_MS;
    let next = Infinity;
    for (const c of holders) {
      const t = c.dues.get(key)![0];
      if (t >= since && t < next) next = t;
    }
    return next;
  }

  /** Blocks whose fills read-ahead started, since start. */
  get blocksWarmed(): number {
    return this.#blocksWarmed;
  }

  /**
   * The planning thread that plans consumers' coming steps (the `plansAhead` option): a batch
   * planned before read-ahead reaches its step (a group of shm steps, a window capped by bytes)
   * looks there too.
   */
  get plansAhead(): PlansAhead | undefined {
    return this.#opts.plansAhead;
  }

  /** Steps whose blocks read-ahead warmed, since start. */
  get stepsWarmed(): number {
    return this.#stepsWarmed;
  }

  /**
   * Records that `consumer` was served `step` of `reg`, updates its step rate and warms the
   * blocks of the steps within the time budget that are not warmed yet.
   */
  observe(reg: RegisteredDataset, consumer: ConsumerKey, step: number): void {
    if (this.#opts.budgetSeconds <= 0) return;
    if (consumer !== this.#lastKey) {
      this.#lastKey = consumer;
      this.#lastId = `${consumer.dataset}\n${consumer.rank}\n${consumer.world}\n${consumer.microBatch}`;
    }
    const id = this.#lastId;
    const now = this.#opts.now();
    let c = this.#consumers.get(id);
    if (c) {
      // To the end of the recency order, unless it is there already (the same consumer step after
      // step: a map delete and set per step cost more than the rest of this bookkeeping).
      if (this.#newestId !== id) {
        this.#consumers.delete(id);
        this.#consumers.set(id, c);
        this.#newestId = id;
      }
      c.seenAt = now;
      if (c.reg !== reg && this.#replaced.has(reg)) {
        // A request begun before the dataset was rebuilt, answered after one on the new version:
        // switching back would drop the window twice and keep the old version alive.
        return;
      }
      // Owed steps are never more than OWED_STEPS behind `step` (trimmed below as it moves).
      const late = c.reg === reg && step < c.step ? c.owed.indexOf(step) : -1;
      if (late >= 0) {
        // Skipped and now served after a later step: its blocks were released then, and the
        // window stands.
        c.owed.splice(late, 1);
        return;
      }
      const back = c.reg !== reg || step < c.step;
      // A rebuilt dataset, a step served before, or one beyond the window: a resume or restart
      // elsewhere, for which the old look-ahead is useless.
      const jump = back || step > c.warmedThrough;
      if (back || step - c.step - 1 > OWED_STEPS) c.owed.length = 0;
      else {
        for (let s = c.step + 1; s < step; s++) c.owed.push(s);
        // Owed steps further behind than OWED_STEPS are no longer expected (their requests died
        // with a client): one of them served now is a resume, not a straggler.
        while (c.owed.length > 0 && c.owed[0] < step - OWED_STEPS) c.owed.shift();
      }
      if (!jump && step > c.step) {
        // Steps consumed since the last move forward, late ones included: the time of one step,
        // also for a client whose steps always arrive out of order.
        const dt = (now - c.movedAt) / 1000 / (step - c.step);
        c.stepSeconds = c.stepSeconds === 0 ? dt : 0.8 * c.stepSeconds + 0.2 * dt;
      }
      if (jump) {
        this.#release(c, Infinity);
        c.warmedThrough = step;
        c.requestedThrough = step;
      } else {
        this.#release(c, step); // steps served: their blocks are no longer protected for this consumer
      }
      c.reg = reg;
      if (step !== c.step) c.movedAt = now;
      c.step = step;
    } else {
      c = { key: consumer, reg, step, movedAt: now, seenAt: now, stepSeconds: 0, warmedThrough: step, requestedThrough: step, scheduled: [], head: 0, windowBytes: 0, dues: new Map(), owed: [] };
      if (this.#consumers.size >= this.#opts.maxConsumers) {
        this.#forget(this.#consumers.keys().next().value!);
      }
      this.#consumers.set(id, c);
      this.#newestId = id;
    }
    if (now - this.#idleCheckedAt >= IDLE_CHECK_MS) {
      this.#idleCheckedAt = now;
      this.#forgetIdle(now);
    }
    this.#warm(c);
  }

  /**
   * A dataset was replaced by a new version: its consumers are forgotten at once, their windows
   * released. One that was not seen again would otherwise hold the old version, indexes and all,
   * until forgotten as idle (10 minutes): a version per re-registration while trainers come and
   * go. One that goes on is tracked again from its next step, on the version it reads then (an
   * shm consumer drains what its ring holds of the old one, see `ShmConnection.versionReplaced`).
   */
  versionReplaced(old: RegisteredDataset): void {
    this.#replaced.add(old);
    for (const [id, c] of this.#consumers) if (c.reg === old) this.#forget(id);
  }

  /** Forgets a consumer: its window released, its entry gone. */
  #forget(id: string): void {
    this.#release(this.#consumers.get(id)!, Infinity);
    this.#consumers.delete(id);
    if (id === this.#newestId) this.#newestId = undefined;
  }

  /** Forgets consumers idle for `IDLE_CONSUMER_MS`: the map is in recency order, so from its start. */
  #forgetIdle(now: number): void {
    for (const [id, c] of this.#consumers) {
      if (now - c.seenAt < IDLE_CONSUMER_MS) return;
      this.#forget(id);
    }
  }

  #warm(c: Consumer): void {
    const { cache, budgetSeconds, maxSteps, maxBytesPerConsumer, plansAhead } = this.#opts;
    // Until the rate is known, look two steps ahead; then cover the time budget.
    const want = c.stepSeconds > 0 ? Math.ceil(budgetSeconds / c.stepSeconds) : 2;
    const horizon = Math.min(maxSteps, Math.max(1, want));
    const lastStep = this.#lastStep(c);
    const target = Math.min(c.step + horizon, lastStep);
    const blockBytes = cache.blockBytes;
    const now = this.#opts.now();
    // Until the step time is known, order future steps 1 ms apart: only their order matters.
    const stepMs = c.stepSeconds > 0 ? c.stepSeconds * 1000 : 1;
    // The window (steps scheduled and not yet served) stays within the byte cap, so look-ahead
    // never evicts its own blocks from the memory tier.
    for (let s = c.warmedThrough + 1; s <= target && c.windowBytes < maxBytesPerConsumer; s++) {
      const first = stepSamples(s, c.key.rank, c.key.world, c.key.microBatch);
      const plan = planSamples(c.reg, first, c.key.microBatch, blockBytes, "read-ahead", true, plansAhead);
      const due = now + (s - c.step) * stepMs;
      const keys = blockKeys(cache, c.reg, plan);
      if (this.#tracking) this.#schedule(c, keys, due);
      for (let pos = 0; pos < keys.length; pos++) {
        const k = keys[pos];
        const packed = plan.blocks[pos];
        const f = c.reg.files[blockSource(packed)];
        if (cache.warm(f.gw, f.binKey, f.bin, blockIndex(packed), k)) this.#blocksWarmed++;
      }
      const bytes = keys.length * blockBytes;
      c.scheduled.push({ step: s, keys, due, bytes });
      c.windowBytes += bytes;
      c.warmedThrough = s;
      this.#stepsWarmed++;
    }
    if (plansAhead !== undefined && c.requestedThrough - c.warmedThrough < PLAN_LEAD / 2) this.#requestPlans(c, plansAhead, lastStep);
  }

  /** Asks the planning thread for the plans of the consumer's steps up to `PLAN_LEAD` beyond those warmed. */
  #requestPlans(c: Consumer, plansAhead: PlansAhead, lastStep: number): void {
    const { rank, world, microBatch } = c.key;
    const blockBytes = this.#opts.cache.blockBytes;
    const to = Math.min(c.warmedThrough + PLAN_LEAD, lastStep);
    for (let s = Math.max(c.requestedThrough, c.warmedThrough) + 1; s <= to; s++) {
      plansAhead.request(c.reg, stepSamples(s, rank, world, microBatch), microBatch, blockBytes);
    }
    c.requestedThrough = Math.max(c.requestedThrough, to);
    plansAhead.flush();
  }

  /** Records that consumer `c` needs blocks `keys` at `due` (a step after those it has scheduled). */
  #schedule(c: Consumer, keys: readonly string[], due: number): void {
    for (let pos = 0; pos < keys.length; pos++) {
      const k = keys[pos];
      const queue = c.dues.get(k);
      if (queue) {
        queue.push(due);
        continue;
      }
      c.dues.set(k, [due]);
      const holders = this.#holders.get(k);
      if (holders) holders.push(c);
      else this.#holders.set(k, [c]);
    }
  }

  /**
   * Starts keeping dues: from every consumer's window as it stands, in step order (as `#warm`
   * would have recorded them), then step by step.
   */
  #startTracking(): void {
    this.#tracking = true;
    for (const c of this.#consumers.values()) {
      for (let i = c.head; i < c.scheduled.length; i++) this.#schedule(c, c.scheduled[i].keys, c.scheduled[i].due);
    }
  }

  /**
   * Forgets the consumer's scheduled steps up to `through`: their blocks lose the protection
   * this consumer gave them (another consumer's later use, if any, keeps its own entry).
   */
  #release(c: Consumer, through: number): void {
    // Steps were scheduled in increasing order, so the queue is in step order, and each key's due
    // queue starts with the earliest step still scheduled: O(blocks) per step served.
    const queue = c.scheduled;
    let i = c.head;
    for (; i < queue.length && queue[i].step <= through; i++) {
      const entry = queue[i];
      c.windowBytes -= entry.bytes;
      if (!this.#tracking) continue;
      for (const k of entry.keys) {
        const dues = c.dues.get(k)!;
        dues.shift(); // this step's due
        // A block shared with a later scheduled step of this consumer stays protected until then,
        // and one another consumer needs, until that consumer's step.
        if (dues.length > 0) continue;
        c.dues.delete(k);
        const holders = this.#holders.get(k)!;
        if (holders.length === 1) this.#holders.delete(k);
        else holders.splice(holders.indexOf(c), 1);
      }
    }
    if (i === queue.length) {
      queue.length = 0;
      c.head = 0;
    } else if (i > RELEASED_KEPT) {
      queue.splice(0, i);
      c.head = 0;
    } else c.head = i;
  }

  /** The consumer's last step (its epoch ends at the last full step, as served). */
  #lastStep(c: Consumer): number {
    return fullSteps(c.reg.dataset.numSamples, c.key.world, c.key.microBatch) - 1;
  }

  /** Every tracked consumer with its look-ahead now. */
  lookahead(): ConsumerLookahead[] {
    const { cache, maxSteps } = this.#opts;
    // A server nobody reads from calls `observe` no more: forget idle consumers here too (what
    // /metrics and /v1/status show, and the dataset index a consumer keeps alive).
    this.#forgetIdle(this.#opts.now());
    const out: ConsumerLookahead[] = [];
    for (const c of this.#consumers.values()) {
      let buffered = 0;
      const last = Math.min(this.#lastStep(c), c.step + maxSteps);
      outer: for (let s = c.step + 1; s <= last; s++) {
        const plan = planSamples(c.reg, stepSamples(s, c.key.rank, c.key.world, c.key.microBatch), c.key.microBatch, cache.blockBytes, "once");
        for (const packed of plan.blocks) {
          const f = c.reg.files[blockSource(packed)];
          if (!cache.inMemory(f.gw, f.binKey, f.bin, blockIndex(packed))) break outer;
        }
        buffered++;
      }
      out.push({
        ...c.key,
        step: c.step,
        stepSeconds: c.stepSeconds,
        stepsBuffered: buffered,
        secondsBuffered: buffered * c.stepSeconds,
        stepsScheduled: c.warmedThrough - c.step,
      });
    }
    return out;
  }
}
