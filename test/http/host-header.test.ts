import { connect } from "node:net";
import * as http2 from "node:http2";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";

let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  rf = await startServer(ws, []);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

/** GET /healthz over HTTP/1.1 with this Host header (none: no header); status and body. */
function withHost(host: string | undefined): Promise<{ status: number; body: string }> {
  return raw(`GET /healthz HTTP/1.1\r\n${host === undefined ? "" : `Host: ${host}\r\n`}Connection: close\r\n\r\n`);
}

/** Sends `request` as it is on a new connection; the status and body of the answer. */
function raw(request: string): Promise<{ status: number; body: string }> {
  const { port } = new URL(rf.url);
  return new Promise((resolve, reject) => {
    const sock = connect({ host: "127.0.0.1", port: Number(port) });
    const chunks: Buffer[] = [];
    sock.setTimeout(5000, () => sock.destroy(new Error("no answer")));
    sock.on("data", (d) => chunks.push(d));
    sock.on("error", reject);
    sock.on("close", () => {
      const text = Buffer.concat(chunks).toString("utf8");
      resolve({ status: Number(/^HTTP\/1\.[01] (\d{3})/.exec(text)?.[1] ?? 0), body: text.slice(text.indexOf("\r\n\r\n") + 4) });
    });
    sock.write(request);
  });
}

describe("Host headers on Node", () => {
  it("serves a valid Host a URL writes differently (upper case, zero-padded IPv4, an IDN), as Deno does", async () => {
    const { port } = new URL(rf.url);
    for (const host of [`LOCALHOST:${port}`, `127.000.000.001:${port}`, "bücher.de", `LocalHost:${port}`]) {
      const r = await withHost(host);
      expect(r.status, `${host}: ${r.body}`).toBe(200);
    }
  });

  it("serves an HTTP/2 :authority a URL writes differently", async () => {
    const session = http2.connect(rf.url);
    try {
      const status = await new Promise<number>((resolve, reject) => {
        const req = session.request({ ":path": "/healthz", ":authority": "LocalHost:1234" });
        req.on("response", (h) => resolve(Number(h[":status"])));
        req.on("error", reject);
        req.resume();
        req.end();
      });
      expect(status).toBe(200);
    } finally {
      session.close();
    }
  });

  it("answers a Host that is no host with a 400 that says so, never an empty one", async () => {
    for (const host of ["a b", "[::1", "exa%mple", "h/v1/objects", "[1]", "[:]", "[1.2.3.4]", "999.1.1.1"]) {
      const r = await withHost(host);
      expect(r.status, host).toBe(400);
      const body = JSON.parse(r.body) as { error: string; message: string };
      expect(body.error, host).toBe("BAD_REQUEST");
      expect(body.message, host).toMatch(/Host/);
    }
  });
});

describe("Requests Node's HTTP/1.1 parser refuses", () => {
  it("answers them with a status and a JSON body that says why, not node:http's empty 400", async () => {
    for (const [request, status, why] of [
      ["get /healthz HTTP/1.1\r\nHost: a\r\n\r\n", 400, /Invalid method/],
      ["FETCH /healthz HTTP/1.1\r\nHost: a\r\n\r\n", 400, /Invalid method/],
      ["GET /\x01 HTTP/1.1\r\nHost: a\r\n\r\n", 400, /Invalid char in url/],
      ["GET /healthz HTTP/9.9\r\nHost: a\r\n\r\n", 400, /Invalid HTTP version/],
      [`GET /healthz HTTP/1.1\r\nHost: a\r\nX-Big: ${"a".repeat(20_000)}\r\n\r\n`, 431, /Header overflow/],
    ] as const) {
      const r = await raw(request);
      expect(r.status, request.slice(0, 30)).toBe(status);
      const body = JSON.parse(r.body) as { error: string; message: string };
      expect(body.error).toBe(status === 431 ? "HEADERS_TOO_LARGE" : "BAD_REQUEST");
      expect(body.message).toMatch(why);
    }
    expect((await withHost("a")).status).toBe(200); // the server goes on
  });
});
