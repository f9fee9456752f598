/**
 * @module The planning thread (see `planning-thread.ts`): it holds datasets whose index arrays it
 * shares with the event loop, and makes the plans the event loop asks for through a
 * `PlanExchange`, until it is terminated.
 */

import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { computePlan } from "../batch/block-plans.ts";
import { PlanExchange } from "../batch/plan-exchange.ts";
import { type TokenDataset, tokenDatasetFromParts, type TokenDatasetParts } from "../dataset/mod.ts";
import { parentThread } from "./threads.ts";

/** What the event loop posts: the exchange once, then datasets to hold and to forget. */
export type PlanWorkerMessage =
  | { readonly exchange: SharedArrayBuffer }
  | { readonly regId: number; readonly name: string; readonly parts: TokenDatasetParts }
  | { readonly forget: number };

const port = parentThread();
const datasets = new Map<number, { readonly ds: TokenDataset; readonly name: string }>();

/**
 * A full collection: a forgotten dataset's shared arrays are freed only once this thread has
 * collected its last references to them, and a thread that allocates as little as this one
 * seldom runs a full collection on its own (12 replaced versions of a 2.4 M-sample dataset kept
 * ~300 MiB alive without it).
 */
setFlagsFromString("--expose-gc");
const gc: unknown = runInNewContext("gc");
const collect = typeof gc === "function" ? (gc as () => void) : () => {};

port.onMessage((message) => {
  const m = message as PlanWorkerMessage;
  if ("exchange" in m) {
    void serve(new PlanExchange(m.exchange));
    port.postMessage("ready");
  } else if ("parts" in m) datasets.set(m.regId, { ds: tokenDatasetFromParts(m.parts), name: m.name });
  else if (datasets.delete(m.forget)) collect();
});

/** Lets the thread's event loop handle the messages posted so far (a dataset sent with its first requests). */
const handleMessages = () => new Promise<void>((resolve) => setTimeout(resolve, 0));

async function serve(exchange: PlanExchange): Promise<void> {
  const key = new Float64Array(4);
  for (;;) {
    while (exchange.nextRequest(key)) {
      let d = datasets.get(key[0]);
      if (d === undefined) {
        await handleMessages();
        d = datasets.get(key[0]);
        if (d === undefined) continue; // forgotten, or never sent: the event loop plans it
      }
      try {
        exchange.publish(key, computePlan(d.ds, d.name, key[1], key[2], key[3]));
      } catch {
        // A run the dataset does not have: the event loop plans it, and raises the error there.
      }
    }
    await exchange.waitForRequests();
  }
}
