/**
 * @module Plans of runs of samples: which bytes of which `.bin` blocks samples `[first, first +
 * count)` take, in output order, and the table that shares each plan between the read-ahead that
 * warms a step's blocks and the batch that copies them (or a planning thread's copy of it).
 */

import type { BlockCache } from "../cache/block-cache.ts";
import { PIECE_STRIDE, type TokenDataset } from "../dataset/mod.ts";
import { RangeNotSatisfiableError } from "../errors.ts";
import type { RegisteredDataset } from "./dataset-catalog.ts";
import type { PlansAhead } from "./plan-exchange.ts";

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

/** Numbers per segment of a `SamplePlan`. */
export const SEGMENT_STRIDE = 4;

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
 * Recent plans in a table indexed by a hash of (dataset, first sample, count), process-wide
 * (servers in one process share it; plans are keyed by dataset version, so they never mix):
 * read-ahead plans step s+K, and step s's batch finds its plan here (or the other way round), so
 * each step is planned once. The second of the two takes the plan out of the table: kept until a collision,
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
  plansAhead?: PlansAhead,
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
  const madeAhead = plansAhead?.take(id, first, count, blockBytes);
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
