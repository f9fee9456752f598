/** @module Node adapter: HTTP via @hono/node-server, process arguments, environment and signals. */

import { serve } from "@hono/node-server";
import { readFileSync } from "node:fs";
import type { Server } from "node:http";
import type { CliHost } from "../cli/run-cli.ts";
import { type FetchHandler, hostPort, type Listener } from "./listener.ts";

/**
 * Serves `fetch` with `@hono/node-server` on plain `node:http`, the fastest Node path here.
 *
 * @param fetch the handler
 * @param addr where to listen
 * @returns the listener, once bound
 * @throws {Error} when the address cannot be bound (e.g. EADDRINUSE)
 */
export function listenNode(fetch: FetchHandler, addr: { hostname: string; port: number }): Promise<Listener> {
  return new Promise((resolve, reject) => {
    const server = serve({ fetch, hostname: addr.hostname, port: addr.port }, (info) => {
      server.off("error", reject);
      resolve({
        url: `http://${hostPort(addr.hostname, info.port)}`,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done());
            (server as Server).closeIdleConnections?.();
          }),
      });
    }) as Server;
    server.once("error", reject);
  });
}

/** The CLI host for Node: real process, filesystem and signals. */
export function nodeHost(): CliHost {
  return {
    args: process.argv.slice(2),
    env: process.env,
    cwd: process.cwd(),
    readTextFile: (p) => readFileSync(p, "utf8"),
    listen: listenNode,
    now: () => performance.now(),
    print: (line) => process.stdout.write(`${line}\n`),
    printError: (line) => process.stderr.write(`${line}\n`),
    onShutdown: (handler) => {
      let fired = false;
      for (const sig of ["SIGINT", "SIGTERM"] as const) {
        process.on(sig, () => {
          if (fired) process.exit(130); // a second signal: the operator wants out now
          fired = true;
          handler();
        });
      }
    },
    runtime: `node ${process.version}`,
    progressStream: process.stderr.isTTY ? process.stderr : undefined,
  };
}
