/**
 * @module The rackfeed client SDK (web standards only). `client/node.ts` adds an HTTP/2 `fetch` on
 * Node and the shm transport (pread); `client/deno.ts` the shm transport with mapped rings.
 */

export { RackfeedClient, type RackfeedClientOptions, RackfeedError, type StepBatch, type StepTimings, type TokenBatch } from "./client.ts";
export { type LocalSocket, type LocalTransport, type RingReader, ShmError } from "./shm-consumer.ts";
