// bench/objects/cpuprof.mjs — records a V8 CPU profile of a running Deno or Node process through
// its inspector (started with --inspect=127.0.0.1:PORT), then prints where the time went.
// Works the same on both runtimes, which is why it does not use `--cpu-prof`.
//
//   node --experimental-websocket bench/objects/cpuprof.mjs record PORT SECONDS OUT.cpuprofile
//   node bench/objects/cpuprof.mjs summary OUT.cpuprofile [TOP=25]
import { readFileSync, writeFileSync } from "node:fs";

const [cmd, ...rest] = process.argv.slice(2);

async function record(port, seconds, out) {
  const list = await (await fetch(`http://127.0.0.1:${port}/json/list`)).json();
  const url = list[0]?.webSocketDebuggerUrl;
  if (!url) throw new Error(`no inspector target on port ${port}`);
  const ws = new WebSocket(url);
  await new Promise((ok, fail) => {
    ws.onopen = ok;
    ws.onerror = fail;
  });
  let id = 0;
  const waiting = new Map();
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    if (m.id && waiting.has(m.id)) {
      waiting.get(m.id)(m);
      waiting.delete(m.id);
    }
  };
  const send = (method, params = {}) =>
    new Promise((ok) => {
      const n = ++id;
      waiting.set(n, ok);
      ws.send(JSON.stringify({ id: n, method, params }));
    });
  await send("Profiler.enable");
  await send("Profiler.setSamplingInterval", { interval: 200 }); // µs
  await send("Profiler.start");
  await new Promise((r) => setTimeout(r, seconds * 1000));
  const res = await send("Profiler.stop");
  if (!res.result?.profile) throw new Error(`Profiler.stop failed: ${JSON.stringify(res.error ?? res)}`);
  writeFileSync(out, JSON.stringify(res.result.profile));
  ws.close();
}

// Groups a call frame into a coarse bucket: where in rackfeed or which dependency.
function bucket(cf) {
  const u = cf.url || "";
  if (!u) return cf.functionName.startsWith("(") ? cf.functionName : "(native/runtime)";
  const nm = /node_modules\/(@[^/]+\/[^/]+|[^/]+)/.exec(u);
  if (nm) return `dep:${nm[1]}`;
  const src = /\/src\/(.+)$/.exec(u);
  if (src) return `src/${src[1]}`;
  if (u.startsWith("node:") || u.startsWith("ext:")) return u.replace(/^(ext:[^/]+\/[^/]+|node:[^/]+).*$/, "$1");
  return u.replace(/^.*\//, "");
}

function summary(file, top = 25) {
  const p = JSON.parse(readFileSync(file, "utf8"));
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const self = new Map();
  for (const s of p.samples) self.set(s, (self.get(s) ?? 0) + 1);
  const total = p.samples.length;
  const idle = [...self].filter(([id]) => byId.get(id).callFrame.functionName === "(idle)").reduce((a, [, c]) => a + c, 0);
  const fn = new Map();
  const bk = new Map();
  for (const [id, c] of self) {
    const cf = byId.get(id).callFrame;
    if (cf.functionName === "(idle)") continue;
    const name = `${cf.functionName || "(anonymous)"}  ${cf.url ? cf.url.replace(/^.*\/(node_modules|src)\//, "$1/") + ":" + (cf.lineNumber + 1) : ""}`;
    fn.set(name, (fn.get(name) ?? 0) + c);
    const b = bucket(cf);
    bk.set(b, (bk.get(b) ?? 0) + c);
  }
  // Inclusive ("total") time: samples with the function anywhere on the stack, counted once.
  const parent = new Map();
  for (const n of p.nodes) for (const c of n.children ?? []) parent.set(c, n.id);
  const incl = new Map();
  let underSrc = 0;
  for (const [id, c] of self) {
    if (byId.get(id).callFrame.functionName === "(idle)") continue;
    const seen = new Set();
    for (let at = id; at !== undefined; at = parent.get(at)) {
      const cf = byId.get(at).callFrame;
      if (!cf.url) continue;
      const name = `${cf.functionName || "(anonymous)"}  ${cf.url.replace(/^.*\/(node_modules|src)\//, "$1/")}:${cf.lineNumber + 1}`;
      seen.add(name);
    }
    if ([...seen].some((n) => n.includes(" src/"))) underSrc += c;
    for (const n of seen) incl.set(n, (incl.get(n) ?? 0) + c);
  }
  const busy = total - idle;
  const pct = (c) => `${((100 * c) / busy).toFixed(1).padStart(5)}%`;
  console.log(`${file}: ${total} samples, ${((100 * idle) / total).toFixed(1)}% idle; shares below are of the busy samples (JS thread only)`);
  console.log("-- self time by bucket --");
  for (const [k, c] of [...bk].sort((a, b) => b[1] - a[1]).slice(0, 15)) console.log(`${pct(c)}  ${k}`);
  console.log(`-- inclusive: ${((100 * underSrc) / busy).toFixed(1)}% of busy samples have a rackfeed src/ frame on the stack; top functions --`);
  for (const [k, c] of [...incl].sort((a, b) => b[1] - a[1]).slice(0, 12)) console.log(`${pct(c)}  ${k}`);
  console.log("-- self time by function --");
  for (const [k, c] of [...fn].sort((a, b) => b[1] - a[1]).slice(0, top)) console.log(`${pct(c)}  ${k}`);
}

if (cmd === "record") await record(+rest[0], +rest[1], rest[2]);
else if (cmd === "summary") summary(rest[0], +(rest[1] ?? 25));
else {
  console.error("usage: cpuprof.mjs record PORT SECONDS OUT | summary FILE [TOP]");
  process.exit(2);
}
