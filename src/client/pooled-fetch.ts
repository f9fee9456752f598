/**
 * @module A `fetch` over a connection pool it can give up (`PooledFetch`), shared by the Node
 * (undici `Agent`) and Deno (`Deno.HttpClient`) transports: which pool each attempt went out
 * on, a new pool after a timed-out attempt, and `close()`. Web standards only.
 */

import type { PooledFetch } from "./client.ts";

/** The pool controls a `pooledFetch` always has (optional on a `PooledFetch` the caller brings). */
export type PoolControls = Required<Pick<PooledFetch, "abandonConnections" | "close">>;

/** What a runtime's pool offers: make one, send through it, give it up. */
export interface ConnectionPools<P> {
  make(): P;
  send(pool: P, input: string | URL | Request, init: RequestInit | undefined): Promise<Response>;
  /** A pool an attempt timed out on: it takes no new request; requests in flight on it finish. */
  retire(pool: P): void;
  close(pool: P): Promise<void> | void;
}

/**
 * A `PooledFetch` over `pools`: the pool is made at the first request (and again after one is
 * given up), `abandonConnections` retires the pool the timed-out attempt used, once however
 * many attempts time out on it together, and `close()` closes the current one.
 */
export function pooledFetch<P extends object>(pools: ConnectionPools<P>): PooledFetch & PoolControls {
  let current: P | undefined;
  // Which pool each attempt went out on: attempts that time out together on one dead connection
  // retire it once, not each the pool the one before them made.
  const poolOf = new WeakMap<AbortSignal, P>();
  const fetchOver = ((input: string | URL | Request, init?: RequestInit) => {
    const pool = (current ??= pools.make());
    if (init?.signal) poolOf.set(init.signal, pool);
    return pools.send(pool, input, init);
  }) as PooledFetch & PoolControls;
  fetchOver.abandonConnections = (signal) => {
    const old = poolOf.get(signal);
    if (old === undefined || old !== current) return;
    current = undefined; // the next request makes a new pool, with new connections
    pools.retire(old);
  };
  fetchOver.close = async () => {
    const old = current;
    current = undefined;
    if (old !== undefined) await pools.close(old);
  };
  return fetchOver;
}
