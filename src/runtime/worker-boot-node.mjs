// Node runs TypeScript through tsx (`node --import tsx`), which a worker thread does not inherit:
// register it here, then load the worker named in workerData. Deno loads the .ts worker directly.
import { workerData } from "node:worker_threads";
import { register } from "tsx/esm/api";

register();
await import(workerData.entry);
