/**
 * @module `mkdir -p` that fails where Node's `{ recursive: true }` hangs: on Node 20, a directory
 * that cannot be made although its parent exists (a path under /proc, where mkdir answers ENOENT)
 * makes `fs.mkdir` and `fs.mkdirSync` loop for ever, and a configured `--cache-dir` or `--shm-dir`
 * there hung the server at start-up (at full CPU, deaf to SIGTERM) instead of exiting 2.
 */

import * as fs from "node:fs";
import { mkdir, stat } from "node:fs/promises";
import { dirname } from "node:path";

/** The parents of `path` up to the root, nearest first. */
function parentsOf(path: string): string[] {
  const out: string[] = [];
  for (let p = dirname(path); ; p = dirname(p)) {
    out.push(p);
    if (dirname(p) === p) return out;
  }
}

/**
 * Makes directory `path` and its missing parents; nothing when it exists.
 *
 * @throws the error of the first directory that cannot be made (ENOENT, EACCES, ENOTDIR, ...)
 */
export async function makeDirs(path: string): Promise<void> {
  if ((await stat(path).catch(() => undefined))?.isDirectory()) return;
  const missing = [path];
  for (const p of parentsOf(path)) {
    if (await stat(p).catch(() => undefined)) break;
    missing.push(p);
  }
  for (const p of missing.reverse()) {
    await mkdir(p).catch((e) => {
      // Made meanwhile by someone else is fine; a file of that name is not (as with `recursive`).
      if ((e as { code?: string }).code !== "EEXIST") throw e;
      if (!fs.statSync(p).isDirectory()) throw Object.assign(new Error(`${p} is a file, not a directory`), { code: "ENOTDIR", cause: e });
    });
  }
}
