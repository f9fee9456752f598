/**
 * @module Batch assembly: the tokens of samples `[first, first + count)` copied once, from cached
 * `.bin` blocks straight into the response buffer, in the dataset's served dtype.
 */

import { Buffer } from "node:buffer";
import type { BlockCache } from "../cache/block-cache.ts";
import { DTYPE_CODES, type TokenDtype } from "../dataset/mod.ts";
import { CacheServerError } from "../errors.ts";
import type { RegisteredDataset } from "./dataset-catalog.ts";
import { blockAddress, PIECE_NUMBERS, type PieceCopier, SLICE_BYTES } from "./piece-copier.ts";
import type { PlansAhead } from "./plan-exchange.ts";
import { blockIndex, blockKeys, blockSource, planSamples, planUsed, type SamplePlan, SEGMENT_STRIDE } from "./block-plans.ts";

/** Bytes per token of each dtype. */
export const ITEM_SIZE: Readonly<Record<TokenDtype, number>> = Object.fromEntries(
  Object.values(DTYPE_CODES).map((d) => [d.dtype, d.itemSize]),
) as Record<TokenDtype, number>;

/** Bytes of the body of `count` samples of a dataset: `count × windowLength` tokens of its served dtype. */
export function bodyBytes(reg: RegisteredDataset, count: number): number {
  return count * reg.dataset.windowLength * ITEM_SIZE[reg.dataset.dtype];
}

/** Where a batch's bytes went and how long each part took, for metrics and slow-batch analysis. */
export interface AssembledBatch {
  readonly body: Uint8Array;
  readonly dtype: TokenDtype;
  readonly shape: readonly [number, number];
  /** Blocks that were neither in memory nor being filled when the batch was asked for. */
  readonly blocksMissing: number;
  /** Of `blocksMissing`, those read from the origin (the others came from the NVMe tier). */
  readonly missingFromOrigin: number;
  /** Blocks whose fill (usually started by read-ahead) was still in flight. */
  readonly blocksFilling: number;
  /** Where the blocks came from: already in memory, or a disk or origin fill started or joined. */
  readonly fromMemory: number;
  readonly fromDisk: number;
  readonly fromOrigin: number;
  /** Seconds waiting for blocks, and seconds planning + copying. */
  readonly fetchSeconds: number;
  readonly copySeconds: number;
  readonly blocksTotal: number;
}

/** How `assembleSamples` runs: its clock, where the body goes, and how pieces are copied. */
export interface AssembleOptions {
  /** Clock in ms (default `performance.now`). */
  readonly now?: () => number;
  /** Where to assemble (a shared-memory slot, a pooled body); a new buffer when unset. */
  readonly into?: Uint8Array;
  /** The native gather, where the runtime loaded it; unset: pieces are copied in JavaScript. */
  readonly copier?: PieceCopier;
  /** Where plans made on a planning thread are found (`ReadAhead.plansAhead`); unset: a plan not kept is made here. */
  readonly plansAhead?: PlansAhead;
}

/** Slices queued for or running on the copier's threads, all batches together. */
let slicesInFlight = 0;
/** Beyond this many slices in flight, batches are copied on the event loop. */
const MAX_SLICES_IN_FLIGHT = 128;
/** The largest copy list kept for reuse (numbers; 24 MiB): a larger one is made for its batch alone. */
const MAX_SCRATCH_NUMBERS = 3 * 2 ** 20;

/** The smallest slice when a batch is cut fewer than four ways (see `copyNatively`). */
const MIN_SLICE_OF_FEW = 2 * 2 ** 20;

/** The addresses of a batch's blocks, by position in its plan; read only while its copy list is made. */
let addressScratch = new Float64Array(64);

/** The copy list of a batch copied on this thread, reused (such a copy never interleaves with another). */
let copyScratch = new Float64Array(PIECE_NUMBERS * 1024);

/**
 * Assembles samples `[first, first + count)` of a dataset: fetches every block they touch (in
 * parallel, through the cache's single-flight fills), then copies each piece once into the body:
 * natively where a copier is given (a batch of a MiB or more spread over its threads), else in
 * JavaScript.
 *
 * @param cache the block cache
 * @param reg the dataset
 * @param first first sample
 * @param count number of samples
 * @param maxBytes the largest body allowed
 * @param opts clock, destination and copier
 * @returns the body (`count × windowLength` tokens, little-endian) and what it cost
 * @throws {CacheServerError} `BAD_REQUEST` when the body would exceed `maxBytes`
 * @throws {RangeNotSatisfiableError} when a sample does not exist
 */
export async function assembleSamples(
  cache: BlockCache,
  reg: RegisteredDataset,
  first: number,
  count: number,
  maxBytes: number,
  opts: AssembleOptions = {},
): Promise<AssembledBatch> {
  const now = opts.now ?? (() => performance.now());
  const into = opts.into;
  const t0 = now();
  const ds = reg.dataset;
  const w = ds.windowLength;
  const bytes = checkedBodyBytes(reg, count, maxBytes);
  const blockBytes = cache.blockBytes;
  const plan = planSamples(reg, first, count, blockBytes, "batch", true, opts.plansAhead);
  let missing = 0;
  let missingFromOrigin = 0;
  let filling = 0;
  const from = { memory: 0, disk: 0, origin: 0 };
  // The plan's blocks in its order: segments name their block by position here.
  const got = new Array<Uint8Array>(plan.blocks.length);
  const t1 = now();
  // Blocks in memory are taken at once; only the others cost a promise (and a wait).
  let fetches: Promise<void>[] | undefined;
  const keys = blockKeys(cache, reg, plan);
  for (let pos = 0; pos < plan.blocks.length; pos++) {
    const inMemory = cache.memoryBlockOfKey(keys[pos]);
    if (inMemory) {
      from.memory++;
      got[pos] = inMemory;
      continue;
    }
    const packed = plan.blocks[pos];
    const f = reg.files[blockSource(packed)];
    const index = blockIndex(packed);
    const wasMissing = !cache.filling(f.gw, f.binKey, f.bin, index);
    if (wasMissing) missing++;
    else filling++;
    (fetches ??= []).push(cache.blockFrom(f.gw, f.binKey, f.bin, index).then((b) => {
      from[b.source]++;
      if (wasMissing && b.source === "origin") missingFromOrigin++;
      got[pos] = b.bytes;
    }));
  }
  cache.countMemoryHits(from.memory);
  if (fetches) await Promise.all(fetches);
  const t2 = now();

  if (into && into.length < bytes) throw new RangeError(`A slot of ${into.length} bytes cannot hold a batch of ${bytes}`);
  // Every byte is written below (checked: `dst === bytes`), so a new body need not be zeroed
  // first: a zeroed buffer of this size costs fresh pages or a memset on every batch.
  const body = into ? into.subarray(0, bytes) : Buffer.allocUnsafeSlow(bytes);
  // The body is not zeroed, so every byte counted must be a byte copied: a block shorter than its
  // plan (impossible while fills are sized from the object's length) fails the batch.
  const copier = opts.copier;
  const copied = copier && servedAsStored(reg) && plan.segmentCount > 0 ? copyNatively(copier, reg, plan, got, body) : copyInScript(reg, plan, got, body);
  const dst = typeof copied === "number" ? copied : await copied;
  if (dst !== bytes) {
    throw new Error(`Batch of dataset "${reg.name}" assembled ${dst} bytes, expected ${bytes}: the plan and the window disagree`);
  }
  const t3 = now();
  return {
    body,
    dtype: ds.dtype,
    shape: [count, w],
    blocksMissing: missing,
    missingFromOrigin,
    blocksFilling: filling,
    blocksTotal: plan.blocks.length,
    fromMemory: from.memory,
    fromDisk: from.disk,
    fromOrigin: from.origin,
    fetchSeconds: (t2 - t1) / 1000,
    copySeconds: (t1 - t0 + t3 - t2) / 1000,
  };
}

/** Copies a plan's segments in JavaScript (and widens tokens of mixed-dtype blends); returns the bytes written. */
function copyInScript(reg: RegisteredDataset, plan: SamplePlan, got: Uint8Array[], body: Uint8Array): number {
  const ds = reg.dataset;
  let view: DataView | undefined; // only mixed-dtype blends need one
  let dst = 0; // bytes written
  const { segments, segmentCount } = plan;
  for (let i = 0; i < segmentCount * SEGMENT_STRIDE; i += SEGMENT_STRIDE) {
    const inDtype = ds.sources[segments[i]].index.dtype;
    const block = got[segments[i + 1]];
    const start = segments[i + 2];
    const end = segments[i + 3];
    checkBlock(reg, block, end);
    if (inDtype === ds.dtype) {
      body.set(block.subarray(start, end), dst);
      dst += end - start;
    } else {
      view ??= new DataView(body.buffer, body.byteOffset, body.byteLength);
      dst = widenInto(view, dst, block, start, end, inDtype);
    }
  }
  return dst;
}

/**
 * How many slices a batch of `bytes` is cut into for the copier's threads; 1: one call on the
 * event loop. A hop to the threads and back costs tens of µs: it pays when the copy is cut four
 * ways or more, or in slices of 2 MiB or more (on 2 cores a 1 MiB batch in two slices ran at
 * 0.4–0.6× of one call on the event loop, an 8 MiB one at 1.3–1.4×; bench/RESULTS.md transport
 * "Session 13").
 */
export function threadSlices(copier: PieceCopier, bytes: number): number {
  const slices = Math.min(copier.threads, Math.floor(bytes / SLICE_BYTES));
  return slices < 2 || (slices < 4 && bytes / slices < MIN_SLICE_OF_FEW) ? 1 : slices;
}

/** Whether a batch of `count` samples of a dataset is copied on the copier's threads (not on the event loop, not in JavaScript). */
export function copiedOnThreads(copier: PieceCopier | undefined, reg: RegisteredDataset, count: number): boolean {
  return copier !== undefined && servedAsStored(reg) && threadSlices(copier, bodyBytes(reg, count)) > 1;
}

/**
 * Copies a plan's segments with the native gather: on this thread for a small batch (a thread
 * hop costs more than copying 64 KiB), else in slices of at least `SLICE_BYTES` on the copier's
 * threads, while the event loop serves others. Returns the bytes copied.
 */
function copyNatively(copier: PieceCopier, reg: RegisteredDataset, plan: SamplePlan, got: Uint8Array[], body: Uint8Array): number | Promise<number> {
  const bytes = body.length;
  const cut = threadSlices(copier, bytes);
  const slices = cut > 1 ? cut : 0;
  const pieces = copyList(slices, plan.segmentCount);
  const dst = listPieces(copier, reg, plan, got, pieces, 0, 0);
  // Every piece must land inside the body: the native copy checks nothing.
  if (dst !== bytes) return dst;
  return runCopy(copier, body, pieces, plan.segmentCount, bytes, slices, got);
}

/**
 * A copy list for `count` pieces (`slices` as for `runCopy`): the reused scratch for a copy on
 * this thread, else a list of its own (the threads read it after the next batch has reused the
 * scratch), as is a list far larger than usual, which the scratch would then keep for good.
 */
function copyList(slices: number, count: number): Float64Array {
  const numbers = PIECE_NUMBERS * count;
  if (slices >= 1 || numbers > MAX_SCRATCH_NUMBERS) return new Float64Array(numbers);
  if (copyScratch.length < numbers) copyScratch = new Float64Array(Math.min(MAX_SCRATCH_NUMBERS, numbers * 2));
  return copyScratch;
}

/**
 * Writes a plan's pieces into a copy list from piece `p` on, landing from `offset` on in the
 * destination; returns the bytes listed.
 */
function listPieces(copier: PieceCopier, reg: RegisteredDataset, plan: SamplePlan, got: Uint8Array[], pieces: Float64Array, p: number, offset: number): number {
  const { segments, segmentCount } = plan;
  // One address per block, not per segment: a batch has many segments in each of its blocks.
  if (addressScratch.length < got.length) addressScratch = new Float64Array(got.length * 2);
  for (let pos = 0; pos < got.length; pos++) addressScratch[pos] = blockAddress(copier, got[pos]);
  let dst = 0;
  for (let i = 0, k = PIECE_NUMBERS * p; i < segmentCount * SEGMENT_STRIDE; i += SEGMENT_STRIDE, k += PIECE_NUMBERS) {
    const pos = segments[i + 1];
    const start = segments[i + 2];
    const end = segments[i + 3];
    checkBlock(reg, got[pos], end);
    pieces[k] = addressScratch[pos] + start;
    pieces[k + 1] = end - start;
    pieces[k + 2] = offset + dst;
    dst += end - start;
  }
  return dst;
}

/**
 * Copies `count` listed pieces (`bytes` in all) into `dst`: in one call on this thread
 * (`slices` 0), or cut into `slices` of equal bytes on the copier's threads. `keep` (the source
 * blocks) stays referenced until every slice has landed.
 */
function runCopy(copier: PieceCopier, dst: Uint8Array, pieces: Float64Array, count: number, bytes: number, slices: number, keep: unknown): number | Promise<number> {
  // Slices already queued for the threads bound the rest: a burst of large batches (many ranks
  // asking for one step) is copied on the event loop rather than queued without end (koffi also
  // refuses more than 256 calls in flight).
  if (slices < 1 || slicesInFlight + slices > MAX_SLICES_IN_FLIGHT) return copier.copy(dst, pieces, 0, count);
  // Cut where the bytes copied so far pass each slice's share, so threads get equal bytes, not equal pieces.
  const cuts = [0];
  for (let p = 0, k = 1, sum = 0; p < count && k < slices; p++) {
    if (sum >= (k * bytes) / slices) {
      cuts.push(p);
      k++;
    }
    sum += pieces[PIECE_NUMBERS * p + 1];
  }
  cuts.push(count);
  const n = cuts.length - 1;
  slicesInFlight += n;
  // The copy settles only once every slice has: its destination may be a ring slot that is
  // unmapped, or a pooled body that is reused, as soon as it does. A slice the runtime refuses
  // to queue is copied here instead. The closure keeps the blocks, the list and the destination
  // referenced until then.
  const copies = cuts.slice(1).map((end, k) => {
    let onThread: Promise<number>;
    try {
      onThread = copier.copyOnThread(dst, pieces, cuts[k], end);
    } catch (e) {
      onThread = Promise.reject(e); // a binding that throws instead of rejecting: the same fallback
    }
    return onThread.catch(() => copier.copy(dst, pieces, cuts[k], end));
  });
  return Promise.allSettled(copies).then((settled) => {
    slicesInFlight -= n;
    void keep;
    let copied = 0;
    for (const r of settled) {
      if (r.status === "rejected") throw r.reason;
      copied += r.value;
    }
    return copied;
  });
}

/** A run of samples planned with every block in the memory tier: ready to be copied, not copied yet. */
export interface ResidentRun {
  readonly first: number;
  readonly count: number;
  /** Bytes of its body. */
  readonly bytes: number;
  readonly plan: SamplePlan;
  readonly got: Uint8Array[];
}

/**
 * Plans samples `[first, first + count)` and takes their blocks, when every one is in the memory
 * tier (counted as hits); undefined when one is not, with nothing counted (the batch then goes
 * through `assembleSamples`, which counts it).
 *
 * @throws {CacheServerError} `BAD_REQUEST` when the body would exceed `maxBytes`
 * @throws {RangeNotSatisfiableError} when a sample does not exist
 */
export function takeResident(
  cache: BlockCache,
  reg: RegisteredDataset,
  first: number,
  count: number,
  maxBytes: number,
  plansAhead?: PlansAhead,
): ResidentRun | undefined {
  const bytes = checkedBodyBytes(reg, count, maxBytes);
  // Not the batch's use yet: a block missing sends the batch through assembleSamples, which then
  // finds read-ahead's plan still kept.
  const plan = planSamples(reg, first, count, cache.blockBytes, "batch", false, plansAhead);
  const keys = blockKeys(cache, reg, plan);
  const got = new Array<Uint8Array>(keys.length);
  for (let pos = 0; pos < keys.length; pos++) {
    const block = cache.memoryBlockOfKey(keys[pos]);
    if (block === undefined) return undefined;
    got[pos] = block;
  }
  planUsed(reg, first, count, cache.blockBytes, "batch");
  cache.countMemoryHits(got.length);
  return { first, count, bytes, plan, got };
}

/**
 * How many consecutive steps of `count` samples are copied together, into the slots of one
 * mapped ring, by one call of the copier on one of its threads: about `GROUP_BYTES`, at most
 * `maxSteps`. A call to the threads costs the event loop several µs (koffi: 7–9 µs here), more
 * than copying one 64 KiB batch, but little against a group's: the event loop then plans the next
 * group while a thread copies this one. 1 (each step copied alone) where a step's batch is copied
 * on the threads by itself already, where the copier has no thread to spare beside the event
 * loop's, or where the copy is done in JavaScript.
 */
export function stepsPerCopy(copier: PieceCopier | undefined, reg: RegisteredDataset, count: number, maxSteps: number): number {
  if (copier === undefined || copier.threads < MIN_GROUP_THREADS || !servedAsStored(reg)) return 1;
  const bytes = bodyBytes(reg, count);
  if (bytes === 0 || threadSlices(copier, bytes) > 1) return 1;
  const steps = Math.min(maxSteps, Math.ceil(GROUP_BYTES / bytes));
  return steps >= 2 ? steps : 1;
}

/** Bytes of batches copied together by `copyResidentRuns` (one thread's slice per this many). */
const GROUP_BYTES = 2 ** 20;
/** The fewest copier threads for which steps are copied in groups (see `stepsPerCopy`). */
export const MIN_GROUP_THREADS = 4;

/**
 * Copies resident runs, each into its own view of one buffer (the slots of a mapped ring), with
 * one copy list: cut into slices for the copier's threads when the runs together are large
 * enough. Each run's batch is counted as planned and copied in an equal share of the time, from
 * `t0` (when its planning began) to the copy's end.
 *
 * @param into one view per run, each of the same buffer and at least its run's bytes long
 * @throws {RangeError} when a view is of another buffer or too short
 */
export async function copyResidentRuns(
  copier: PieceCopier,
  reg: RegisteredDataset,
  runs: readonly ResidentRun[],
  into: readonly Uint8Array[],
  now: () => number = () => performance.now(),
  t0 = now(),
): Promise<AssembledBatch[]> {
  const buffer = into[0].buffer;
  const dst = new Uint8Array(buffer, 0, buffer.byteLength);
  let count = 0;
  let bytes = 0;
  for (let i = 0; i < runs.length; i++) {
    if (into[i].buffer !== buffer) throw new RangeError("Runs copied together must land in views of one buffer");
    if (into[i].length < runs[i].bytes) throw new RangeError(`A slot of ${into[i].length} bytes cannot hold a batch of ${runs[i].bytes}`);
    count += runs[i].plan.segmentCount;
    bytes += runs[i].bytes;
  }
  // A slice per GROUP_BYTES, on the copier's threads; a group of one small batch, on this thread.
  const slices = runs.length < 2 ? 0 : Math.max(1, Math.min(copier.threads, Math.floor(bytes / GROUP_BYTES)));
  const pieces = copyList(slices, count);
  for (let i = 0, p = 0; i < runs.length; i++) {
    const r = runs[i];
    // Every piece must land inside its slot: the native copy checks nothing.
    const listed = listPieces(copier, reg, r.plan, r.got, pieces, p, into[i].byteOffset);
    if (listed !== r.bytes) {
      throw new Error(`Batch of dataset "${reg.name}" listed ${listed} bytes, expected ${r.bytes}: the plan and the window disagree`);
    }
    p += r.plan.segmentCount;
  }
  const copied = await runCopy(copier, dst, pieces, count, bytes, slices, runs);
  if (copied !== bytes) throw new Error(`Batches of dataset "${reg.name}" copied ${copied} bytes, expected ${bytes}`);
  const seconds = (now() - t0) / 1000 / runs.length;
  const ds = reg.dataset;
  return runs.map((r, i) => ({
    body: into[i].length === r.bytes ? into[i] : into[i].subarray(0, r.bytes),
    dtype: ds.dtype,
    shape: [r.count, ds.windowLength] as const,
    blocksMissing: 0,
    missingFromOrigin: 0,
    blocksFilling: 0,
    blocksTotal: r.got.length,
    fromMemory: r.got.length,
    fromDisk: 0,
    fromOrigin: 0,
    fetchSeconds: 0,
    copySeconds: seconds,
  }));
}

const asStored = new WeakMap<RegisteredDataset, boolean>();

/** Whether every source's tokens are stored in the served dtype (only mixed-dtype blends widen them). */
function servedAsStored(reg: RegisteredDataset): boolean {
  let v = asStored.get(reg);
  if (v === undefined) asStored.set(reg, (v = reg.dataset.sources.every((s) => s.index.dtype === reg.dataset.dtype)));
  return v;
}

function checkBlock(reg: RegisteredDataset, block: Uint8Array, end: number): void {
  if (block.length < end) {
    throw new Error(`Batch of dataset "${reg.name}": a block of ${block.length} bytes is shorter than its plan (${end} bytes)`);
  }
}

/**
 * The body size of `count` samples, refused (400) over `maxBytes` (`--max-batch-bytes`).
 *
 * @returns the body's bytes
 */
export function checkedBodyBytes(reg: RegisteredDataset, count: number, maxBytes: number): number {
  const bytes = bodyBytes(reg, count);
  if (bytes > maxBytes) {
    const ds = reg.dataset;
    throw new CacheServerError(
      "BAD_REQUEST",
      `A body of ${count} samples × ${ds.windowLength} tokens × ${ITEM_SIZE[ds.dtype]} bytes = ${bytes} bytes exceeds --max-batch-bytes (${maxBytes}); ask for fewer samples`,
    );
  }
  return bytes;
}

/**
 * What `cacheState()` of the batch of samples `first .. first+count-1` would say if it were asked
 * for now, without fetching or copying anything (a HEAD request).
 */
export function peekCacheState(cache: BlockCache, reg: RegisteredDataset, first: number, count: number): "hit" | "filling" | "miss" {
  // Not kept in the plan table: a HEAD must not push out the plans of consumers' steps.
  const plan = planSamples(reg, first, count, cache.blockBytes, "once");
  let filling = false;
  for (const packed of plan.blocks) {
    const f = reg.files[blockSource(packed)];
    const index = blockIndex(packed);
    if (cache.inMemory(f.gw, f.binKey, f.bin, index)) continue;
    if (!cache.filling(f.gw, f.binKey, f.bin, index)) return "miss";
    filling = true;
  }
  return filling ? "filling" : "hit";
}

/**
 * Whether a batch's blocks were all in memory (`hit`), some still arriving from a fill already
 * started, usually by read-ahead running late (`filling`), or some fetched for it (`miss`).
 */
export function cacheState(batch: AssembledBatch): "hit" | "filling" | "miss" {
  return batch.blocksMissing > 0 ? "miss" : batch.blocksFilling > 0 ? "filling" : "hit";
}

/** Mixed-dtype blends are served as int32: widen token by token (only this case leaves the byte copy). */
function widenInto(view: DataView, dst: number, block: Uint8Array, from: number, to: number, dtype: TokenDtype): number {
  const src = new DataView(block.buffer, block.byteOffset, block.byteLength);
  const size = ITEM_SIZE[dtype];
  for (let at = from; at < to; at += size) {
    let v: number;
    switch (dtype) {
      case "uint8":
        v = src.getUint8(at);
        break;
      case "int8":
        v = src.getInt8(at);
        break;
      case "int16":
        v = src.getInt16(at, true);
        break;
      case "uint16":
        v = src.getUint16(at, true);
        break;
      default:
        v = src.getInt32(at, true);
    }
    view.setInt32(dst, v, true);
    dst += 4;
  }
  return dst;
}
