/** @module Deno adapter: HTTP via Deno.serve, arguments, environment and signals. */

import nodeProcess from "node:process";
import type { CliHost } from "../cli/run-cli.ts";
import { type FetchHandler, hostPort, type Listener } from "./listener.ts";

/**
 * Serves `fetch` with `Deno.serve`.
 *
 * @param fetch the handler
 * @param addr where to listen
 * @param tls PEM certificate and key, for HTTPS
 * @returns the listener, once bound
 * @throws {Deno.errors.AddrInUse} when the address is taken
 */
export function listenDeno(
  fetch: FetchHandler,
  addr: { hostname: string; port: number },
  tls?: { cert: string; key: string },
): Promise<Listener> {
  return new Promise((resolve, reject) => {
    try {
      // Deno.serve speaks HTTP/1.1 and h2c (prior knowledge) on one port, and with a
      // certificate negotiates h2 or http/1.1 by ALPN.
      const server = Deno.serve({
        hostname: addr.hostname,
        port: addr.port,
        ...(tls ?? {}),
        onListen: ({ port }) => {
          resolve({ url: `${tls ? "https" : "http"}://${hostPort(addr.hostname, port)}`, close: () => server.shutdown() });
        },
      }, (req) => fetch(req));
    } catch (e) {
      reject(e);
    }
  });
}

/** The CLI host for Deno. */
export function denoHost(): CliHost {
  return {
    args: [...Deno.args],
    env: Deno.env.toObject(),
    cwd: Deno.cwd(),
    readTextFile: (p) => Deno.readTextFileSync(p),
    listen: listenDeno,
    now: () => performance.now(),
    print: (line) => console.log(line),
    printError: (line) => console.error(line),
    onShutdown: (handler) => {
      let fired = false;
      for (const sig of ["SIGINT", "SIGTERM"] as const) {
        Deno.addSignalListener(sig, () => {
          if (fired) Deno.exit(130);
          fired = true;
          handler();
        });
      }
    },
    runtime: `deno ${Deno.version.deno}`,
    progressStream: Deno.stderr.isTerminal() ? nodeProcess.stderr : undefined,
    wrapBody: oneChunkStream,
  };
}

/**
 * A body of one chunk: Deno copies a `Uint8Array` response body (it could be mutated after the
 * call) but hands stream chunks to the socket as they are, so cached block views go out uncopied.
 */
export function oneChunkStream(bytes: Uint8Array): ReadableStream<Uint8Array> {
  // A default (not "bytes") stream: a byte stream would transfer, i.e. detach, the cached buffer.
  return new ReadableStream({
    start(controller) {
      controller.enqueue(bytes);
      controller.close();
    },
  });
}
