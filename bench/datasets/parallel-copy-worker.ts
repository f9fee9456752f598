/**
 * @module One gather thread of bench/datasets/parallel-copy.ts: maps the `.bin` and the ring file
 * itself (a mapping is an ordinary buffer to V8; a SharedArrayBuffer would be copied with
 * relaxed atomics at ~0.4× of memmove), then claims the next step the dispatcher has posted,
 * copies its pieces into its slot and counts it done.
 */
import { workerData } from "node:worker_threads";
import { loadNodeMapping } from "../../src/runtime/libc-node.ts";

const { binPath, binBytes, ringPath, plan, stepAt, control, bodyBytes, slots, itemSize, microBatch, total } = workerData;
const map = loadNodeMapping();
if (!map) throw new Error("parallel copy: cannot map files here (koffi)");
const bin = map(binPath, binBytes, false);
const ring = map(ringPath, slots * bodyBytes, true);
const src = bin.bytes;
const dst = ring.bytes;
const raw = new Float64Array(plan);
const at0 = new Float64Array(stepAt);
// control: [0] steps posted by the dispatcher, [1] steps claimed, [2] steps done, [3] bad steps
const c = new Int32Array(control);
const steps = at0.length;
for (;;) {
  const i = Atomics.add(c, 1, 1);
  if (i >= total) break;
  // Wait until the dispatcher has posted step i (it posts at most `slots` ahead of the done count).
  for (let posted = Atomics.load(c, 0); posted <= i; posted = Atomics.load(c, 0)) Atomics.wait(c, 0, posted);
  let k = at0[i % steps];
  const start = (i % slots) * bodyBytes;
  let at = start;
  for (let j = 0; j < microBatch; j++) {
    const n = raw[k++];
    for (let p = 0; p < n; p++) {
      const from = raw[k++], len = raw[k++] * itemSize;
      dst.set(src.subarray(from, from + len), at);
      at += len;
    }
  }
  if (at !== start + bodyBytes) Atomics.add(c, 3, 1);
  Atomics.add(c, 2, 1);
  Atomics.notify(c, 2);
}
bin.unmap();
ring.unmap();
