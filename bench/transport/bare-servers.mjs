// bench/transport/bare-servers.mjs — the bare runtime's own servers, for the HTTP/2 vs HTTP/1.1
// ratio rackfeed cannot beat: one body of BYTES per request over HTTP/1.1 and over h2c (prior
// knowledge), nothing else. Node: node:http and node:http2 (8 MiB stream window, 1 MiB frames and
// 128 MB of session memory, as rackfeed's Node server sets them; with the default 10 MB, h2load
// saw 8 MiB streams refused); Deno: Deno.serve, which speaks both on one port.
// Run: node bench/transport/bare-servers.mjs BYTES   or   deno run -A bench/transport/bare-servers.mjs BYTES
// Prints "h1 PORT" and "h2c PORT" once listening; exits after 120 s.
const bytes = Number(globalThis.Deno ? Deno.args[0] : process.argv[2]);
const body = new Uint8Array(bytes).fill(7);
setTimeout(() => (globalThis.Deno ? Deno.exit(0) : process.exit(0)), 120_000);
if (globalThis.Deno) {
  Deno.serve({ port: 0, hostname: "127.0.0.1", onListen: ({ port }) => console.log(`h1 ${port}\nh2c ${port}`) }, () => new Response(body));
} else {
  const http = await import("node:http");
  const http2 = await import("node:http2");
  const headers = { "content-length": String(bytes) };
  const h1 = http.createServer((_req, res) => res.writeHead(200, headers).end(body)).listen(0, "127.0.0.1", () => console.log(`h1 ${h1.address().port}`));
  const h2 = http2.createServer({ settings: { initialWindowSize: 8 << 20, maxFrameSize: 1 << 20 }, maxSessionMemory: 128 }, (_req, res) => res.writeHead(200, headers).end(body))
    .listen(0, "127.0.0.1", () => console.log(`h2c ${h2.address().port}`));
}
