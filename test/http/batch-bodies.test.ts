/**
 * Reused HTTP batch bodies (Node): a body goes back to the pool only once its response is out,
 * so a reused body never changes bytes that a slow reader has not received yet.
 */
import * as http2 from "node:http2";
import { get } from "node:http";
import { connect, createServer as netServer, type Server, type Socket } from "node:net";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { Readable } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { expectSameBytes, makeWorkspace, type RunningServer, startServer, waitFor, type Workspace } from "../helpers/rackfeed.ts";
import { datasetFlags, putSyntheticDataset } from "../helpers/token-data.ts";
import { pausedStream } from "../helpers/h2-streams.ts";

/** 2048 samples × 4097 uint16 tokens: ~16 MiB, more than loopback's socket buffers hold for a reader that stops. */
const BIG = 2048;
const BIG_BYTES = BIG * 4097 * 2;
const batchPath = (step: number, mb: number) => `/v1/datasets/pile/batches/${step}?rank=0&world=1&micro_batch=${mb}`;

let ws: Workspace;
let rf: RunningServer;
/** The same dataset with a new body per batch: the reference bytes. */
let plain: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await putSyntheticDataset(ws, "tok/pile", 400, 500, 6000, 7);
  const reg = await datasetFlags(ws, "pile", { sources: [{ prefix: "data/tok/pile" }], seq_length: 4096, seed: 3, split: "100,0,0", split_index: 0, num_samples: 16 * BIG });
  rf = await startServer(ws, [...reg, "--cache-dir", join(ws.dir, "c-pool"), "--batch-pool-bytes", "64MiB"]);
  plain = await startServer(ws, [...reg, "--cache-dir", join(ws.dir, "c-plain"), "--batch-pool-bytes", "0"]);
});
afterAll(async () => {
  await rf?.close();
  await plain?.close();
  await ws?.remove();
});

async function reference(step: number, mb: number): Promise<Uint8Array> {
  const res = await fetch(`${plain.url}${batchPath(step, mb)}`);
  expect(res.status).toBe(200);
  return new Uint8Array(await res.arrayBuffer());
}

const poolBytes = () => rf.metric("rackfeed_batch_body_pool_bytes");
/** Pool bytes once a request for a `BIG` batch has taken its body: one of that size leaves the pool, if it had one. */
const takeOne = (before: number) => (before >= BIG_BYTES ? before - BIG_BYTES : before);

/**
 * A TCP relay in front of the server whose upstream side can be held: while held it reads
 * nothing from the server, so the server's socket buffer fills and its writes stay pending.
 */
function holdingRelay(target: string): Promise<{ url: string; hold(on: boolean): void; close(): Promise<void> }> {
  const { hostname, port } = new URL(target);
  const ups = new Set<Socket>();
  let held = false;
  const server: Server = netServer((down) => {
    const up = connect({ host: hostname, port: Number(port) });
    ups.add(up);
    down.pipe(up);
    up.pipe(down);
    if (held) up.pause(); // after pipe(), which resumes its source
    const end = () => {
      up.destroy();
      down.destroy();
      ups.delete(up);
    };
    up.on("error", end).on("close", end);
    down.on("error", end).on("close", end);
  });
  return new Promise((resolve) => {
    server.listen(0, "127.0.0.1", () => {
      resolve({
        url: `http://127.0.0.1:${(server.address() as { port: number }).port}`,
        hold(on) {
          held = on;
          for (const up of ups) on ? up.pause() : up.resume();
        },
        close: () => new Promise((done) => {
          for (const up of ups) up.destroy();
          server.close(() => done());
        }),
      });
    });
  });
}

/** A GET over node:http (not fetch: through the relay, as a plain client); resolves with the whole body. */
function getBody(url: string): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    get(url, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (d: Buffer) => chunks.push(d));
      res.on("end", () => resolve(Buffer.concat(chunks)));
      res.on("error", reject);
    }).on("error", reject);
  });
}

/** Lets the server run for `ms` (its writes may complete meanwhile, if they can). */
const settle = (ms: number) => new Promise((r) => setTimeout(r, ms));

/**
 * Waits until `rf` has leased the body of the one `BIG` batch requested (however long a loaded
 * machine takes to get there), then lets it run 400 ms more: time to write what it can, and to
 * give the body back if it wrongly did so before the reader has every byte.
 */
async function leasedAndSettled(): Promise<void> {
  await waitFor(async () => (await rf.metric("rackfeed_batch_inflight_bytes")) === BIG_BYTES, "the server to lease the batch's body");
  await settle(400);
}

describe("reused HTTP batch bodies", () => {
  it("gives an HTTP/1.1 body back only after a stalled reader has taken every byte, and reuses it", async () => {
    const want = await reference(1, BIG);
    const before = await poolBytes();
    const reusedBefore = await rf.metric("rackfeed_batch_bodies_total", { source: "pool" });
    const relay = await holdingRelay(rf.url);
    try {
      relay.hold(true);
      const done = getBody(`${relay.url}${batchPath(1, BIG)}`);
      await leasedAndSettled();
      // The server has assembled the body but cannot write it all out: it is not in the pool.
      const held = takeOne(before);
      expect(await poolBytes()).toBe(held);
      relay.hold(false);
      expectSameBytes(await done, want, "batch through the held relay");
      await waitFor(async () => (await poolBytes()) === held + BIG_BYTES, "the body back in the pool");
      // The next batch of that size is assembled into it, with its own bytes.
      const again = new Uint8Array(await (await fetch(`${rf.url}${batchPath(2, BIG)}`)).arrayBuffer());
      expectSameBytes(again, await reference(2, BIG), "batch assembled into a reused body");
      expect(await rf.metric("rackfeed_batch_bodies_total", { source: "pool" })).toBeGreaterThan(reusedBefore);
    } finally {
      await relay.close();
    }
  });

  it("gives an HTTP/2 body back only after its stream's bytes are out, with the socket held and with the window closed", async () => {
    const want = await reference(3, BIG);
    const relay = await holdingRelay(rf.url);
    try {
      for (const mode of ["socket held", "window closed"] as const) {
        const before = await poolBytes();
        // A huge window: only the held socket stops the server. A 64 KiB window: flow control does.
        const window = mode === "socket held" ? 2 ** 31 - 1 : 65_535;
        const session = http2.connect(relay.url, { settings: { initialWindowSize: window } });
        session.on("error", () => {});
        if (mode === "socket held") {
          await new Promise((r) => session.once("connect", r));
          session.setLocalWindowSize(2 ** 30);
          relay.hold(true);
        }
        try {
          const req = session.request({ ":path": batchPath(3, BIG) });
          const chunks: Buffer[] = [];
          if (mode === "window closed") req.pause(); // no WINDOW_UPDATE until it reads
          const done = new Promise<void>((resolve, reject) => {
            req.on("data", (d: Buffer) => chunks.push(d));
            req.on("end", () => resolve());
            req.on("error", reject);
          });
          req.end();
          await leasedAndSettled();
          const held = takeOne(before);
          expect(await poolBytes(), mode).toBe(held);
          relay.hold(false);
          req.resume();
          await done;
          expectSameBytes(Buffer.concat(chunks), want, `HTTP/2 batch, ${mode}`);
          await waitFor(async () => (await poolBytes()) === held + BIG_BYTES, `the body back in the pool (${mode})`);
        } finally {
          session.close();
        }
      }
    } finally {
      await relay.close();
    }
  });

  it("keeps an abandoned response's body out of the pool while it is written; HTTP/2 drops it when the stream is reset", async () => {
    for (const proto of ["HTTP/1.1", "HTTP/2"] as const) {
      const before = await poolBytes();
      const relay = await holdingRelay(rf.url);
      let session: http2.ClientHttp2Session | undefined;
      try {
        let abandon: () => void;
        if (proto === "HTTP/2") {
          // A closed window keeps the body in the server's stream queue, where a reset finds it
          // (with a huge window the whole body can be in the session's socket write already, and
          // then it comes back once that write is done, reset or not).
          session = http2.connect(relay.url, { settings: { initialWindowSize: 65_535 } });
          session.on("error", () => {});
          const req = session.request({ ":path": batchPath(4, BIG) });
          req.on("error", () => {});
          req.pause();
          req.end();
          abandon = () => req.close(http2.constants.NGHTTP2_CANCEL);
        } else {
          relay.hold(true);
          const req = get(`${relay.url}${batchPath(4, BIG)}`);
          req.on("error", () => {});
          abandon = () => req.destroy();
        }
        await leasedAndSettled();
        const held = takeOne(before);
        expect(await poolBytes(), proto).toBe(held);
        // The client goes away while the server still has most of the body to write.
        abandon();
        if (proto === "HTTP/2") {
          await settle(300); // the reset reaches the server; the session lives on
          // A reset stream never finishes: its body is left to the garbage collector.
          expect(await poolBytes(), proto).toBe(held);
        } else {
          // Node ends an HTTP/1.1 response whose socket is gone; libuv has cancelled its writes by
          // then, so the body may come back: either way, later batches must be exact.
          await relay.close();
        }
      } finally {
        session?.destroy();
        await relay.close();
      }
      const got = new Uint8Array(await (await fetch(`${rf.url}${batchPath(5, BIG)}`)).arrayBuffer());
      expectSameBytes(got, await reference(5, BIG), `batch after an abandoned one (${proto})`);
      // Whatever became of the body, its bytes no longer count as in flight.
      await waitFor(async () => (await rf.metric("rackfeed_batch_inflight_bytes")) === 0, `no bytes in flight after the abandoned ${proto} batch`);
    }
  });

  it("holds a batch back while the bodies in flight are at --batch-inflight-bytes, and serves it once one is read", async () => {
    // Room for two ~16 MiB bodies, not three.
    const reg = await datasetFlags(ws, "pile", { sources: [{ prefix: "data/tok/pile" }], seq_length: 4096, seed: 3, split: "100,0,0", split_index: 0, num_samples: 16 * BIG });
    const bounded = await startServer(ws, [...reg, "--cache-dir", join(ws.dir, "c-bound"), "--max-batch-bytes", "17MiB", "--batch-inflight-bytes", "34MiB"]);
    const relay = await holdingRelay(bounded.url);
    try {
      relay.hold(true);
      const held = [6, 7].map((step) => getBody(`${relay.url}${batchPath(step, BIG)}`));
      await waitFor(async () => (await bounded.metric("rackfeed_batch_inflight_bytes")) === 2 * BIG_BYTES, "two bodies in flight");
      let third: Uint8Array | undefined;
      const thirdDone = fetch(`${bounded.url}${batchPath(8, BIG)}`).then(async (r) => (third = new Uint8Array(await r.arrayBuffer())));
      await waitFor(async () => (await bounded.metric("rackfeed_batch_waiting")) === 1, "the third batch waiting");
      await settle(300);
      expect(third).toBeUndefined();
      relay.hold(false);
      await thirdDone;
      expectSameBytes(third!, await reference(8, BIG), "the batch that waited");
      const [a, b] = await Promise.all(held);
      expectSameBytes(a, await reference(6, BIG), "held batch 6");
      expectSameBytes(b, await reference(7, BIG), "held batch 7");
      await waitFor(async () => (await bounded.metric("rackfeed_batch_inflight_bytes")) === 0, "nothing in flight at the end");
      expect(await bounded.metric("rackfeed_batch_refused_total")).toBe(0);
    } finally {
      await relay.close();
      await bounded.close();
    }
  });

  it("holds a batch back while HTTP/2 streams that do not read hold the bodies in flight (one session), and serves it once they read", async () => {
    const reg = await datasetFlags(ws, "pile", { sources: [{ prefix: "data/tok/pile" }], seq_length: 4096, seed: 3, split: "100,0,0", split_index: 0, num_samples: 16 * BIG });
    const bounded = await startServer(ws, [...reg, "--cache-dir", join(ws.dir, "c-bound-h2"), "--max-batch-bytes", "17MiB", "--batch-inflight-bytes", "34MiB"]);
    // The default 64 KiB stream window: flow control keeps each unread body in the server.
    const session = http2.connect(bounded.url, { settings: { initialWindowSize: 65_535 } });
    session.on("error", () => {}); // a failure surfaces in the streams' own promises
    try {
      const streams = [6, 7, 8].map((step) => pausedStream(session, batchPath(step, BIG)));
      await waitFor(async () => (await bounded.metric("rackfeed_batch_inflight_bytes")) === 2 * BIG_BYTES, "two bodies in flight");
      await waitFor(async () => (await bounded.metric("rackfeed_batch_waiting")) === 1, "the third batch waiting");
      await settle(300);
      expect(await bounded.metric("rackfeed_batch_inflight_bytes")).toBe(2 * BIG_BYTES);
      for (const s of streams) s.req.resume();
      const bodies = await Promise.all(streams.map((s) => s.body));
      for (const [i, step] of [6, 7, 8].entries()) expectSameBytes(bodies[i], await reference(step, BIG), `batch ${step} over h2`);
      await waitFor(async () => (await bounded.metric("rackfeed_batch_inflight_bytes")) === 0, "nothing in flight at the end");
      expect(await bounded.metric("rackfeed_batch_refused_total")).toBe(0);
    } finally {
      session.destroy();
      await bounded.close();
    }
  });

  it("neither assembles nor keeps counting a batch whose client left while it waited: HTTP/1.1, HTTP/2 reset or session gone, pipelined", async () => {
    // Found in review: a response already over when its lease was registered never ended it, and
    // two such batches wedged a server bounded at two batches (every later one: 503 after 30 s).
    const reg = await datasetFlags(ws, "pile", { sources: [{ prefix: "data/tok/pile" }], seq_length: 4096, seed: 3, split: "100,0,0", split_index: 0, num_samples: 16 * BIG });
    const bounded = await startServer(ws, [...reg, "--cache-dir", join(ws.dir, "c-leave"), "--max-batch-bytes", "17MiB", "--batch-inflight-bytes", "34MiB"]);
    const port = Number(new URL(bounded.url).port);
    const gauge = async () => ({ inflight: await bounded.metric("rackfeed_batch_inflight_bytes"), waiting: await bounded.metric("rackfeed_batch_waiting") });
    /** A reader that asks and never reads: its ~16 MiB body stays in flight. */
    const stalled = (requests: string) => {
      const s = connect({ host: "127.0.0.1", port });
      s.on("error", () => {});
      s.write(requests);
      s.pause();
      return s;
    };
    const get1 = (step: number) => `GET ${batchPath(step, BIG)} HTTP/1.1\r\nHost: x\r\n\r\n`;
    const h2Waiting = () => {
      const session = http2.connect(bounded.url);
      session.on("error", () => {});
      const req = session.request({ ":path": batchPath(3, BIG) });
      req.on("error", () => {});
      req.end();
      return { session, req };
    };
    /** Name, how many batches it leaves waiting, and how it starts (returning how its client leaves). */
    const scenarios: [string, number, () => () => void][] = [
      ["HTTP/1.1 client gone", 1, () => {
        const s = stalled(get1(3));
        return () => s.destroy();
      }],
      ["HTTP/2 stream reset", 1, () => {
        const { session, req } = h2Waiting();
        return () => {
          req.close(http2.constants.NGHTTP2_CANCEL);
          setTimeout(() => session.destroy(), 200);
        };
      }],
      ["HTTP/2 session gone", 1, () => {
        const { session } = h2Waiting();
        return () => session.destroy();
      }],
      // Node runs the handlers of pipelined requests at once: both wait.
      ["HTTP/1.1 pipelined, socket gone", 2, () => {
        const s = stalled(get1(3) + get1(4));
        return () => s.destroy();
      }],
    ];
    try {
      for (const [name, waiting, start] of scenarios) {
        const held = [stalled(get1(1)), stalled(get1(2))];
        try {
          await waitFor(async () => (await gauge()).inflight === 2 * BIG_BYTES, `${name}: two bodies in flight`);
          const leave = start();
          await waitFor(async () => (await gauge()).waiting === waiting, `${name}: ${waiting} batch(es) waiting`);
          leave();
          await settle(200);
        } finally {
          for (const s of held) s.destroy(); // also on failure: a held reader would hold close() open
        }
        await waitFor(async () => {
          const g = await gauge();
          return g.inflight === 0 && g.waiting === 0;
        }, `${name}: nothing in flight or waiting once every client is gone`, 5000);
      }
      // None of the five batches whose client had left was assembled.
      expect(await bounded.metric("rackfeed_batch_abandoned_total")).toBe(5);
      // And the server still serves a full-size batch at once.
      const got = new Uint8Array(await (await fetch(`${bounded.url}${batchPath(9, BIG)}`)).arrayBuffer());
      expectSameBytes(got, await reference(9, BIG), "a batch after the departures");
    } finally {
      await bounded.close();
    }
  });

  it("ends the lease of a batch whose assembly failed: its bytes no longer count as in flight", async () => {
    await putSyntheticDataset(ws, "tok/gone", 50, 500, 6000, 11);
    const reg = await datasetFlags(ws, "gone", { sources: [{ prefix: "data/tok/gone" }], seq_length: 4096, seed: 3, split: "100,0,0", split_index: 0, num_samples: 64 });
    const server = await startServer(ws, [...reg, "--cache-dir", join(ws.dir, "c-gone"), "--batch-inflight-bytes", "256MiB"]);
    try {
      await rm(join(ws.origin, "tok/gone.bin")); // registered, then gone: every block fill fails
      const res = await fetch(`${server.url}/v1/datasets/gone/batches/0?rank=0&world=1&micro_batch=8`);
      expect(res.status).toBeGreaterThanOrEqual(400);
      await res.arrayBuffer();
      expect(await server.metric("rackfeed_batch_bodies_total", { source: "new" })).toBe(1);
      await waitFor(async () => (await server.metric("rackfeed_batch_inflight_bytes")) === 0, "the failed batch's lease ended");
    } finally {
      await server.close();
    }
  });

  it("serves 96 concurrent batches of three sizes over HTTP/1.1 and HTTP/2, slow and fast readers, each byte-exact", async () => {
    const sizes = [8, 64, 300];
    const jobs = Array.from({ length: 96 }, (_, i) => ({ step: (i * 7) % 13, mb: sizes[i % 3], h2: i % 2 === 0, slow: i % 5 === 0 }));
    const want = new Map<string, Uint8Array>();
    for (const j of jobs) {
      const k = `${j.step}/${j.mb}`;
      if (!want.has(k)) want.set(k, await reference(j.step, j.mb));
    }
    const reusedBefore = await rf.metric("rackfeed_batch_bodies_total", { source: "pool" });
    const session = http2.connect(rf.url);
    try {
      const got = await Promise.all(jobs.map((j) => new Promise<Buffer>((resolve, reject) => {
        const chunks: Buffer[] = [];
        const onStream = (s: Readable) => {
          s.on("data", (d: Buffer) => {
            chunks.push(d);
            if (j.slow) {
              // A slow reader: stop for a moment after each chunk while the others go on.
              s.pause();
              setTimeout(() => s.resume(), 2);
            }
          });
          s.on("end", () => resolve(Buffer.concat(chunks)));
          s.on("error", reject);
        };
        if (j.h2) {
          const req = session.request({ ":path": batchPath(j.step, j.mb) });
          onStream(req);
          req.end();
        } else {
          get(`${rf.url}${batchPath(j.step, j.mb)}`, onStream).on("error", reject);
        }
      })));
      for (const [i, j] of jobs.entries()) expectSameBytes(got[i], want.get(`${j.step}/${j.mb}`)!, `job ${i} (${j.h2 ? "h2" : "h1"}, step ${j.step} × ${j.mb}${j.slow ? ", slow" : ""})`);
    } finally {
      session.close();
    }
    expect(await rf.metric("rackfeed_batch_bodies_total", { source: "pool" })).toBeGreaterThan(reusedBefore + 20);
  });
});
