/**
 * @module A consumer's steps: which samples step `s` of rank `r` in a world of `w` ranks with
 * micro-batches of `b` takes, and how many steps a dataset has for that consumer. One definition,
 * shared by the HTTP batches route, the shm path, read-ahead, prefetch jobs and the SDK's answer
 * (every path ends a consumer's epoch at the same step).
 */

/** Largest world size a consumer may name (HTTP batches, shm, prefetch jobs, telemetry). */
export const MAX_WORLD = 1 << 20;

/** Largest micro-batch a consumer may name (HTTP batches, shm, prefetch jobs, telemetry). */
export const MAX_MICRO_BATCH = 1 << 20;

/** The first sample of `step` for a consumer: its micro-batch is `[first, first + microBatch)`. */
export function stepSamples(step: number, rank: number, world: number, microBatch: number): number {
  return (step * world + rank) * microBatch;
}

/**
 * The steps of a dataset of `numSamples` samples for consumers of this world and micro-batch:
 * full steps only, `⌊numSamples / (world × microBatch)⌋`, the same for every rank (a last,
 * partial step would give some ranks a batch and others none).
 */
export function fullSteps(numSamples: number, world: number, microBatch: number): number {
  return Math.floor(numSamples / (world * microBatch));
}
