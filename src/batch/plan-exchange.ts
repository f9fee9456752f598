/**
 * @module Plans made ahead on a planning thread, exchanged through one `SharedArrayBuffer`: the
 * event loop asks for the plans of consumers' coming steps (a queue of requests), the planning
 * thread makes them and writes each into a slot of a table, and the event loop copies a plan out
 * of its slot when read-ahead reaches that step. Planning is memory latency (a chain of dependent
 * index reads per sample, cache misses while batches stream through the cache), about a quarter
 * of the event loop per token batch; a slot's copy is a few hundred numbers read in order.
 *
 * No message crosses per plan: requests and plans are plain numbers in shared memory, and the
 * planning thread is woken (a futex) only when it sleeps, once per group of requests.
 */

import { planKeyHash, type SamplePlan, SEGMENT_STRIDE } from "./block-plans.ts";
import type { RegisteredDataset } from "./dataset-catalog.ts";

/** What read-ahead asks of a planning thread (see `ReadAhead`'s `plansAhead` option). */
export interface PlansAhead {
  /**
   * Asks for the plan of samples `[first, first + count)` of a dataset. Nothing is promised: a
   * full queue, a dataset the thread does not hold or a plan too large for a slot leave the step
   * to be planned on the event loop.
   */
  request(reg: RegisteredDataset, first: number, count: number, blockBytes: number): void;
  /** Wakes the planning thread for the requests made since the last call, if it sleeps. */
  flush(): void;
  /** The plan made ahead for this run of dataset version `regId` (`datasetVersionId`), copied out of its slot, or `undefined`. */
  take(regId: number, first: number, count: number, blockBytes: number): SamplePlan | undefined;
}

/** A started planning thread as the server holds it: read-ahead's `PlansAhead`, its count for /metrics, its shutdown. */
export interface PlanningThreadHandle extends PlansAhead {
  /** Plans the event loop took from the thread. */
  readonly plansTaken: number;
  /** Ends the thread. */
  close(): Promise<void>;
}

/** Requests the queue holds (a power of two). */
export const PLAN_QUEUE = 1024;
/** Slots of the plan table: 2^SLOT_BITS. */
const SLOT_BITS = 9;
/** Slots of the plan table. */
export const PLAN_SLOTS = 2 ** SLOT_BITS;
/** Numbers per slot: a header, then a plan's segments and blocks (larger plans are not made ahead). */
export const PLAN_SLOT_NUMBERS = 1024;

/** Numbers before a plan in its slot: the key (4), segment numbers, block count, and a checksum of the plan's numbers. */
const HEADER = 7;
/** Int32 indexes into ctrl: requests written (event loop only), requests taken (planning thread only), 1 while the planning thread sleeps. */
const HEAD = 0;
const TAIL = 1;
const SLEEPING = 2;
/** Int32s of ctrl; the fourth is unused and keeps the Float64 arrays after the sequence numbers 8-byte aligned. */
const CTRL_INTS = 4;
/** Numbers per queued request: regId, first, count, blockBytes. */
const REQUEST_NUMBERS = 4;

/** `Atomics.waitAsync` (ES2024; both runtimes have it, this project's TypeScript lib does not name it). */
interface AtomicsWaitAsync {
  waitAsync(a: Int32Array, index: number, value: number): { async: false; value: string } | { async: true; value: Promise<string> };
}

/** Bytes of the shared buffer a `PlanExchange` needs. */
export const PLAN_EXCHANGE_BYTES = CTRL_INTS * 4 + PLAN_SLOTS * 4 + 8 * (PLAN_QUEUE * REQUEST_NUMBERS + PLAN_SLOTS * PLAN_SLOT_NUMBERS);

/** The slot of a run: the high bits of its key's hash. */
function slotOf(regId: number, first: number, count: number, blockBytes: number): number {
  return planKeyHash(regId, first, count, blockBytes) >>> (32 - SLOT_BITS);
}

/**
 * Both ends of the exchange over one shared buffer: the event loop calls `request`, `flush` and
 * `take`; the planning thread calls `nextRequest`, `publish` and `waitForRequests`. Each end is
 * used by one thread only.
 *
 * A slot is a seqlock: its sequence number is odd while the planning thread writes it, so a
 * reader that sees the same even number before and after its copy has read a whole plan. The
 * queue's head is written only by the event loop and its tail only by the planning thread; both
 * count up and wrap as 32-bit integers.
 *
 * @example
 * ```ts
 * const ex = new PlanExchange(new SharedArrayBuffer(PLAN_EXCHANGE_BYTES));
 * ex.request(1, 0, 8, 1 << 20); ex.flush();       // event loop
 * // planning thread: while (ex.nextRequest(key)) ex.publish(key, planOf(key));
 * const plan = ex.take(1, 0, 8, 1 << 20);           // event loop, later
 * ```
 */
export class PlanExchange {
  /** The shared buffer, to hand to the planning thread. */
  readonly buffer: SharedArrayBuffer;
  readonly #ctrl: Int32Array;
  readonly #seq: Int32Array;
  readonly #requests: Float64Array;
  readonly #slots: Float64Array;
  /** Requests pushed since the last `flush`. */
  #unflushed = 0;
  /** Plans `take` copied out (counted by the event loop's end). */
  taken = 0;
  /** Plans `publish` wrote (counted by the planning thread's end). */
  published = 0;

  /** @param buffer a buffer of `PLAN_EXCHANGE_BYTES`, zeroed (new), or the one the other end made */
  constructor(buffer: SharedArrayBuffer) {
    if (buffer.byteLength !== PLAN_EXCHANGE_BYTES) {
      throw new RangeError(`A plan exchange needs ${PLAN_EXCHANGE_BYTES} bytes of shared memory, received ${buffer.byteLength}`);
    }
    this.buffer = buffer;
    this.#ctrl = new Int32Array(buffer, 0, CTRL_INTS);
    this.#seq = new Int32Array(buffer, CTRL_INTS * 4, PLAN_SLOTS);
    const numbers = CTRL_INTS * 4 + PLAN_SLOTS * 4;
    this.#requests = new Float64Array(buffer, numbers, PLAN_QUEUE * REQUEST_NUMBERS);
    this.#slots = new Float64Array(buffer, numbers + 8 * PLAN_QUEUE * REQUEST_NUMBERS, PLAN_SLOTS * PLAN_SLOT_NUMBERS);
  }

  /**
   * Asks for the plan of samples `[first, first + count)` of dataset version `regId`.
   *
   * @returns false when the queue is full (the request is dropped)
   */
  request(regId: number, first: number, count: number, blockBytes: number): boolean {
    const head = this.#ctrl[HEAD];
    if (((head - Atomics.load(this.#ctrl, TAIL)) | 0) >= PLAN_QUEUE) return false;
    const at = (head & (PLAN_QUEUE - 1)) * REQUEST_NUMBERS;
    const r = this.#requests;
    r[at] = regId;
    r[at + 1] = first;
    r[at + 2] = count;
    r[at + 3] = blockBytes;
    // The store publishes the entry: the planning thread reads it only after it sees this head.
    Atomics.store(this.#ctrl, HEAD, (head + 1) | 0);
    this.#unflushed++;
    return true;
  }

  /** See `PlansAhead.flush`. */
  flush(): void {
    if (this.#unflushed === 0) return;
    this.#unflushed = 0;
    // The planning thread sets SLEEPING before it reads HEAD a last time, and this end stores HEAD
    // before it reads SLEEPING: one of the two sees the other's write, so no wake-up is lost.
    if (Atomics.load(this.#ctrl, SLEEPING) === 1) Atomics.notify(this.#ctrl, HEAD);
  }

  /** See `PlansAhead.take`. */
  take(regId: number, first: number, count: number, blockBytes: number): SamplePlan | undefined {
    const slot = slotOf(regId, first, count, blockBytes);
    const seq = Atomics.load(this.#seq, slot);
    if (seq === 0 || (seq & 1) === 1) return undefined;
    const s = this.#slots;
    const at = slot * PLAN_SLOT_NUMBERS;
    if (s[at] !== regId || s[at + 1] !== first || s[at + 2] !== count || s[at + 3] !== blockBytes) return undefined;
    const nSeg = s[at + 4];
    const nBlocks = s[at + 5];
    if (!(nSeg >= 0 && nBlocks >= 0 && HEADER + nSeg + nBlocks <= PLAN_SLOT_NUMBERS)) return undefined;
    // Plain arrays, as a plan made on the event loop has (see `planInScratch`).
    const segments = new Array<number>(nSeg);
    let sum = 0;
    for (let i = 0, k = at + HEADER; i < nSeg; i++, k++) sum += segments[i] = s[k];
    const blocks = new Array<number>(nBlocks);
    for (let i = 0, k = at + HEADER + nSeg; i < nBlocks; i++, k++) sum += blocks[i] = s[k];
    // Rewritten while copied (a newer plan in the same slot): what was read is not one plan. The
    // sequence number tells on x86-64, where loads are not reordered with each other; the
    // checksum also where they may be (a plain load moved past the second sequence load).
    if (Atomics.load(this.#seq, slot) !== seq || sum !== s[at + 6]) return undefined;
    this.taken++;
    return { segments, segmentCount: nSeg / SEGMENT_STRIDE, blocks };
  }

  /**
   * Planning thread: takes the oldest request into `key` (regId, first, count, blockBytes).
   *
   * @returns false when the queue is empty
   */
  nextRequest(key: Float64Array): boolean {
    const tail = this.#ctrl[TAIL];
    if (Atomics.load(this.#ctrl, HEAD) === tail) return false;
    const at = (tail & (PLAN_QUEUE - 1)) * REQUEST_NUMBERS;
    key[0] = this.#requests[at];
    key[1] = this.#requests[at + 1];
    key[2] = this.#requests[at + 2];
    key[3] = this.#requests[at + 3];
    Atomics.store(this.#ctrl, TAIL, (tail + 1) | 0);
    return true;
  }

  /**
   * Planning thread: writes the plan of `key` into its slot (replacing what was there).
   *
   * @returns false when the plan does not fit a slot (it is then made on the event loop)
   */
  publish(key: Float64Array, plan: SamplePlan): boolean {
    const nSeg = plan.segments.length;
    const nBlocks = plan.blocks.length;
    if (HEADER + nSeg + nBlocks > PLAN_SLOT_NUMBERS) return false;
    const slot = slotOf(key[0], key[1], key[2], key[3]);
    const s = this.#slots;
    const at = slot * PLAN_SLOT_NUMBERS;
    Atomics.add(this.#seq, slot, 1); // odd: being written
    s[at] = key[0];
    s[at + 1] = key[1];
    s[at + 2] = key[2];
    s[at + 3] = key[3];
    s[at + 4] = nSeg;
    s[at + 5] = nBlocks;
    let sum = 0;
    for (let i = 0, k = at + HEADER; i < nSeg; i++, k++) sum += s[k] = plan.segments[i];
    for (let i = 0, k = at + HEADER + nSeg; i < nBlocks; i++, k++) sum += s[k] = plan.blocks[i];
    s[at + 6] = sum;
    Atomics.add(this.#seq, slot, 1); // even: whole
    this.published++;
    return true;
  }

  /**
   * Planning thread: resolves when there are requests to take; until then the thread's event
   * loop runs (its messages, such as a new dataset, are handled meanwhile).
   */
  async waitForRequests(): Promise<void> {
    const tail = this.#ctrl[TAIL];
    Atomics.store(this.#ctrl, SLEEPING, 1);
    if (Atomics.load(this.#ctrl, HEAD) === tail) {
      const w = (Atomics as unknown as AtomicsWaitAsync).waitAsync(this.#ctrl, HEAD, tail);
      if (w.async) await w.value;
    }
    Atomics.store(this.#ctrl, SLEEPING, 0);
  }
}
