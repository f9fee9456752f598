import * as net from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, type Workspace } from "../helpers/rackfeed.ts";
import { type ChildServer, DENO, ROOT, startChild } from "../helpers/spawn.ts";

let ws: Workspace;
let deno: ChildServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await ws.put("a.bin", "hello");
  // 256 file descriptors: a few hundred idle connections exhaust them, as ~20 000 do at the usual limit.
  deno = await startChild("bash", [
    "-c", 'ulimit -n 256 && exec "$0" "$@"', DENO, "run", "-A", `${ROOT}src/main.ts`, "serve",
    "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`, "--cache-dir", ws.cache, "--shm-dir", "off",
  ]);
}, 120_000);
afterAll(async () => {
  await deno?.stop();
  await ws.remove();
});

function connect(port: number): Promise<net.Socket | undefined> {
  return new Promise((resolve) => {
    const s = net.connect(port, "127.0.0.1", () => resolve(s));
    s.on("error", () => resolve(undefined));
  });
}

describe("the Deno server when idle connections take every file descriptor", () => {
  it("keeps running and serves again once they are gone (an accept error ended the process)", async () => {
    const port = Number(new URL(deno.url).port);
    const idle: net.Socket[] = [];
    for (let i = 0; i < 400; i++) {
      const s = await connect(port);
      if (s) idle.push(s);
    }
    await new Promise((r) => setTimeout(r, 500));
    for (const s of idle) s.destroy();
    // The listener is made again within about a second.
    let status = 0;
    for (let i = 0; i < 50 && status !== 200; i++) {
      await new Promise((r) => setTimeout(r, 200));
      status = await fetch(`${deno.url}/v1/objects/data/a.bin`).then((r) => r.status, () => 0);
    }
    expect(status).toBe(200);
    expect(deno.output()).toMatch(/the HTTP listener stopped \(.*\); listening again/);
  }, 60_000);
});
