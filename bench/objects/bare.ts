// bench/objects/bare.ts — the floor under rackfeed's serving path: a server that answers every
// GET with one of 16 in-memory 64 KiB bodies (picked by the path's last digits) and the same
// headers rackfeed sends, with nothing else in between. Used by profile.sh.
//
//   deno run -A bench/objects/bare.ts raw|hono|hono-async|stream PORT   (Deno.serve)
//   npx tsx bench/objects/bare.ts raw|hono|hono-async PORT   (raw: node:http, hono: @hono/node-server)
//
// raw = the runtime's own HTTP server; hono = a one-route Hono app on the same adapter rackfeed
// uses, returning `new Response(Uint8Array)` (what rackfeed's route returns for a one-block body);
// hono-async = the same route answering after two awaits, as rackfeed's does;
// stream (Deno only) = raw with the body in a one-chunk ReadableStream instead.
// Prints `bare-<mode> (<runtime>) listening on http://127.0.0.1:PORT` like rackfeed does.
import { Hono } from "hono";

declare const Deno: {
  serve(opts: { hostname: string; port: number; onListen?: (a: { port: number }) => void }, h: (r: Request) => Response | Promise<Response>): unknown;
  args: string[];
} | undefined;

const isDeno = typeof Deno !== "undefined";
const args = isDeno ? Deno!.args : process.argv.slice(2);
const mode = args[0] ?? "raw";
const port = Number(args[1] ?? 0);
const SIZE = 64 * 1024;
const bodies = Array.from({ length: 16 }, (_, i) => new Uint8Array(SIZE).fill(i));
const bodyOf = (path: string) => bodies[Number(/(\d+)\D*$/.exec(path)?.[1] ?? 0) % bodies.length];
const HEADERS = {
  "content-type": "application/octet-stream",
  "accept-ranges": "bytes",
  etag: '"35yca-mh34-hofevg9tsw"',
  "last-modified": new Date().toUTCString(),
  "content-length": String(SIZE),
};
const runtime = isDeno ? "deno" : `node ${process.version}`;
const announce = (p: number) => console.log(`bare-${mode} (${runtime}) listening on http://127.0.0.1:${p}`);

if (mode === "hono" || mode === "hono-async") {
  const app = new Hono();
  if (mode === "hono") {
    app.get("/v1/objects/*", (c) => new Response(bodyOf(c.req.path), { status: 200, headers: HEADERS }));
  } else {
    // Answers after two awaits of settled promises, as rackfeed's route does (stat from the
    // metadata cache, first chunk from the block cache): the response leaves from a microtask.
    app.get("/v1/objects/*", async (c) => {
      await Promise.resolve();
      await Promise.resolve();
      return new Response(bodyOf(c.req.path), { status: 200, headers: HEADERS });
    });
  }
  if (isDeno) {
    Deno!.serve({ hostname: "127.0.0.1", port, onListen: (a) => announce(a.port) }, app.fetch);
  } else {
    const { serve } = await import("@hono/node-server");
    serve({ fetch: app.fetch, hostname: "127.0.0.1", port }, (info) => announce(info.port));
  }
} else if (mode === "stream" && isDeno) {
  // Same as raw, but the bytes go in a one-chunk ReadableStream: Deno copies a BufferSource body
  // (Fetch spec), it does not copy stream chunks.
  Deno!.serve({ hostname: "127.0.0.1", port, onListen: (a) => announce(a.port) }, (req) => {
    const url = req.url;
    const body = bodyOf(url.slice(url.indexOf("/", 8)));
    const stream = new ReadableStream<Uint8Array>({
      start(c) {
        c.enqueue(body);
        c.close();
      },
    });
    return new Response(stream, { status: 200, headers: HEADERS });
  });
} else if (mode === "raw") {
  if (isDeno) {
    Deno!.serve({ hostname: "127.0.0.1", port, onListen: (a) => announce(a.port) }, (req) => {
      const url = req.url;
      return new Response(bodyOf(url.slice(url.indexOf("/", 8))), { status: 200, headers: HEADERS });
    });
  } else {
    const { createServer } = await import("node:http");
    const server = createServer((req, res) => {
      res.writeHead(200, HEADERS);
      res.end(bodyOf(req.url ?? "/"));
    });
    server.listen(port, "127.0.0.1", () => announce((server.address() as { port: number }).port));
  }
} else {
  console.error(`bare.ts: mode must be raw, hono or (Deno) stream, got ${mode}`);
  throw new Error("bad mode");
}
