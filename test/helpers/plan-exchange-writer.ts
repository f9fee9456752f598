/**
 * A worker for test/batch/plan-exchange.test.ts: publishes plans into a `PlanExchange` as fast as
 * it can, each plan's numbers derived from its key and a round number, until told to stop.
 */
import { parentPort, workerData } from "node:worker_threads";
import { PlanExchange } from "../../src/batch/plan-exchange.ts";

/** The plan the writer publishes for key `first` in round `round`: every number checkable. */
export function writerPlan(first: number, round: number) {
  const nSeg = 4 * (1 + (first % 37));
  const nBlocks = 1 + (first % 5);
  return {
    segments: Array.from({ length: nSeg }, (_, i) => first * 1000 + round * 7 + i),
    segmentCount: nSeg / 4,
    blocks: Array.from({ length: nBlocks }, (_, i) => -(first * 1000 + round * 7 + i)),
  };
}

if (parentPort) {
  const { buffer, stop, keys } = workerData as { buffer: SharedArrayBuffer; stop: SharedArrayBuffer; keys: number };
  const ex = new PlanExchange(buffer);
  const flag = new Int32Array(stop);
  const key = new Float64Array([1, 0, 8, 4096]);
  let round = 0;
  parentPort.postMessage({ ready: true });
  while (Atomics.load(flag, 0) === 0) {
    round++;
    for (let k = 0; k < keys; k++) {
      key[1] = k * 8;
      ex.publish(key, writerPlan(k * 8, round));
    }
  }
  parentPort.postMessage({ published: ex.published });
}
