// bench/soak/deno-idle-connections.ts: silent connections to a Deno listener, with rackfeed's
// idle sweep (src/runtime/tcp-listener-deno.ts) and without it (a bare Deno.serve, which closes
// none). Prints how many the server closed within a bounded wait, and how long one sweep takes
// with all of them open (the event loop's pause every idleMs / 4).
//
// Run: ulimit -n 20000; deno run -A bench/soak/deno-idle-connections.ts [CONNECTIONS=3000]
// The clients are in the same process, so its descriptors hold both ends of each connection.

import * as net from "node:net";
import { listenDeno } from "../../src/runtime/deno.ts";
import { IdleConnectionSweeper } from "../../src/runtime/tcp-listener-deno.ts";

const N = Number(Deno.args[0] ?? 3000);
const IDLE_MS = 2000;
const WAIT_MS = 3 * IDLE_MS;

/** Opens N silent connections to `port`; resolves with a counter of those the server closed. */
async function silentConnections(port: number): Promise<{ closed: () => number; destroy: () => void }> {
  let closed = 0;
  const sockets: net.Socket[] = [];
  for (let i = 0; i < N; i++) {
    const s = net.connect(port, "127.0.0.1");
    s.on("error", () => {});
    s.on("close", () => closed++);
    sockets.push(s);
    if (i % 500 === 499) await new Promise((r) => setTimeout(r, 50)); // within the accept backlog
  }
  return { closed: () => closed, destroy: () => sockets.forEach((s) => s.destroy()) };
}

async function waitForCloses(c: { closed: () => number }): Promise<number> {
  const t0 = performance.now();
  while (c.closed() < N && performance.now() - t0 < WAIT_MS) await new Promise((r) => setTimeout(r, 100));
  return Math.round(performance.now() - t0);
}

console.log(`deno-idle-connections: ${N} silent connections, idle time ${IDLE_MS} ms, waiting up to ${WAIT_MS} ms, ${new Date().toISOString().slice(0, 16)} UTC`);

// Baseline: Deno.serve as it comes.
{
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen: () => {} }, () => new Response("ok"));
  const c = await silentConnections(server.addr.port);
  const ms = await waitForCloses(c);
  console.log(`bare Deno.serve: closed ${c.closed()} of ${N} in ${ms} ms`);
  c.destroy();
  await server.shutdown();
}

// rackfeed's listener.
{
  const listener = await listenDeno(() => new Response("ok"), { hostname: "127.0.0.1", port: 0 }, undefined, { idleMs: IDLE_MS });
  const port = Number(new URL(listener.url).port);
  const c = await silentConnections(port);
  // A sweep of its own over all of them, none idle for it: the process's descriptors listed, the
  // part every sweep pays.
  const probe = new IdleConnectionSweeper("127.0.0.1", port, 1e9);
  const t = performance.now();
  probe.sweep();
  const first = performance.now() - t;
  const ms = await waitForCloses(c);
  console.log(`rackfeed listenDeno: closed ${c.closed()} of ${N} in ${ms} ms; one sweep over them all (nothing to close) ${first.toFixed(1)} ms`);
  c.destroy();
  await listener.close();
}
