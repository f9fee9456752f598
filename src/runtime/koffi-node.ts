/**
 * @module koffi (Node has no FFI of its own), required in one place so that its settings are made
 * before any library is loaded: koffi refuses a change after that.
 */

import { createRequire } from "node:module";

type Koffi = typeof import("koffi");

/**
 * Asynchronous calls koffi keeps memory for between calls; 16 is its maximum (default 4). Each
 * call past them maps its own stack and heap (two 128 KiB `mmap`s) and unmaps them when it
 * settles, on the event loop: with two 1 MiB batches of 4 slices in flight that was 35–45 µs of
 * the event loop per batch (bench/RESULTS.md, transport "Session 17").
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
      // Refused where koffi was loaded before (by a user's code in the SDK's process) or by a
      // koffi without the setting: it still maps rings and copies batches, its threaded copies
      // slower (test/runtime/koffi-node.test.ts).
    }
    koffi = k;
  }
  return koffi;
}

/** An asynchronous function limited by `limitInFlight`, with its counts (for tests and metrics). */
export interface LimitedCall<A extends unknown[], R> {
  (...args: A): Promise<R>;
  /** Calls started and not yet settled. */
  readonly running: number;
  /** Calls waiting for one of those to settle. */
  readonly waiting: number;
}

/**
 * An asynchronous function that runs at most `max` calls at once; later calls wait, first come
 * first served, until one settles. Node's gather runs its slices through it so that each finds
 * one of koffi's resident pools: a batch is spread over 8 threads at most, so 16 slices in flight
 * keep two batches' copies going at full width.
 */
export function limitInFlight<A extends unknown[], R>(call: (...args: A) => Promise<R>, max: number): LimitedCall<A, R> {
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
      p = Promise.resolve(call(...args));
    } catch (e) {
      p = Promise.reject(e);
    }
    p.then(settle, settle);
    return p;
  };
  const limited = (...args: A): Promise<R> => {
    if (running < max) return start(args);
    return new Promise<R>((resolve, reject) => waiting.push(() => start(args).then(resolve, reject)));
  };
  return Object.defineProperties(limited, {
    running: { get: () => running },
    waiting: { get: () => waiting.length },
  }) as LimitedCall<A, R>;
}
