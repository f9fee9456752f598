/**
 * @module Batch assembly: the tokens of samples `[first, first + count)` copied once, from cached
 * `.bin` blocks straight into the response buffer, in the dataset's served dtype.
 */

import { Buffer } from "node:buffer";
import type { BlockCache } from "../cache/block-cache.ts";
import { DTYPE_CODES, PIECE_STRIDE, type TokenDataset, type TokenDtype } from "../dataset/mod.ts";
import { CacheServerError, RangeNotSatisfiableError } from "../errors.ts";
import type { RegisteredDataset } from "./dataset-catalog.ts";
import { blockAddress, PIECE_NUMBERS, type PieceCopier, SLICE_BYTES } from "./piece-copier.ts";
import type { PlansAhead } from "./plan-exchange.ts";

/** Bytes per token of each dtype. */
export const ITEM_SIZE: Readonly<Record<TokenDtype, number>> = Object.fromEntries(
  Object.values(DTYPE_CODES).map((d) => [d.dtype, d.itemSize]),
) as Record<TokenDtype, number>;

/**
 * A planned run of samples: the blocks it touches and, in output order, the byte ranges to copy
 * out of them (a piece of a sample that crosses a block boundary is two segments).
 */
export interface SamplePlan {
  /** `SEGMENT_STRIDE` numbers per segment: source, position in `blocks`, start and end byte within that block. */
  readonly segments: readonly number[];
  readonly segmentCount: number;
  /** Blocks touched, as `source * 2^32 + blockIndex`, each once. */
  readonly blocks: readonly number[];
}

/** Bytes of the body of `count` samples of a dataset: `count × windowLength` tokens of its served dtype. */
export function bodyBytes(reg: RegisteredDataset, count: number): number {
  return count * reg.dataset.windowLength * ITEM_SIZE[reg.dataset.dtype];
}

/** Numbers per segment of a `SamplePlan`. */
export const SEGMENT_STRIDE = 4;

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

const BLOCK_KEY = 2 ** 32;

/** The planning scratch shared by all calls of `planSamples`: one sample's pieces. */
let pieceScratch = new Float64Array(PIECE_STRIDE * 64);

/** What `readIndexes` returned, summed: kept so that its reads are not optimized away. */
let indexReads = 0;

/** The blocks and segments of the plan being made (planning is synchronous: one at a time). */
let blockScratch: number[] = [];
let segmentScratch: number[] = [];
/** The longest scratch kept between plans (numbers; 8 MiB): a larger plan's is dropped after it. */
const MAX_SCRATCH_PLAN_NUMBERS = 2 ** 20;

/** Blocks a plan looks up by scanning (the last ones found) before it asks `planBlockPos`. */
const RECENT_BLOCKS = 32;

const itemSizesCache = new WeakMap<TokenDataset, Float64Array>();

/** Bytes per token of each source of a dataset, by source number. */
function itemSizesOf(ds: TokenDataset): Float64Array {
  let v = itemSizesCache.get(ds);
  if (v === undefined) itemSizesCache.set(ds, (v = Float64Array.from(ds.sources, (src) => src.index.itemSize)));
  return v;
}

/** Each planned block's position in the plan being made, once it has more than RECENT_BLOCKS: cleared per plan, not made per plan. */
const planBlockPos = new Map<number, number>();

/** Bytes of plans kept for reuse, all datasets together. */
const PLAN_CACHE_BYTES = 32 * 2 ** 20;
/** Slots of the plan table: 2^PLAN_SLOT_BITS. */
const PLAN_SLOT_BITS = 12;
const PLAN_SLOTS = 2 ** PLAN_SLOT_BITS;

interface KeptPlan {
  readonly regId: number;
  readonly first: number;
  readonly count: number;
  readonly blockBytes: number;
  readonly plan: SamplePlan;
  readonly bytes: number;
  /** Who made it: the other user's lookup is its last. */
  readonly by: PlanUse;
}

/**
 * Who asks for a plan: read-ahead (for a step ahead), the step's batch, or a one-off use (a
 * prefetch job's sweep, a HEAD, the look-ahead metrics) that keeps nothing.
 */
export type PlanUse = "read-ahead" | "batch" | "once";

/**
 * Recent plans in a table indexed by a hash of (dataset, first sample, count): read-ahead plans
 * step s+K, and step s's batch finds its plan here (or the other way round), so each step is
 * planned once. The second of the two takes the plan out of the table: kept until a collision,
 * every plan outlived the young generation and was promoted, and the old generation's
 * collections took a tenth of the event loop's time per token batch. No string key and no map
 * per lookup (a plan costs only a µs, so the lookup must cost far less); a colliding plan
 * replaces the older one. Dataset versions are held by number, never by reference, so a
 * replaced dataset's indexes are not kept alive by its plans.
 */
const kept = new Array<KeptPlan | undefined>(PLAN_SLOTS);
let keptBytes = 0;

/**
 * Plans taken out of `kept` lately, in a small table of their own (a newer one replaces one in
 * its slot): a few milliseconds of steps, so they still die young.
 */
const TAKEN_SLOTS = 256;
const TAKEN_MASK = TAKEN_SLOTS - 1;
const taken = new Array<KeptPlan | undefined>(TAKEN_SLOTS);
/** The largest plan kept in `taken` (a token batch's is ~1–2 KB): at most 4 MiB stay there, whatever is asked. */
const MAX_TAKEN_PLAN_BYTES = 16 * 1024;
/** A number per registered dataset version (a rebuilt dataset is a new object, so its plans are new too). */
const regIds = new WeakMap<RegisteredDataset, number>();
let lastRegId = 0;

/**
 * Plans the pieces of samples `[first, first + count)` and the blocks they need. Plans are
 * kept (within `PLAN_CACHE_BYTES`) and shared: the same run of samples is planned once for its
 * read-ahead and its batch. The result must not be modified.
 *
 * @param use who asks: a plan made for read-ahead is kept for the batch and the other way round (the second takes it out); `once` keeps nothing (a kept plan is still returned)
 * @param used false when the caller may still give up on this use (`takeResident`, whose batch may then be assembled by `assembleSamples`): it calls `planUsed` once it has not
 * @param ahead where plans made on a planning thread are found (read-ahead's): a plan found there is not made again
 * @throws {RangeNotSatisfiableError} when the run leaves `[0, numSamples)`
 */
export function planSamples(
  reg: RegisteredDataset,
  first: number,
  count: number,
  blockBytes: number,
  use: PlanUse = "batch",
  used = true,
  ahead?: PlansAhead,
): SamplePlan {
  const id = datasetVersionId(reg);
  const slot = planKeyHash(id, first, count, blockBytes) >>> (32 - PLAN_SLOT_BITS);
  const e = kept[slot];
  if (isPlanOf(e, id, first, count, blockBytes)) {
    if (used) takeOut(slot, use);
    return e!.plan;
  }
  // Taken out a moment ago: another reader of the same step (tensor-parallel ranks read one
  // data-parallel rank's batches) finds it here rather than planning it again.
  const t = taken[slot & TAKEN_MASK];
  if (isPlanOf(t, id, first, count, blockBytes)) return t!.plan;
  // A plan from the planning thread has no block keys yet: as a PlanWithKeys it gets them on first
  // use (`blockKeys`), like a plan made here.
  const madeAhead = ahead?.take(id, first, count, blockBytes);
  const plan: SamplePlan = madeAhead === undefined
    ? computePlan(reg.dataset, reg.name, first, count, blockBytes)
    : { segments: madeAhead.segments, segmentCount: madeAhead.segmentCount, blocks: madeAhead.blocks, keysOf: undefined, keys: EMPTY_KEYS } as PlanWithKeys;
  const bytes = (plan.segments.length + plan.blocks.length) * 8 + 256;
  if (use !== "once" && bytes <= PLAN_CACHE_BYTES / 16) {
    if (e !== undefined) keptBytes -= e.bytes;
    if (keptBytes + bytes > PLAN_CACHE_BYTES) {
      // Over budget (large plans): start over rather than track which to drop.
      kept.fill(undefined);
      keptBytes = 0;
    }
    kept[slot] = { regId: id, first, count, blockBytes, plan, bytes, by: use };
    keptBytes += bytes;
  }
  return plan;
}

/**
 * Says that `use` of the plan of samples `[first, first + count)` has happened, for a caller
 * that asked `planSamples` with `used` false: the plan leaves the table if the other user made it.
 */
export function planUsed(reg: RegisteredDataset, first: number, count: number, blockBytes: number, use: PlanUse): void {
  const id = datasetVersionId(reg);
  const slot = planKeyHash(id, first, count, blockBytes) >>> (32 - PLAN_SLOT_BITS);
  if (isPlanOf(kept[slot], id, first, count, blockBytes)) takeOut(slot, use);
}

/** How many plans the plan table keeps and their bytes (for tests and diagnostics). */
export function keptPlans(): { readonly plans: number; readonly bytes: number } {
  let plans = 0;
  for (const e of kept) if (e !== undefined) plans++;
  return { plans, bytes: keptBytes };
}

/** Whether a kept plan is the plan of this run of samples of this dataset version. */
function isPlanOf(e: KeptPlan | undefined, regId: number, first: number, count: number, blockBytes: number): boolean {
  return e !== undefined && e.regId === regId && e.first === first && e.count === count && e.blockBytes === blockBytes;
}

/**
 * The number of a registered dataset version, given on first sight (from 1; a rebuilt dataset is
 * a new version): plans are keyed by it, here and on a planning thread (`PlansAhead`).
 */
export function datasetVersionId(reg: RegisteredDataset): number {
  let id = regIds.get(reg);
  if (id === undefined) regIds.set(reg, (id = ++lastRegId));
  return id;
}

/**
 * A 32-bit hash of a plan's key, for the tables that hold plans (this module's, and the planning
 * thread's slots in `plan-exchange.ts`): each takes its high bits, since a step's first sample is
 * a multiple of world × micro_batch and low bits would leave most slots unused.
 */
export function planKeyHash(regId: number, first: number, count: number, blockBytes: number): number {
  return (Math.imul(first, 0x9e3779b1) ^ Math.imul(count + regId * 0x10001 + blockBytes, 0x85ebca6b)) >>> 0;
}

/** Takes the plan in `slot` out of the table when `use` is its second user. */
function takeOut(slot: number, use: PlanUse): void {
  const e = kept[slot]!;
  if (use === "once" || use === e.by) return;
  kept[slot] = undefined;
  keptBytes -= e.bytes;
  if (e.bytes <= MAX_TAKEN_PLAN_BYTES) taken[slot & TAKEN_MASK] = e;
}

/** Set while a plan is made: planning must not re-enter itself (the scratch arrays are shared). */
let planning = false;

/**
 * Makes the plan of samples `[first, first + count)` of a dataset, kept nowhere: what
 * `planSamples` does on a miss, and what a planning thread does for the steps it is asked for.
 *
 * @param name the dataset's registered name, for the error message
 * @throws {RangeNotSatisfiableError} when the run leaves `[0, numSamples)`
 */
export function computePlan(ds: TokenDataset, name: string, first: number, count: number, blockBytes: number): SamplePlan {
  if (planning) throw new Error("Planning re-entered itself: its scratch arrays would be overwritten");
  planning = true;
  try {
    return planInScratch(ds, name, first, count, blockBytes);
  } finally {
    planning = false;
  }
}

function planInScratch(ds: TokenDataset, name: string, first: number, count: number, blockBytes: number): SamplePlan {
  if (first + count > ds.numSamples) {
    throw new RangeNotSatisfiableError(
      `Samples ${first}-${first + count - 1} of dataset "${name}" do not exist: it has samples 0-${ds.numSamples - 1}`,
    );
  }
  // A sample's pieces go to a scratch array reused by every call (planning is synchronous, so no
  // other plan can interleave); it grows and is never shrunk. Segments go to a plain array, kept
  // with the plan: V8 allocates a typed array's backing store outside its heap, at ~0.5 µs for a
  // token batch's segments, a third of its plan.
  const room = PIECE_STRIDE * ds.maxPiecesPerSample;
  if (pieceScratch.length < room) pieceScratch = new Float64Array(room);
  const pieces = pieceScratch;
  const itemSizes = itemSizesOf(ds);
  const blockPos = planBlockPos;
  if (blockPos.size > 0) blockPos.clear();
  // Built in scratch arrays (written by index, never shortened: V8 would give their storage
  // back) and copied out once at their final length: grown push by push, a token batch's arrays
  // were reallocated four times each, 3× the bytes a plan keeps, in GC time per batch.
  const blocks = blockScratch;
  const segments = segmentScratch;
  // The samples' index entries first, all at once: planned one by one, a 64 KiB token batch's
  // chain of dependent cache misses cost ~4 µs of a 5 µs plan (1 µs with them in cache).
  indexReads += ds.readIndexes(first, count);
  let nBlocks = 0;
  let nNumbers = 0;
  for (let i = first; i < first + count; i++) {
    const n = ds.planSample(i, pieces, 0);
    for (let p = 0; p < n; p++) {
      const source = pieces[PIECE_STRIDE * p];
      let start = pieces[PIECE_STRIDE * p + 1];
      const end = start + pieces[PIECE_STRIDE * p + 2] * itemSizes[source];
      while (start < end) {
        const b = Math.floor(start / blockBytes);
        const packed = source * BLOCK_KEY + b;
        // Most pieces fall in one of the last few blocks found: look there before the map.
        let pos = -1;
        for (let k = nBlocks - 1; k >= 0 && k >= nBlocks - RECENT_BLOCKS; k--) {
          if (blocks[k] === packed) {
            pos = k;
            break;
          }
        }
        // Past the scan, the map: it holds every block once the plan has more than the scan covers.
        if (pos < 0 && nBlocks > RECENT_BLOCKS) pos = blockPos.get(packed) ?? -1;
        if (pos < 0) {
          pos = nBlocks;
          blocks[nBlocks++] = packed;
          if (pos === RECENT_BLOCKS) for (let k = 0; k < RECENT_BLOCKS; k++) blockPos.set(blocks[k], k);
          if (pos >= RECENT_BLOCKS) blockPos.set(packed, pos);
        }
        const to = Math.min(end, (b + 1) * blockBytes);
        segments[nNumbers] = source;
        segments[nNumbers + 1] = pos;
        segments[nNumbers + 2] = start - b * blockBytes;
        segments[nNumbers + 3] = to - b * blockBytes;
        nNumbers += SEGMENT_STRIDE;
        start = to;
      }
    }
  }
  const plan: PlanWithKeys = {
    segments: segments.slice(0, nNumbers),
    segmentCount: nNumbers / SEGMENT_STRIDE,
    blocks: blocks.slice(0, nBlocks),
    keysOf: undefined,
    keys: EMPTY_KEYS,
  };
  // A plan far larger than usual does not keep its scratch for good.
  if (segments.length > MAX_SCRATCH_PLAN_NUMBERS) segmentScratch = [];
  if (blocks.length > MAX_SCRATCH_PLAN_NUMBERS) blockScratch = [];
  return plan;
}

/**
 * A plan as made here: it carries its blocks' cache keys once asked (`blockKeys`). On the plan
 * itself, not in a WeakMap beside it: a weak map entry per plan cost a lookup per use and an
 * ephemeron for the GC to trace, a few per cent of a 64 KiB token batch's server time.
 */
interface PlanWithKeys extends SamplePlan {
  /** The cache `keys` were made for (keys name a cache's block size and origins). */
  keysOf: BlockCache | undefined;
  keys: readonly string[];
}

const EMPTY_KEYS: readonly string[] = [];

/**
 * The cache keys of a plan's blocks, in its order, made once per plan (and cache): read-ahead
 * and the batch then look its blocks up without finding a key per block each time.
 */
export function blockKeys(cache: BlockCache, reg: RegisteredDataset, plan: SamplePlan): readonly string[] {
  const p = plan as PlanWithKeys;
  if (p.keysOf === cache) return p.keys;
  const keys = plan.blocks.map((packed) => {
    const f = reg.files[blockSource(packed)];
    return cache.keyOf(f.gw, f.binKey, f.bin, blockIndex(packed));
  });
  p.keysOf = cache;
  p.keys = keys;
  return keys;
}

/** The source of a plan's block (`SamplePlan.blocks` packs source and block index in one number). */
export function blockSource(packed: number): number {
  return Math.floor(packed / BLOCK_KEY);
}

/** The block index within its source's `.bin` of a plan's block. */
export function blockIndex(packed: number): number {
  return packed % BLOCK_KEY;
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
  readonly ahead?: PlansAhead;
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
  const plan = planSamples(reg, first, count, blockBytes, "batch", true, opts.ahead);
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
  ahead?: PlansAhead,
): ResidentRun | undefined {
  const bytes = checkedBodyBytes(reg, count, maxBytes);
  // Not the batch's use yet: a block missing sends the batch through assembleSamples, which then
  // finds read-ahead's plan still kept.
  const plan = planSamples(reg, first, count, cache.blockBytes, "batch", false, ahead);
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
