// Deno.test suite: the shared-memory path with rings mapped on both ends (the server assembles
// into the mapped slot, the SDK reads the slot with no copy). Run by `npm test`.

import assert from "node:assert/strict";
import * as net from "node:net";
import { createClient, localTransport } from "../../../src/client/deno.ts";
import { loadConfig } from "../../../src/config/load.ts";
import { encodeIndex } from "../../../src/dataset/mod.ts";
import { denoBody, isAlive, listenDeno } from "../../../src/runtime/deno.ts";
import { mapFileDeno, peerCredentialsDeno } from "../../../src/runtime/libc-deno.ts";
import { withFd } from "../../../src/runtime/socket-fd.ts";
import { createServer, type ServerEnv } from "../../../src/server.ts";
import { PlanningThread } from "../../../src/runtime/planning-thread.ts";
import { loadDenoPieceCopier } from "../../../src/runtime/native-gather-deno.ts";
import { countingCopier } from "../../helpers/counting-copier.ts";

/** A Deno server with the shm path (rings mapped) over a small token dataset; `fn` gets its URL and shm directory. */
async function withDenoShmServer(env: Partial<ServerEnv>, fn: (url: string, dir: string) => Promise<void>): Promise<void> {
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-shm-" });
  await Deno.mkdir(`${dir}/origin`);
  const lengths = Array.from({ length: 400 }, (_, i) => 50 + ((i * 37) % 200));
  const tokens = lengths.reduce((a, b) => a + b, 0);
  await Deno.writeFile(`${dir}/origin/t.idx`, encodeIndex({ dtypeCode: 8, lengths }));
  await Deno.writeFile(`${dir}/origin/t.bin`, new Uint8Array(new Uint16Array(tokens).map((_, i) => (i * 7919) % 65000).buffer));
  await Deno.writeTextFile(`${dir}/t.json`, JSON.stringify({ sources: [{ prefix: "data/t" }], seq_length: 48, seed: 3, split: "100,0,0", split_index: 0, num_samples: 1500 }));
  const config = loadConfig({
    args: ["--listen", "127.0.0.1:0", "--origin", `data=${dir}/origin`, "--cache-dir", `${dir}/cache`, "--block-bytes", "16KiB", "--dataset", `t=${dir}/t.json`, "--shm-dir", `${dir}/shm`],
    env: {},
    readTextFile: (p) => Deno.readTextFileSync(p),
    cwd: dir,
  });
  const server = await createServer(config, {
    now: () => performance.now(),
    log: () => {},
    wrapBody: denoBody,
    pid: Deno.pid,
    isAlive,
    mapFile: (p, n) => mapFileDeno(p, n, true),
    ...env,
  });
  const listener = await listenDeno(server.fetch, config.listen);
  try {
    await server.startShm(Number(new URL(listener.url).port));
    await fn(listener.url, dir);
  } finally {
    await listener.close();
    await server.close();
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("serves batches over mapped rings with zero copies on the client, byte-identical to HTTP", async () => {
  await withDenoShmServer({}, async (url, dir) => {
    const c = createClient({ url }); // shm, mapped, when co-located
    assert.equal(await c.transport(), "shm");
    const want = new Uint8Array(await (await fetch(`${url}/v1/datasets/t/samples?start=0&count=1400`)).arrayBuffer());
    const per = (want.length / 1400) * 2; // micro-batch 2
    let n = 0;
    let ringBytes = 0;
    let lastView: Uint8Array | undefined;
    for await (const b of c.batches("t", { rank: 0, world: 1, microBatch: 2, endStep: 700, prefetch: 3 })) {
      assert.equal(b.transport, "shm");
      assert.equal(b.step, n++);
      // A view of its slot of the mapped ring, not a copy: its buffer is the whole slot (pages
      // of the ring file), and it reads zeros once the ring's pages are given back (below).
      const slotBytes = b.tokens.buffer.byteLength;
      assert.ok(slotBytes % 4096 === 0 && slotBytes >= b.tokens.byteLength, `a slot buffer of ${slotBytes} bytes`);
      const files = [...Deno.readDirSync(`${dir}/shm`)].filter((e) => e.name.endsWith(".ring"));
      assert.equal(files.length, 1);
      ringBytes = Deno.statSync(`${dir}/shm/${files[0].name}`).size;
      assert.ok(slotBytes < ringBytes);
      const got = new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength);
      lastView = got;
      assert.deepEqual(got, want.subarray(b.step * per, (b.step + 1) * per), `step ${b.step}`);
    }
    assert.equal(n, 700);
    // The iterator's end released the ring's pages: a view kept past it reads zeros, no crash.
    assert.ok(lastView !== undefined && lastView.every((t) => t === 0));
    assert.ok(ringBytes >= 4 * 4096);
    // The ring goes with the connection.
    for (let i = 0; i < 100 && [...Deno.readDirSync(`${dir}/shm`)].some((e) => e.name.endsWith(".ring")); i++) {
      await new Promise((r) => setTimeout(r, 20));
    }
    assert.deepEqual([...Deno.readDirSync(`${dir}/shm`)].map((e) => e.name).filter((x) => x.endsWith(".ring")), []);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    assert.match(metrics, /rackfeed_served_bytes_total\{transport="shm"\} [1-9]/);
    await c.close();
  });
});

Deno.test("copies small batches a group of steps at a time on a thread (Deno's nonblocking FFI) into the mapped ring, byte-identical to HTTP", async () => {
  const native = loadDenoPieceCopier();
  assert.ok(native, "native/build/librackfeed.so did not load (scripts/build-native.mjs builds it)");
  // Four threads whatever this machine has: groups of steps go to a thread.
  const copier = countingCopier(native);
  const calls = copier.calls;
  await withDenoShmServer({ copier }, async (url) => {
    const want = new Uint8Array(await (await fetch(`${url}/v1/datasets/t/samples?start=0&count=1496`)).arrayBuffer()); // every block in memory
    const per = (want.length / 1496) * 8; // micro-batch 8
    calls.onLoop = 0;
    const c = createClient({ url });
    let n = 0;
    for await (const b of c.batches("t", { rank: 0, world: 1, microBatch: 8, endStep: 187 })) {
      assert.equal(b.transport, "shm");
      assert.equal(b.step, n++);
      assert.deepEqual(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength), want.subarray(b.step * per, (b.step + 1) * per), `step ${b.step}`);
    }
    await c.close();
    assert.equal(n, 187);
    assert.ok(calls.onThreads > 0 && calls.onThreads + calls.onLoop < 187 / 4, `${calls.onThreads} calls on threads, ${calls.onLoop} on the event loop for 187 steps`);
  });
});

Deno.test("reads a local peer's Unix credentials (SO_PEERCRED) through FFI, on node:net's sockets", async () => {
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-peer-" });
  const path = `${dir}/p.sock`;
  const got = await new Promise<unknown>((resolve, reject) => {
    const server = net.createServer((s) => {
      resolve(withFd(s, peerCredentialsDeno));
      s.destroy();
      server.close();
    });
    server.on("error", reject);
    server.listen(path, () => net.connect(path).on("error", () => {}));
  });
  // The peer is this very process (client and server ends are both here).
  assert.deepEqual(got, { pid: Deno.pid, uid: Deno.uid(), gid: Deno.gid() });
  await Deno.remove(dir, { recursive: true });
});

Deno.test("createClient trusts a given CA and reads over HTTPS when the server is not co-located", async () => {
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-tls-" });
  await Deno.mkdir(`${dir}/origin`);
  const bytes = new Uint8Array(300_000).map((_, i) => (i * 31) % 251);
  await Deno.writeFile(`${dir}/origin/o.bin`, bytes);
  const openssl = await new Deno.Command("openssl", {
    args: ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", `${dir}/key.pem`, "-out", `${dir}/cert.pem`, "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
      // rustls refuses a certificate marked CA:TRUE as the server's own; a self-signed one must say CA:FALSE.
      "-addext", "basicConstraints=critical,CA:FALSE"],
    stdout: "null",
    stderr: "null",
  }).output();
  assert.equal(openssl.code, 0);
  const config = loadConfig({
    args: ["--listen", "127.0.0.1:0", "--origin", `data=${dir}/origin`, "--cache-dir", `${dir}/cache`, "--shm-dir", "off", "--tls-cert", `${dir}/cert.pem`, "--tls-key", `${dir}/key.pem`],
    env: {},
    readTextFile: (p) => Deno.readTextFileSync(p),
    cwd: dir,
  });
  const server = await createServer(config, { now: () => performance.now(), log: () => {}, wrapBody: denoBody });
  const listener = await listenDeno(server.fetch, config.listen, config.tls);
  const ca = Deno.readTextFileSync(`${dir}/cert.pem`);
  try {
    assert.match(listener.url, /^https:/);
    const c = createClient({ url: listener.url, ca });
    assert.equal(await c.transport(), "http"); // --shm-dir off
    assert.deepEqual(await c.readObject("data", "o.bin", { start: 1000, end: 201_000 }), bytes.subarray(1000, 201_000));
    // Without the CA, the same read fails: the certificate is not trusted by default.
    await assert.rejects(createClient({ url: listener.url, retries: 0 }).readObject("data", "o.bin"));
    await c.close();
  } finally {
    await listener.close();
    await server.close();
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("a caller may move a batch's buffer elsewhere mid-iteration: the loop goes on, byte-identical to HTTP, and the moved buffer holds only its slot", async () => {
  await withDenoShmServer({}, async (url) => {
    const c = createClient({ url });
    assert.equal(await c.transport(), "shm");
    const want = new Uint8Array(await (await fetch(`${url}/v1/datasets/t/samples?start=0&count=200`)).arrayBuffer());
    const per = (want.length / 200) * 2; // micro-batch 2
    const steps: number[] = [];
    const moved: ArrayBuffer[] = [];
    for await (const b of c.batches("t", { rank: 0, world: 1, microBatch: 2, endStep: 100 })) {
      steps.push(b.step);
      const bytes = new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength);
      assert.deepEqual(bytes, want.subarray(b.step * per, (b.step + 1) * per), `step ${b.step}`);
      // Handed to another owner (a worker's transfer list): it detached the ring's own view before.
      if (b.step % 7 === 3) moved.push(structuredClone(b.tokens.buffer as ArrayBuffer, { transfer: [b.tokens.buffer as ArrayBuffer] }));
    }
    assert.deepEqual(steps, Array.from({ length: 100 }, (_, i) => i));
    assert.ok(moved.length > 10);
    // A moved buffer is its slot, not the whole ring (a clone of it would copy, and show, every slot).
    for (const m of moved) assert.ok(m.byteLength < 64 * 1024, `a moved buffer of ${m.byteLength} bytes`);
    await c.close();
  });
});

Deno.test("a mapping whose buffer was moved elsewhere has its pages given back once its first buffer is collected, never unmapped under the moved one", async () => {
  const gc = (globalThis as { gc?: () => void }).gc;
  assert.equal(typeof gc, "function", "run with --v8-flags=--expose-gc (npm test does)");
  const dir = await Deno.makeTempDir({ prefix: "rackfeed-deno-transfer-" });
  try {
    const path = `${dir}/ring`;
    await Deno.writeFile(path, new Uint8Array(1 << 20).fill(7));
    let reader: ReturnType<ReturnType<typeof localTransport>["openRing"]> | undefined = localTransport().openRing(path, 1 << 20);
    assert.ok(reader.mapped, "the ring is mapped");
    // A trainer handing its batch to a worker: the ArrayBuffer over the mapping is transferred.
    const moved = structuredClone(reader.mapped.buffer, { transfer: [reader.mapped.buffer as ArrayBuffer] });
    assert.equal(new Uint8Array(moved)[12345], 7);
    reader = undefined;
    // The finalizer of the first buffer gives the pages back: the moved buffer then reads zeros
    // (an unmapped range would have been SIGSEGV; a finalizer that never ran, sevens for ever).
    for (let i = 0; i < 50 && new Uint8Array(moved)[12345] !== 0; i++) {
      gc!();
      await new Promise((r) => setTimeout(r, 10));
    }
    assert.equal(new Uint8Array(moved)[12345], 0);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("the Deno SDK sends a consumer's step timings on its shm socket: every step counted, no HTTP report while it reads", async () => {
  await withDenoShmServer({}, async (url) => {
    let posts = 0;
    const counting: typeof fetch = (input, init) => {
      if (String(input instanceof Request ? input.url : input).endsWith("/v1/telemetry")) posts++;
      return fetch(input, init);
    };
    const c = createClient({ url, fetch: counting, reportEvery: 16, reportIntervalMs: 0 });
    const steps = 600;
    let postsWhileReading = -1;
    for await (const b of c.batches("t", { rank: 0, world: 1, microBatch: 2, endStep: steps })) {
      assert.equal(b.transport, "shm");
      c.reportStep(b.step, { t_h2d: 0.0001, t_compute: 1 });
      if (b.step === steps - 1) postsWhileReading = posts;
    }
    await c.close();
    const count = async (name: string) => Number((await (await fetch(`${url}/metrics`)).text()).match(new RegExp(`^${name}\\{dataset="t"\\} (\\S+)`, "m"))?.[1] ?? 0);
    assert.equal(postsWhileReading, 0);
    assert.equal(await count("rackfeed_t_wait_seconds_count"), steps);
    assert.equal(await count("rackfeed_t_compute_seconds_count"), steps);
  });
});

Deno.test("plans coming steps on a planning thread (Deno), the batches byte-identical to the event loop's plans", async () => {
  let thread: PlanningThread | undefined;
  // auto: on with 4 CPUs or more.
  await withDenoShmServer({ cpus: 8, startPlanningThread: () => (thread = new PlanningThread("deno")) }, async (url) => {
    assert.ok(thread, "no planning thread started under auto with 8 CPUs");
    await thread.ready; // its start (type-checked under deno test) outlasts the 700 steps below
    // One run of samples, planned on the event loop: the reference.
    const want = new Uint8Array(await (await fetch(`${url}/v1/datasets/t/samples?start=0&count=1400`)).arrayBuffer());
    const per = (want.length / 1400) * 2;
    const c = createClient({ url });
    let n = 0;
    for await (const b of c.batches("t", { rank: 0, world: 1, microBatch: 2, endStep: 700 })) {
      assert.equal(b.transport, "shm");
      assert.equal(b.step, n++);
      assert.deepEqual(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength), want.subarray(b.step * per, (b.step + 1) * per), `step ${b.step}`);
      // A trainer computes between steps: a pause now and then lets the thread run on a loaded
      // 2-core box, where a client reading flat out once left it no plan in time (0 of 700).
      if (b.step % 25 === 0) await new Promise((r) => setTimeout(r, 2));
    }
    await c.close();
    assert.equal(n, 700);
    const metrics = await (await fetch(`${url}/metrics`)).text();
    const ahead = Number(/^rackfeed_plans_made_ahead_total (\S+)$/m.exec(metrics)?.[1]);
    // How many depends on how much CPU the thread gets beside the client and the server (98-661
    // of 700 on a 2-core box): that it makes plans that are used is what is asserted.
    assert.ok(ahead > 0, `${ahead} of 700 steps planned on the planning thread`);
  });
});

Deno.test("a Deno consumer that breaks early says stop: its ring is kept for the next consumer, whose batches are its own", async () => {
  await withDenoShmServer({}, async (url, dir) => {
    const c = createClient({ url });
    const want = new Uint8Array(await (await fetch(`${url}/v1/datasets/t/samples?start=0&count=1400`)).arrayBuffer());
    const per = (want.length / 1400) * 2; // micro-batch 2
    let kept: Uint8Array | undefined;
    for await (const b of c.batches("t", { rank: 0, world: 1, microBatch: 2, endStep: 700 })) {
      kept = new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength);
      if (b.step === 6) break; // the server has filled the slots after step 6
    }
    // The view kept past the loop reads zeros (the SDK gave the ring's pages back), never the next consumer's tokens.
    assert.ok(kept !== undefined && kept.every((t) => t === 0));
    const spares = () => [...Deno.readDirSync(`${dir}/shm`)].filter((e) => e.name.endsWith(".spare")).map((e) => e.name);
    for (let i = 0; i < 200 && spares().length === 0; i++) await new Promise((r) => setTimeout(r, 20));
    assert.equal(spares().length, 1, "the ring kept as a spare");
    const inode = Deno.statSync(`${dir}/shm/${spares()[0]}`).ino;
    let n = 0;
    for await (const b of c.batches("t", { rank: 0, world: 1, microBatch: 2, startStep: 300, endStep: 400 })) {
      if (n++ === 0) {
        const rings = [...Deno.readDirSync(`${dir}/shm`)].filter((e) => e.name.endsWith(".ring"));
        assert.equal(Deno.statSync(`${dir}/shm/${rings[0].name}`).ino, inode, "the spare ring reused");
      }
      assert.deepEqual(new Uint8Array(b.tokens.buffer, b.tokens.byteOffset, b.tokens.byteLength), want.subarray(b.step * per, (b.step + 1) * per), `step ${b.step}`);
    }
    assert.equal(n, 100);
    await c.close();
  });
});
