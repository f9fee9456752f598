// bench/datasets/parallel-copy-worker.mjs — a worker's entry: Node 20 loads a worker's entry
// before a --import loader applies to it, so this registers tsx and then loads the TypeScript worker.
import { register } from "tsx/esm/api";
register();
await import("./parallel-copy-worker.ts");
