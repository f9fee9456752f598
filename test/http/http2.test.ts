import { createHash } from "node:crypto";
import { Agent, get } from "node:http";
import * as http2 from "node:http2";
import { writeFileSync } from "node:fs";
import * as net from "node:net";
import { join } from "node:path";
import { Client } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectSameBytes, makeWorkspace, patternBytes, readMetric, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { selfSignedCert } from "../helpers/tls.ts";
import { type ChildServer, DENO, ROOT, runToExit, startChild } from "../helpers/spawn.ts";
import { syntheticDataset } from "../helpers/token-data.ts";

const SIZE = 3 * 2 ** 20 + 17;
const body = patternBytes(SIZE, 42);
let ws: Workspace;
let cert: string;
let key: string;

beforeAll(async () => {
  ws = await makeWorkspace();
  await ws.put("big.bin", body);
  ({ key, cert } = selfSignedCert(ws.dir, "h2"));
});
afterAll(async () => {
  await ws.remove();
});

/** A request (GET unless `method` says otherwise, with body `sent`) over an HTTP/2 session; resolves with status, headers and body. */
function h2request(session: http2.ClientHttp2Session, path: string, headers: Record<string, string> = {}, method = "GET", sent?: string) {
  return new Promise<{ status: number; headers: http2.IncomingHttpHeaders; body: Buffer }>((resolve, reject) => {
    const req = session.request({ ":path": path, ":method": method, ...headers });
    const chunks: Buffer[] = [];
    let head: http2.IncomingHttpHeaders = {};
    req.on("response", (h) => (head = h));
    req.on("data", (d) => chunks.push(d));
    req.on("end", () => resolve({ status: Number(head[":status"]), headers: head, body: Buffer.concat(chunks) }));
    req.on("error", reject);
    req.end(sent);
  });
}

/** The same request with a body (`method` POST, PUT) over an HTTP/2 session. */
function h2send(session: http2.ClientHttp2Session, method: string, path: string, sent: unknown, headers: Record<string, string> = {}) {
  return h2request(session, path, { "content-type": "application/json", ...headers }, method, JSON.stringify(sent));
}

/** 64 concurrent range GETs of big.bin on one HTTP/2 session of `url`: each byte-exact, and their bytes counted as http2. */
async function expect64RangeStreams(url: string): Promise<void> {
  const served = async () => readMetric(await (await fetch(`${url}/metrics`)).text(), "rackfeed_served_bytes_total", { transport: "http2" });
  const before = await served();
  const session = http2.connect(url);
  session.on("error", () => {}); // a failure surfaces in the streams' own promises
  try {
    const ranges = Array.from({ length: 64 }, (_, i) => {
      const start = (i * 48_611) % (SIZE - 70_000);
      return [start, start + 1 + ((i * 7919) % 65_000)] as const;
    });
    const got = await Promise.all(ranges.map(([s, e]) => h2request(session, "/v1/objects/data/big.bin", { range: `bytes=${s}-${e - 1}` })));
    let total = 0;
    got.forEach((g, i) => {
      const [s, e] = ranges[i];
      expect(g.status).toBe(206);
      expect(g.headers["content-range"]).toBe(`bytes ${s}-${e - 1}/${SIZE}`);
      expectSameBytes(g.body, body.subarray(s, e), `range ${i}`);
      total += e - s;
    });
    expect(await served()).toBe(before + total);
  } finally {
    // Not close(): after a failed check, streams still running would go on against the shared server.
    session.destroy();
  }
}

/**
 * Every kind of route over one HTTP/2 session of `url` (a server with admin token `admin`, whose
 * origin `data` holds big.bin and the token dataset tok/NAME): a registration (a PUT body), the
 * datasets list, a token batch (the same bytes as over HTTP/1.1), telemetry (a POST body) that
 * reaches /metrics, a prefetch job (a POST body) and its event stream, and errors.
 */
async function expectEveryRouteOverH2(url: string, admin: string, name: string): Promise<void> {
  const session = http2.connect(url);
  session.on("error", () => {}); // a failure surfaces in the requests' own promises
  try {
    await everyRoute(session, url, admin, name);
  } finally {
    session.destroy();
  }
}

/** The checks of `expectEveryRouteOverH2`, on an open session. */
async function everyRoute(session: http2.ClientHttp2Session, url: string, admin: string, name: string): Promise<void> {
  const auth = { authorization: `Bearer ${admin}` };
  const registration = { sources: [{ prefix: `data/tok/${name}` }], seq_length: 4096, seed: 1, split: "100,0,0", split_index: 0, num_samples: 64 };
  expect((await h2send(session, "PUT", `/v1/datasets/${name}`, registration)).status).toBe(401); // no token
  const put = await h2send(session, "PUT", `/v1/datasets/${name}`, registration, auth);
  expect(put.status, put.body.toString()).toBe(201);
  const list = JSON.parse((await h2request(session, "/v1/datasets")).body.toString());
  expect(list.datasets).toContain(name);
  const batchPath = `/v1/datasets/${name}/batches/3?rank=0&world=1&micro_batch=4`;
  const batch = await h2request(session, batchPath);
  expect(batch.status).toBe(200);
  expect(batch.body.length).toBe(4 * 4097 * 2);
  expectSameBytes(new Uint8Array(batch.body), new Uint8Array(await (await fetch(`${url}${batchPath}`)).arrayBuffer()));
  const waits = async () => readMetric((await h2request(session, "/metrics")).body.toString(), "rackfeed_t_wait_seconds_count", { dataset: name });
  const before = await waits();
  const report = { dataset: name, rank: 0, world: 1, micro_batch: 4, steps: [3, 4].map((step) => ({ step, t_wait: 0.001, t_h2d: 0.002, t_compute: 0.1 })) };
  expect((await h2send(session, "POST", "/v1/telemetry", report)).status).toBe(204);
  expect(await waits()).toBe(before + 2);
  const job = await h2send(session, "POST", "/prefetch", { objects: ["data/big.bin"] }, auth);
  expect(job.status, job.body.toString()).toBe(202);
  const events = await h2request(session, `/prefetch/${JSON.parse(job.body.toString()).id}/events`, auth);
  expect(events.headers["content-type"]).toMatch(/text\/event-stream/);
  expect(events.body.toString()).toMatch(/event: progress\ndata: \{.*"state":"done"/);
  expect((await h2request(session, "/v1/objects/data/%2e%2e/x")).status).toBe(400);
  const missing = await h2request(session, "/v1/datasets/no-such-dataset/batches/0?rank=0&world=1&micro_batch=4");
  expect(missing.status).toBe(404);
  expect(missing.body.toString()).toMatch(/no-such-dataset/);
  expect((await h2send(session, "POST", "/v1/telemetry", { dataset: name, steps: "none" })).status).toBe(400);
}

/**
 * A server of its own over dataset `name`: 3000 samples of 4097 tokens drawn from 400 synthetic
 * documents (seed `seed`), whose batches of 300 samples are 2.4 MB.
 */
async function startBatchServer(name: string, seed: number): Promise<RunningServer> {
  await putTokenDataset(name, seed);
  const reg = join(ws.dir, `${name}.json`);
  writeFileSync(reg, JSON.stringify({ sources: [{ prefix: `data/tok/${name}` }], seq_length: 4096, seed: 1, split: "100,0,0", split_index: 0, num_samples: 3000 }));
  return await startServer(ws, ["--dataset", `${name}=${reg}`, "--cache-dir", join(ws.dir, `c-${name}`)]);
}

/** Writes tok/NAME.idx and .bin to the origin: 400 synthetic documents of 500–6000 tokens (seed `seed`). */
async function putTokenDataset(name: string, seed: number): Promise<void> {
  const { idx, bin } = syntheticDataset(400, 500, 6000, seed);
  await ws.put(`tok/${name}.idx`, idx);
  await ws.put(`tok/${name}.bin`, bin);
}

async function curl(args: string[]): Promise<{ version: string; sha: string }> {
  const { code, out } = await runToExit("curl", ["-s", "--max-time", "20", "-o", join(ws.dir, "curl.out"), "-w", "%{http_version}", ...args]);
  expect(code, out).toBe(0);
  const { readFileSync } = await import("node:fs");
  return { version: out.trim(), sha: createHash("sha256").update(readFileSync(join(ws.dir, "curl.out"))).digest("hex") };
}
const sha = (b: Uint8Array) => createHash("sha256").update(b).digest("hex");

describe("HTTP/2 on Node", () => {
  let rf: RunningServer;
  beforeAll(async () => {
    rf = await startServer(ws, ["--block-bytes", "256KiB", "--cache-dir", join(ws.dir, "c-node")]);
  });
  afterAll(async () => {
    await rf.close();
  });

  it("stays up when a client resets its connection before sending a byte (a port scanner, a TCP health check)", async () => {
    const { port } = new URL(rf.url);
    for (let i = 0; i < 3; i++) {
      const s = net.connect(Number(port), "127.0.0.1");
      await new Promise((r) => s.once("connect", r));
      await new Promise((r) => setTimeout(r, 50)); // the server has accepted it and waits for its first byte
      s.resetAndDestroy();
    }
    await new Promise((r) => setTimeout(r, 100));
    expect((await fetch(`${rf.url}/healthz`)).status).toBe(200);
  });

  it("streams a prefetch job's Server-Sent Events over h2c (no HTTP/1.1 connection headers)", async () => {
    const admin = await startServer(ws, ["--block-bytes", "256KiB", "--cache-dir", join(ws.dir, "c-sse"), "--admin-token", "sse-admin"]);
    const session = http2.connect(admin.url);
    try {
      const auth = { authorization: "Bearer sse-admin" };
      const job = await (await fetch(`${admin.url}/prefetch`, { method: "POST", headers: auth, body: JSON.stringify({ objects: ["data/big.bin"] }) })).json();
      const res = await h2request(session, `/prefetch/${job.id}/events`, auth);
      expect(res.status).toBe(200);
      expect(res.headers["content-type"]).toMatch(/text\/event-stream/);
      expect(res.body.toString()).toMatch(/event: progress\ndata: \{.*"state":"done"/);
      expect((await fetch(`${admin.url}/healthz`)).status).toBe(200);
    } finally {
      session.destroy();
      await admin.close();
    }
  });

  it("serves h2c (prior knowledge) and HTTP/1.1 on the same port", async () => {
    const h2 = await curl(["--http2-prior-knowledge", `${rf.url}/v1/objects/data/big.bin`]);
    expect(h2).toEqual({ version: "2", sha: sha(body) });
    const h1 = await curl([`${rf.url}/v1/objects/data/big.bin`]);
    expect(h1).toEqual({ version: "1.1", sha: sha(body) });
  });

  it("serves 64 concurrent range streams on one connection, each byte-exact, counted as http2", async () => {
    await expect64RangeStreams(rf.url);
  });

  it("serves several multi-MiB batches at once to a client with a huge window (no ENHANCE_YOUR_CALM)", async () => {
    // A batch is one buffer, queued whole when the client's window allows: with Node's default
    // session memory (10 MB) the later streams were refused with ENHANCE_YOUR_CALM.
    const server = await startBatchServer("big", 4);
    const session = http2.connect(server.url, { settings: { initialWindowSize: 2 ** 31 - 1 } });
    session.once("connect", () => session.setLocalWindowSize(2 ** 30));
    try {
      const path = (step: number) => `/v1/datasets/big/batches/${step}?rank=0&world=1&micro_batch=300`;
      const want = await Promise.all(Array.from({ length: 8 }, async (_, i) => new Uint8Array(await (await fetch(`${server.url}${path(i)}`)).arrayBuffer())));
      const got = await Promise.all(Array.from({ length: 8 }, (_, i) => h2request(session, path(i))));
      for (const [i, g] of got.entries()) {
        expect(g.status).toBe(200);
        expect(g.body.length).toBe(300 * 4097 * 2);
        expectSameBytes(g.body, want[i], `step ${i}`);
      }
    } finally {
      session.close();
      await server.close();
    }
  });

  it("keeps taking new streams while unread batches fill a session past 128 MB (a client that reads when it pleases)", async () => {
    const server = await startBatchServer("calm", 6);
    const session = http2.connect(server.url); // the default 64 KiB window: the batches wait in the server
    try {
      // 60 batches of 2.4 MB asked for and not read: ~147 MB queued on one session. Node refused
      // new streams past 128 MB (ENHANCE_YOUR_CALM), then dropped the session and every batch.
      const unread = Array.from({ length: 60 }, (_, i) => {
        const req = session.request({ ":path": `/v1/datasets/calm/batches/${i % 10}?rank=0&world=1&micro_batch=300` });
        req.pause();
        const status = new Promise<number>((resolve, reject) => {
          req.once("response", (h) => resolve(Number(h[":status"])));
          req.once("error", reject);
        });
        return { req, status };
      });
      expect(await Promise.all(unread.map((u) => u.status))).toEqual(Array(60).fill(200));
      await waitFor(async () => (await server.metric("rackfeed_batch_inflight_bytes")) >= 60 * 300 * 4097 * 2, "60 batches assembled and queued");
      const health = await h2request(session, "/healthz");
      expect(health.status).toBe(200);
      // Every queued batch still arrives whole once read.
      const sizes = await Promise.all(unread.map(({ req }) => new Promise<number>((resolve, reject) => {
        let n = 0;
        req.on("data", (d: Buffer) => (n += d.length));
        req.once("end", () => resolve(n));
        req.once("error", reject);
        req.resume();
      })));
      expect(sizes).toEqual(Array(60).fill(300 * 4097 * 2));
    } finally {
      session.close();
      await server.close();
    }
  });

  it("takes every stream of a client that cancels hundreds of large reads mid-body: Node's session memory count keeps what a reset stream had queued, so the session is renewed (GOAWAY) before it refuses any", async () => {
    const big = patternBytes(20_000_000, 7);
    await ws.put("huge.bin", big);
    const server = await startServer(ws, ["--cache-dir", join(ws.dir, "c-cancels")]);
    const goaways: number[] = [];
    const refused: number[] = [];
    let renewed = false;
    // A client as undici is: a session that got GOAWAY takes no new stream; the next goes on a new one.
    const open = () => {
      const s = http2.connect(server.url);
      s.on("error", () => {});
      s.once("goaway", (code) => {
        goaways.push(code);
        renewed = true;
      });
      renewed = false;
      return s;
    };
    let session = open();
    /** One read of huge.bin cancelled at its first DATA frame: its status, and the stream's reset code. */
    const cancelledRead = (s: http2.ClientHttp2Session, i: number) =>
      new Promise<{ status: number; rst: number }>((resolve) => {
        const req = s.request({ ":path": "/v1/objects/data/huge.bin" });
        let got = 0;
        req.on("error", () => {});
        req.on("response", (h) => (got = Number(h[":status"])));
        req.once("data", () => req.close(http2.constants.NGHTTP2_CANCEL)); // a client that gave up on it
        req.on("close", () => {
          if (req.rstCode === http2.constants.NGHTTP2_ENHANCE_YOUR_CALM) refused.push(i);
          resolve({ status: got, rst: req.rstCode ?? 0 });
        });
      });
    try {
      for (let i = 0; i < 300; i++) {
        if (renewed || session.destroyed) {
          session.close();
          session = open();
        }
        let r = await cancelledRead(session, i);
        // Sent before the GOAWAY arrived: refused as unprocessed (REFUSED_STREAM), asked again on a new session.
        if (r.status === 0 && (renewed || r.rst === http2.constants.NGHTTP2_REFUSED_STREAM)) {
          session.close();
          session = open();
          r = await cancelledRead(session, i);
        }
        expect(r.status, `stream ${i} (reset ${r.rst})`).toBe(200);
      }
      expect(refused).toEqual([]);
      // Renewed, not dropped: every GOAWAY said NO_ERROR (Node's own says ENHANCE_YOUR_CALM or INTERNAL_ERROR).
      expect(goaways.length).toBeGreaterThan(0);
      expect(goaways.every((c) => c === http2.constants.NGHTTP2_NO_ERROR)).toBe(true);
      // Still serving whole bodies.
      const fresh = http2.connect(server.url);
      try {
        expectSameBytes((await h2request(fresh, "/v1/objects/data/huge.bin")).body, big, "huge.bin");
      } finally {
        fresh.close();
      }
    } finally {
      session.destroy();
      await server.close();
    }
  }, 60_000);

  it("releases the batch leases of sessions whose client sent GOAWAY and vanished while a batch was held back by flow control", async () => {
    const server = await startBatchServer("gone", 5);
    try {
      for (let round = 0; round < 3; round++) {
        // A 16 KiB window: most of the 2.4 MiB batch waits in the server for WINDOW_UPDATEs.
        const session = http2.connect(server.url, { settings: { initialWindowSize: 16384 } });
        await new Promise<void>((resolve, reject) => {
          const req = session.request({ ":path": `/v1/datasets/gone/batches/${round}?rank=0&world=1&micro_batch=300` });
          req.once("error", () => {});
          req.once("data", () => {
            session.destroy(); // GOAWAY, then the socket goes: the rest can never be written
            resolve();
          });
          req.once("end", () => reject(new Error("the whole body arrived: nothing was held back")));
        });
      }
      // The leases of those batches end once their sessions do. (The Node bug that kept some such
      // sessions open for good needs a busy client to show: .scratch soak repro, not this test.)
      await waitFor(async () => (await server.metric("rackfeed_batch_inflight_bytes")) === 0, "in-flight batch bytes back to 0", 10_000);
    } finally {
      await server.close();
    }
  });

  it("lets a client that closes its session gracefully (GOAWAY) finish a stream that takes seconds", async () => {
    const session = http2.connect(rf.url, { settings: { initialWindowSize: 65535 } });
    try {
      const req = session.request({ ":path": "/v1/objects/data/big.bin" });
      const chunks: Buffer[] = [];
      // A slow reader: ~2 s for the 3 MiB, the server waiting on its WINDOW_UPDATEs.
      req.on("data", (c: Buffer) => {
        chunks.push(c);
        req.pause();
        setTimeout(() => req.resume(), 10);
      });
      const ended = new Promise<void>((resolve, reject) => {
        req.on("end", () => resolve());
        req.on("error", reject);
        req.on("close", () => setTimeout(() => reject(new Error(`the stream closed after ${Buffer.concat(chunks).length} of ${SIZE} bytes`)), 50));
      });
      await new Promise((r) => req.once("response", r));
      const t0 = Date.now();
      session.close(); // GOAWAY: no new stream on this session; this one goes on to its end
      await ended;
      expect(Date.now() - t0).toBeGreaterThan(1000);
      expectSameBytes(new Uint8Array(Buffer.concat(chunks)), body);
    } finally {
      session.destroy();
    }
  });

  it("serves every route over h2c (metrics, datasets list, errors)", async () => {
    const session = http2.connect(rf.url);
    try {
      expect((await h2request(session, "/metrics")).body.toString()).toMatch(/rackfeed_cache_hits_total/);
      expect(JSON.parse((await h2request(session, "/v1/datasets")).body.toString())).toEqual({ datasets: [] });
      const bad = await h2request(session, "/v1/objects/data/%2e%2e/x");
      expect(bad.status).toBe(400);
    } finally {
      session.close();
    }
  });

  it("takes request bodies and serves batches, telemetry and event streams over h2c", async () => {
    await putTokenDataset("h2node", 7);
    const admin = await startServer(ws, ["--admin-token", "h2-admin", "--cache-dir", join(ws.dir, "c-routes")]);
    try {
      await expectEveryRouteOverH2(admin.url, "h2-admin", "h2node");
    } finally {
      await admin.close();
    }
  });

  it("serves HTTPS with ALPN h2 (undici allowH2) and http/1.1 (curl)", async () => {
    const tls = await startServer(ws, ["--tls-cert", cert, "--tls-key", key, "--cache-dir", join(ws.dir, "c-tls")]);
    const { readFileSync } = await import("node:fs");
    const client = new Client(tls.url, { allowH2: true, connect: { ca: readFileSync(cert, "utf8") } });
    try {
      expect(tls.url).toMatch(/^https:/);
      const res = await client.request({ path: "/v1/objects/data/big.bin", method: "GET", headers: { range: "bytes=10-1009" } });
      expect(res.statusCode).toBe(206);
      expectSameBytes(new Uint8Array(await res.body.arrayBuffer()), body.subarray(10, 1010));
      const metrics = await (await client.request({ path: "/metrics", method: "GET" })).body.text();
      expect(readMetric(metrics, "rackfeed_served_bytes_total", { transport: "http2" })).toBe(1000);
      const h1 = await curl(["--http1.1", "--cacert", cert, `${tls.url}/v1/objects/data/big.bin`]);
      expect(h1).toEqual({ version: "1.1", sha: sha(body) });
    } finally {
      await client.close();
      await tls.close();
    }
  });
});

describe("HTTP/1.1 shutdown on Node (cleartext port shared with h2c)", () => {
  it("closes idle keep-alive connections at shutdown instead of waiting for their keep-alive timeout", async () => {
    const rf = await startServer(ws, ["--cache-dir", join(ws.dir, "c-h1-close")]);
    const agent = new Agent({ keepAlive: true });
    try {
      await new Promise<void>((resolve, reject) => {
        get(`${rf.url}/healthz`, { agent }, (res) => res.resume().on("end", resolve)).on("error", reject);
      });
      expect(Object.values(agent.freeSockets).flat().length).toBe(1); // idle, kept alive
      // Node's keep-alive timeout is 5 s: a close() that waited for it would lose this race.
      const closed = await Promise.race([rf.close().then(() => "closed"), new Promise((r) => setTimeout(() => r("still waiting"), 4000))]);
      expect(closed).toBe("closed");
    } finally {
      agent.destroy();
    }
  });
});

describe("HTTP/2 shutdown on Node", () => {
  it("stops while a client still holds an idle HTTPS HTTP/2 session (the server closes it)", async () => {
    const tls = await startServer(ws, ["--tls-cert", cert, "--tls-key", key, "--cache-dir", join(ws.dir, "c-tls-close")]);
    const { readFileSync } = await import("node:fs");
    const client = new Client(tls.url, { allowH2: true, connect: { ca: readFileSync(cert, "utf8") } });
    try {
      const res = await client.request({ path: "/healthz", method: "GET" });
      expect(res.statusCode).toBe(200);
      await res.body.text();
      // The session stays open on the client's side; close() must not wait for it.
      await tls.close();
    } finally {
      await client.destroy();
    }
  });
});

describe("HTTP/2 on Deno", () => {
  let plain: ChildServer;
  let secure: ChildServer;
  beforeAll(async () => {
    const common = ["run", "-A", `${ROOT}src/main.ts`, "serve", "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`, "--shm-dir", "off"];
    await putTokenDataset("h2deno", 8);
    plain = await startChild(DENO, [...common, "--cache-dir", join(ws.dir, "c-deno"), "--admin-token", "h2-deno-admin"]);
    secure = await startChild(DENO, [...common, "--cache-dir", join(ws.dir, "c-deno-tls"), "--tls-cert", cert, "--tls-key", key]);
  }, 120_000);
  afterAll(async () => {
    await plain?.stop();
    await secure?.stop();
  });

  it("serves h2c and HTTP/1.1 on one port, each counted under its own transport", async () => {
    const served = async (transport: string) => readMetric(await (await fetch(`${plain.url}/metrics`)).text(), "rackfeed_served_bytes_total", { transport });
    const [h1, h2] = [await served("http1"), await served("http2")];
    expect(await curl(["--http2-prior-knowledge", `${plain.url}/v1/objects/data/big.bin`])).toEqual({ version: "2", sha: sha(body) });
    expect(await served("http2")).toBe(h2 + body.length);
    expect(await curl([`${plain.url}/v1/objects/data/big.bin`])).toEqual({ version: "1.1", sha: sha(body) });
    expect(await served("http1")).toBe(h1 + body.length);
    expect(await served("http2")).toBe(h2 + body.length);
  });

  it("stays up when a client resets an HTTP/2 stream whose body it never read", async () => {
    // Deno rejects info.completed for a stream body that was not delivered: a rejection nobody
    // handled ended the process (found in review). A one-block range is a one-chunk stream body.
    const session = http2.connect(plain.url, { settings: { initialWindowSize: 65_535 } });
    session.on("error", () => {});
    try {
      for (let i = 0; i < 3; i++) {
        const req = session.request({ ":path": "/v1/objects/data/big.bin", range: `bytes=${i * 200_000}-${i * 200_000 + 199_999}` });
        req.on("error", () => {});
        req.pause();
        await new Promise((r) => {
          req.once("response", r);
          req.once("close", r); // the server went away
        });
        req.close(http2.constants.NGHTTP2_CANCEL);
      }
      await new Promise((r) => setTimeout(r, 500));
      const res = await fetch(`${plain.url}/healthz`);
      expect(res.status).toBe(200);
      expect(plain.proc.exitCode).toBeNull();
    } finally {
      session.destroy();
    }
  });

  it("serves HTTPS with ALPN h2 and http/1.1", async () => {
    expect(secure.url).toMatch(/^https:/);
    expect(await curl(["--http2", "--cacert", cert, `${secure.url}/v1/objects/data/big.bin`])).toEqual({ version: "2", sha: sha(body) });
    expect(await curl(["--http1.1", "--cacert", cert, `${secure.url}/v1/objects/data/big.bin`])).toEqual({ version: "1.1", sha: sha(body) });
  });

  it("serves 64 concurrent range streams on one connection, each byte-exact, counted as http2", async () => {
    await expect64RangeStreams(plain.url);
  });

  it("takes request bodies and serves batches, telemetry and event streams over h2c", async () => {
    await expectEveryRouteOverH2(plain.url, "h2-deno-admin", "h2deno");
  });

  it("serves undici's HTTP/2 over TLS (allowH2), counted as http2", async () => {
    const { readFileSync } = await import("node:fs");
    const client = new Client(secure.url, { allowH2: true, connect: { ca: readFileSync(cert, "utf8") } });
    try {
      const served = async () => readMetric(await (await client.request({ path: "/metrics", method: "GET" })).body.text(), "rackfeed_served_bytes_total", { transport: "http2" });
      const before = await served();
      const res = await client.request({ path: "/v1/objects/data/big.bin", method: "GET", headers: { range: "bytes=5-70004" } });
      expect(res.statusCode).toBe(206);
      expectSameBytes(new Uint8Array(await res.body.arrayBuffer()), body.subarray(5, 70005));
      expect(await served()).toBe(before + 70000);
    } finally {
      await client.close();
    }
  });
});
