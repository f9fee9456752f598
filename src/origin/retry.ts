/** @module Retry policy of remote origins: capped exponential backoff with full jitter, and an abortable sleep. */

/** How often and how patiently a failed origin request is tried again. */
export interface RetryPolicy {
  /** Retries after the first attempt (0 = try once). */
  readonly retries: number;
  /** Backoff before the first retry, in ms; doubles per retry. */
  readonly baseMs: number;
  /** Longest backoff, in ms. */
  readonly capMs: number;
}

/**
 * The pause before retry number `retry` (0-based): "full jitter" (AWS architecture blog,
 * "Exponential Backoff And Jitter"), uniformly random in `[0, min(cap, base * 2^retry)]`, so a
 * burst of clients that failed together does not come back together.
 *
 * @param retry 0 for the first retry
 * @param policy base and cap
 * @param random a uniform [0, 1) source (injected in tests)
 * @returns the delay in ms
 * @example
 * ```ts
 * backoffDelay(3, { retries: 4, baseMs: 50, capMs: 2000 }, Math.random); // somewhere in 0..400
 * ```
 */
export function backoffDelay(retry: number, policy: RetryPolicy, random: () => number): number {
  const ceiling = Math.min(policy.capMs, policy.baseMs * 2 ** Math.min(retry, 30));
  return Math.floor(random() * ceiling);
}

/**
 * The longest time a request can take before its caller gets an error, with every attempt
 * timing out and every backoff at its ceiling: the "bounded time" promised for a dead origin.
 *
 * @param policy retries and backoff
 * @param timeoutMs the per-attempt timeout
 * @returns the bound in ms
 */
export function worstCaseMs(policy: RetryPolicy, timeoutMs: number): number {
  let total = (policy.retries + 1) * timeoutMs;
  for (let r = 0; r < policy.retries; r++) total += Math.min(policy.capMs, policy.baseMs * 2 ** Math.min(r, 30));
  return total;
}

/**
 * Resolves after `ms`, or rejects with the signal's reason as soon as it aborts.
 *
 * @param ms how long
 * @param signal cancels the wait
 * @returns when the time has passed
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const t = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    const onAbort = () => {
      clearTimeout(t);
      reject(signal!.reason);
    };
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}
