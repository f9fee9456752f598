/**
 * @module koffi (Node has no FFI of its own), required in one place so that its settings are made
 * before any library is loaded: koffi refuses a change after that.
 */

import { createRequire } from "node:module";

type Koffi = typeof import("koffi");

/**
 * Asynchronous calls koffi keeps memory for between calls; 16 is its maximum (default 4). Each
 * call past them allocates its own stack and heap (256 KiB, a fresh mmap) and frees them when
 * it settles, on the event loop: with two 1 MiB batches of 4 slices in flight that was 35–45 µs
 * of the event loop per batch (bench/RESULTS.md, transport "Session 17").
 */
export const RESIDENT_ASYNC_CALLS = 16;

let koffi: Koffi | undefined;

/**
 * koffi, loaded once and configured for rackfeed. Throws where it cannot load (a platform
 * without its prebuilt addon); callers fall back to what they do without it.
 */
export function loadKoffi(): Koffi {
  if (koffi === undefined) {
    // CommonJS with a native addon: required lazily, so a platform without it still runs.
    const k = createRequire(import.meta.url)("koffi") as Koffi;
    try {
      k.config({ ...k.config(), resident_async_pools: RESIDENT_ASYNC_CALLS });
    } catch {
      // A koffi that refuses the setting still maps rings and copies batches, with slower
      // threaded copies; test/batch/piece-copier.test.ts fails on it, so an upgrade shows it.
    }
    koffi = k;
  }
  return koffi;
}

/**
 * An asynchronous function that runs at most `max` calls at once; later calls wait, first come
 * first served, until one settles. koffi's calls past its resident pools each cost the event loop
 * an allocation, and past 16 copies in flight the copier's threads gain nothing (16 memcpy streams
 * fill a socket's memory bandwidth), so queued slices wait for a pool instead.
 */
export function limitInFlight<A extends unknown[], R>(call: (...args: A) => Promise<R>, max: number): (...args: A) => Promise<R> {
  if (!Number.isInteger(max) || max < 1) throw new RangeError(`max must be a positive integer, got ${max}`);
  let running = 0;
  const waiting: (() => void)[] = [];
  const settle = () => {
    running--;
    waiting.shift()?.();
  };
  const start = (args: A): Promise<R> => {
    running++;
    let p: Promise<R>;
    try {
      p = call(...args);
    } catch (e) {
      p = Promise.reject(e);
    }
    p.then(settle, settle);
    return p;
  };
  return (...args) => {
    if (running < max) return start(args);
    return new Promise<R>((resolve, reject) => waiting.push(() => start(args).then(resolve, reject)));
  };
}
