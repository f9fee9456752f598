/**
 * The soak's h2c traffic alone, against rackfeed or a bare node:http2 server, to see who keeps
 * sockets of sessions the client destroyed.
 *   node --import tsx bench/soak/h2-vanishing-clients.ts TARGET SECONDS [CANCEL% KILL%]
 * TARGET: node | deno | plain (http2.createServer listening itself) | sniff (the same bare server
 * behind a copy of src/runtime/node.ts's first-bytes h1/h2 switch).
 */
import { execSync, spawn } from "node:child_process";
import * as fs from "node:fs";
import * as http2 from "node:http2";
import * as os from "node:os";
import * as path from "node:path";
import { syntheticDataset } from "../../test/helpers/token-data.ts";

const [target, secS = "30", cancelS = "20", killS = "2", batchS = "50", spinS = "0"] = process.argv.slice(2);
const SPIN = Number(spinS);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const WORK = fs.mkdtempSync(path.join(os.tmpdir(), "rfh2l-"));
fs.mkdirSync(path.join(WORK, "origin/obj"), { recursive: true });
const SIZE = 12 * 2 ** 20;
fs.writeFileSync(path.join(WORK, "origin/obj/b.bin"), Buffer.alloc(SIZE, 7));
fs.mkdirSync(path.join(WORK, "origin/ds"), { recursive: true });
const { idx, bin } = syntheticDataset(20000, 100, 4000, 7);
fs.writeFileSync(path.join(WORK, "origin/ds/tok.idx"), idx);
fs.writeFileSync(path.join(WORK, "origin/ds/tok.bin"), bin);
fs.writeFileSync(path.join(WORK, "tok.json"), JSON.stringify({ sources: [{ prefix: "data/ds/tok" }], seq_length: 2047, seed: 1234, split: "100,0,0", split_index: 0, num_samples: 16000 }));
const args = ["serve", ...(process.env.EXTRA_ARGS ? process.env.EXTRA_ARGS.split(" ") : []), "--dataset", `tok=${WORK}/tok.json`, "--listen", "127.0.0.1:0", "--origin", `data=${WORK}/origin`, "--cache-dir", `${WORK}/cache`, "--memory-bytes", "64MiB", "--disk-bytes", "96MiB", "--block-bytes", "1MiB", "--shm-dir", "off", "--shutdown-grace", "5s"];
const bare = (sniff: boolean, fix = false) => `
const http2 = require("node:http2"), net = require("node:net"), { Readable } = require("node:stream");
const handler = (req, res) => {
  const mb = /micro_batch=(\\d+)/.exec(req.url);
  if (mb) { const body = Buffer.alloc(+mb[1] * 4096, 7); res.writeHead(200, { "content-length": String(body.length) }); res.end(body); return; } // like a batch: one write of the whole body
  const m = /bytes=(\\d+)-(\\d+)/.exec(req.headers.range || ""); const a = m ? +m[1] : 0, b = m ? +m[2] : ${SIZE} - 1;
  let left = b - a + 1;
  const r = new Readable({ read() { setImmediate(() => { const n = Math.min(left, 262144); left -= n; this.push(n ? Buffer.alloc(n, 7) : null); }); } });
  res.writeHead(m ? 206 : 200, { "content-length": String(b - a + 1) }); r.pipe(res);
  res.on("close", () => r.destroy());
};
const opts = { settings: { initialWindowSize: 8 * 2 ** 20, maxFrameSize: 2 ** 20 - 1 }, maxSessionMemory: 128 };
let server;
if (${sniff}) {
  const h2 = http2.createServer(opts, handler);
  const PREFACE = Buffer.from("PRI * HTTP/2.0\\r\\n\\r\\nSM\\r\\n\\r\\n");
  server = net.createServer((socket) => {
    const early = () => socket.destroy();
    socket.on("error", early);
    socket.once("data", (first) => { socket.off("error", early); socket.pause(); socket.unshift(first); h2.emit("connection", socket); });
  });
} else server = http2.createServer(opts, handler);
if (${fix}) server.on("session", (s) => s.on("goaway", () => setTimeout(() => { if (!s.destroyed) { console.log("fix: destroying a session still open 1 s after the peer's GOAWAY"); s.destroy(); } }, 1000).unref()));
server.listen(0, "127.0.0.1", () => console.log("listening on http://127.0.0.1:" + server.address().port));
process.on("SIGTERM", () => { const t = setTimeout(() => { console.log("close() did not finish in 5 s"); process.exit(1); }, 5000); server.close(() => { clearTimeout(t); process.exit(0); }); });`;
// plainfix: the bare server plus a possible mitigation (destroy a session 1 s after the peer's GOAWAY if still open)
const srv = target === "node" ? spawn(process.execPath, ["--import", "tsx", "src/main.node.ts", ...args], { stdio: ["ignore", "pipe", "pipe"] })
  : target === "deno" ? spawn("node_modules/.bin/deno", ["run", "-A", "src/main.ts", ...args], { stdio: ["ignore", "pipe", "pipe"] })
  : spawn(process.execPath, ["-e", bare(target === "sniff", target === "plainfix")], { stdio: ["ignore", "pipe", "pipe"] });
let out = "";
const url = await new Promise<string>((res) => { const on = (d: Buffer) => { out += d; const m = /listening on (\S+)/.exec(out); if (m) res(m[1]); }; srv.stdout!.on("data", on); srv.stderr!.on("data", on); });
const exited = new Promise<number | null>((r) => srv.on("exit", (c) => r(c)));
const fds = () => fs.readdirSync(`/proc/${srv.pid}/fd`).length;
await sleep(300);
const fd0 = fds();

let seed = 7;
const rnd = () => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) / 2 ** 32);
let session: http2.ClientHttp2Session | undefined;
let kills = 0, cancels = 0, done = 0;
const getSession = () => {
  if (!session || session.destroyed || session.closed) { session = http2.connect(url); session.on("error", () => {}); }
  return session;
};
const deadline = performance.now() + Number(secS) * 1000;
async function lane() {
  while (performance.now() < deadline) {
    const cancel = rnd() * 100 < Number(cancelS) ? Math.floor(rnd() * 100_000) + 1 : undefined;
    const kill = cancel === undefined && rnd() * 100 < Number(killS) ? Math.floor(rnd() * 50_000) + 1 : undefined;
    const a = Math.floor(rnd() * SIZE), b = Math.min(SIZE - 1, a + Math.floor(rnd() * 4 * 2 ** 20));
    await new Promise<void>((resolve) => {
      const s = getSession();
      const batch = rnd() * 100 < Number(batchS);
      const mb = [4, 8, 16][Math.floor(rnd() * 3)];
      const st = batch
        ? s.request({ ":path": `/v1/datasets/tok/batches/${Math.floor(rnd() * 900)}?rank=0&world=1&micro_batch=${mb}` })
        : s.request({ ":path": "/v1/objects/data/obj/b.bin", range: `bytes=${a}-${b}` });
      let got = 0;
      const t = setTimeout(() => { st.close(http2.constants.NGHTTP2_CANCEL); resolve(); }, 30_000);
      const fin = () => { clearTimeout(t); resolve(); };
      st.on("data", (c: Buffer) => {
        got += c.length;
        if (SPIN) { const t = performance.now() + rnd() * SPIN; while (performance.now() < t); } // a busy client (the soak checks bytes)
        if (cancel !== undefined && got >= cancel && !st.destroyed) { cancels++; st.close(http2.constants.NGHTTP2_CANCEL); fin(); }
        if (kill !== undefined && got >= kill && !s.destroyed) { kills++; s.destroy(); fin(); }
      });
      st.on("end", () => { done++; fin(); });
      st.on("error", fin);
      st.on("close", fin);
      st.end();
    });
    if (rnd() < 0.5) await sleep(Math.floor(rnd() * 40));
  }
}
await Promise.all([lane(), lane(), lane()]);
session?.close();
await sleep(100);
session?.destroy();
await sleep(7000); // past the 5 s a session may go without progress after a GOAWAY (GOAWAY_STALL_MS in src/runtime/node.ts)
const fd1 = fds();
if (process.env.HANDLES) { const n0 = out.length; srv.kill("SIGUSR2"); await sleep(300); console.log(out.slice(n0).split("\n").filter((l) => /h2session/.test(l)).slice(0, 4).map((l) => l.slice(0, 200)).join("\n")); }
const ss = execSync(`ss -tn state all '( sport = :${new URL(url).port} )' | tail -n +2 | grep -v -E 'TIME-WAIT|FIN-WAIT' || true`).toString().trim();
console.log(`${target}: ${secS} s of 3 h2c lanes (${batchS}% batches): ${done} responses read, ${cancels} streams cancelled, ${kills} sessions destroyed by the client; server fds ${fd0} -> ${fd1}; server TCP sockets still established/close-wait: ${ss ? ss.split("\n").length : 0}`);
if (target === "node" || target === "deno") {
  const m = await (await fetch(`${url}/metrics`)).text();
  console.log(`  ${m.split("\n").filter((l) => /^rackfeed_batch_(inflight_bytes|waiting|abandoned_total|refused_total) /.test(l)).join("; ")}`);
  // one more batch over plain HTTP/1.1, after the load
  const t1 = performance.now();
  const r = await fetch(`${url}/v1/datasets/tok/batches/5?rank=0&world=1&micro_batch=16`);
  await r.arrayBuffer();
  console.log(`  a fresh HTTP/1.1 batch now: status ${r.status} after ${((performance.now() - t1) / 1000).toFixed(1)} s${r.status === 503 ? " " + JSON.stringify(r.headers.get("retry-after")) : ""}`);
}
const t0 = performance.now();
srv.kill("SIGTERM");
const k = setTimeout(() => srv.kill("SIGKILL"), 20000);
const code = await exited;
clearTimeout(k);
console.log(`  SIGTERM -> exit ${code} after ${((performance.now() - t0) / 1000).toFixed(2)} s${/still in flight|did not finish/.test(out) ? " (" + out.trim().split("\n").pop() + ")" : ""}`);
fs.rmSync(WORK, { recursive: true, force: true });
