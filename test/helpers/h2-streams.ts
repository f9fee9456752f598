/**
 * @module HTTP/2 streams for the tests that stall a reader on purpose, on Node and on Deno
 * (`node:http2`, which both runtimes have).
 */

import { Buffer } from "node:buffer";
import type { ClientHttp2Session, ClientHttp2Stream } from "node:http2";

/**
 * Requests `path` on `session` and reads nothing until `req.resume()`: the stream's window
 * closes and the server keeps the rest of the body. `body` resolves with every byte once read;
 * an error before it is awaited is not an unhandled rejection.
 */
export function pausedStream(session: ClientHttp2Session, path: string): { req: ClientHttp2Stream; body: Promise<Uint8Array> } {
  const req = session.request({ ":path": path });
  req.pause();
  const chunks: Uint8Array[] = [];
  const body = new Promise<Uint8Array>((resolve, reject) => {
    req.on("data", (c: Uint8Array) => chunks.push(c));
    req.on("end", () => resolve(new Uint8Array(Buffer.concat(chunks))));
    req.on("error", reject);
  });
  body.catch(() => {});
  req.end();
  return { req, body };
}
