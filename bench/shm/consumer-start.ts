/**
 * @module A trainer that starts many short shm consumers (validation loops, epochs, ranks): N
 * consumers of STEPS token batches each, one after the other, with the SDK. Prints one JSON line:
 * consumers, steps each, milliseconds in all. Used by bench/shm/consumer-start.sh.
 *
 * Run: deno run -A bench/shm/consumer-start.ts URL DATASET CONSUMERS STEPS
 *  or: node --import tsx bench/shm/consumer-start.ts ...
 */

import { RackfeedClient } from "../../src/client/mod.ts";
import type { LocalTransport } from "../../src/client/shm-consumer.ts";

const isDeno = "Deno" in globalThis;
const args = isDeno ? (globalThis as unknown as { Deno: { args: string[] } }).Deno.args : process.argv.slice(2);
const [url, dataset, consumersText, stepsText] = args;
const consumers = Number(consumersText);
const steps = Number(stepsText);
// A computed specifier: the Deno transport uses FFI types that Node's type check does not know.
const mod = isDeno ? "../../src/client/deno.ts" : "../../src/client/node.ts";
const { localTransport } = (await import(mod)) as { localTransport: () => LocalTransport };
const c = new RackfeedClient({ url, local: localTransport(), reportEvery: 1_000_000 });
if ((await c.transport()) !== "shm") throw new Error(`${url} is not reachable over shm from here`);
const t0 = performance.now();
let batches = 0;
for (let i = 0; i < consumers; i++) {
  // Each at another place of the dataset, as a validation loop or a resumed rank.
  const startStep = (i * 37) % 10_000;
  for await (const _ of c.batches(dataset, { rank: 0, world: 1, microBatch: 8, startStep, endStep: startStep + steps })) batches++;
}
const ms = performance.now() - t0;
if (batches !== consumers * steps) throw new Error(`read ${batches} batches, expected ${consumers * steps}`);
console.log(JSON.stringify({ consumers, steps, ms }));
await c.close();
