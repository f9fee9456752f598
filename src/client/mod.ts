/**
 * @module The rackfeed client SDK (web standards only). On Node, `client/node.ts` adds an
 * HTTP/2 `fetch`.
 */

export { RackfeedClient, type RackfeedClientOptions, RackfeedError, type StepBatch, type StepTimings, type TokenBatch } from "./client.ts";
