// bench/transport/deno-node-http2.mjs — Deno's node:http2 server (its Node compatibility layer)
// sending a fixed body: is it a better HTTP/2 server on Deno than Deno.serve? (It is not: see
// bench/RESULTS.md, transport "Session 18".)
//   deno run -A bench/transport/deno-node-http2.mjs PORT [BYTES=1048576]
// then h2load -c1 -m4 -D 5 [-f 1048576] http://127.0.0.1:PORT/  beside Deno.serve's h2c and HTTP/1.1
// (bench/transport/bare.sh).
import http2 from "node:http2";
import process from "node:process";

const [port, bytes = String(1 << 20)] = process.argv.slice(2);
const body = new Uint8Array(Number(bytes));
const server = http2.createServer({ settings: { initialWindowSize: 8 << 20 } }, (_req, res) => {
  res.writeHead(200, { "content-length": body.length });
  res.end(body);
});
server.listen(Number(port), "127.0.0.1", () => console.log(`listening on ${port}`));
