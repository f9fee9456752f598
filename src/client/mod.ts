/**
 * @module The rackfeed client SDK (web standards only). `client/node.ts` adds an HTTP/2 `fetch` on
 * Node and the shm transport (rings mapped through koffi, else read with pread); `client/deno.ts`
 * the shm transport (rings mapped through FFI, else read with pread).
 */

export { type PooledFetch, RackfeedClient, type RackfeedClientOptions, RackfeedError, type StepBatch, type StepTimings, type TokenBatch } from "./client.ts";
export { type LocalSocket, type LocalTransport, type RingReader, ShmError } from "./shm-consumer.ts";
