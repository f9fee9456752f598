/**
 * @module Worker threads on both runtimes: Node's `worker_threads` (TypeScript through tsx, which
 * a thread does not inherit) and Deno's web `Worker`. Deno also offers `node:worker_threads`, but
 * its port walks every message element by element on receipt: a typed array of n elements cost
 * the receiving thread ~30 n bytes of heap and ~0.2 µs × n there, so a dataset of ~130 M samples
 * exhausted its heap and aborted the process, where a web Worker shares a `SharedArrayBuffer` as
 * is and moves a transferred buffer without a look at its bytes.
 */

import { parentPort, Worker } from "node:worker_threads";

/** Node's entry for every worker: registers tsx in the thread, then imports `workerData.entry`. */
const NODE_BOOT = new URL("./worker-boot-node.mjs", import.meta.url);

/** A thread started by `startThread`, seen from the thread that started it. */
export interface Thread {
  /** Posts a message; `transfer` moves those buffers instead of copying them. */
  postMessage(message: unknown, transfer?: ArrayBuffer[]): void;
  /** Calls `f` with every message the thread posts. */
  onMessage(f: (message: unknown) => void): void;
  /** Calls `f` once if the thread fails (an uncaught error) or ends on its own. */
  onFailure(f: (error: Error) => void): void;
  /** Ends the thread. */
  terminate(): Promise<void>;
}

/**
 * Starts the worker module `url` on a thread of its own.
 *
 * @param runtime which runtime's worker API to use
 * @param url the worker module
 * @param keepAlive false: on Node the thread does not keep the process alive. A Deno web Worker
 *   always does (it has no unref): terminate it (the server's `close` does, and the entry files
 *   exit explicitly)
 * @returns the thread, seen from this one
 */
export function startThread(runtime: "node" | "deno", url: URL, keepAlive = true): Thread {
  if (runtime === "node") {
    const w = new Worker(NODE_BOOT, { workerData: { entry: url.href } });
    if (!keepAlive) w.unref();
    return {
      postMessage: (m, transfer) => w.postMessage(m, transfer),
      onMessage: (f) => void w.on("message", f),
      onFailure: (f) => {
        let told = false;
        const once = (e: Error) => {
          if (!told) f(e);
          told = true;
        };
        w.once("error", once);
        w.once("exit", (code) => once(new Error(`the thread exited (code ${code})`)));
      },
      terminate: async () => {
        await w.terminate();
      },
    };
  }
  const WebWorker = (globalThis as unknown as { Worker: new (url: URL, options: { type: "module" }) => WebWorkerLike }).Worker;
  const w = new WebWorker(url, { type: "module" });
  return {
    postMessage: (m, transfer) => w.postMessage(m, transfer ?? []),
    onMessage: (f) => w.addEventListener("message", (e) => f(e.data)),
    onFailure: (f) =>
      w.addEventListener("error", (e) => {
        e.preventDefault(); // handled here: not an uncaught error of this process
        f(new Error(e.message ?? "the thread failed"));
      }, { once: true }),
    terminate: () => {
      w.terminate();
      return Promise.resolve();
    },
  };
}

/** The parts of Deno's web `Worker` used here. */
interface WebWorkerLike {
  postMessage(message: unknown, transfer: ArrayBuffer[]): void;
  addEventListener(type: "message", f: (e: { data: unknown }) => void): void;
  addEventListener(type: "error", f: (e: { message?: string; preventDefault(): void }) => void, options: { once: true }): void;
  terminate(): void;
}

/** The thread that started this one, seen from a worker module (see `startThread`). */
export interface ParentPort {
  onMessage(f: (message: unknown) => void): void;
  postMessage(message: unknown, transfer?: ArrayBuffer[]): void;
}

/**
 * This worker's way to its parent: `parentPort` on Node, the worker's global scope on Deno.
 *
 * @throws {Error} when this is not a worker thread
 */
export function parentThread(): ParentPort {
  if (parentPort) {
    const port = parentPort;
    return { onMessage: (f) => void port.on("message", f), postMessage: (m, transfer) => port.postMessage(m, transfer) };
  }
  const scope = globalThis as unknown as {
    postMessage?: (m: unknown, transfer: ArrayBuffer[]) => void;
    addEventListener(type: "message", f: (e: { data: unknown }) => void): void;
  };
  if (typeof scope.postMessage !== "function") throw new Error("Not a worker thread: no parent to answer");
  return { onMessage: (f) => scope.addEventListener("message", (e) => f(e.data)), postMessage: (m, transfer) => scope.postMessage!(m, transfer ?? []) };
}
