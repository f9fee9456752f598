// bench/objects/report.mjs — turns the JSON lines written by run.sh (one per wrk run) into a
// Markdown table plus a list of flagged runs. Exit status 1 when any run had errors.
// Usage: node bench/objects/report.mjs <results.jsonl> [bad-warmup-fetches]
import { readFileSync } from "node:fs";

const [file, badFetches = "0"] = process.argv.slice(2);
const runs = readFileSync(file, "utf8").trim().split("\n").filter(Boolean).map((l) => JSON.parse(l));
const SIZES = ["64k", "1m", "64m"];
const TARGETS = ["nginx", "deno", "node"];
const LABEL = { nginx: "nginx", deno: "rackfeed-deno", node: "rackfeed-node" };
const OTHER_CPU_LIMIT = 0.25; // cores used by neighbours before a run counts as noisy

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m] : (s[m - 1] + s[m]) / 2;
};
const fmt = (x, d) => (x >= 100 ? x.toFixed(0) : x.toFixed(d));
const spread = (xs, d = 2) =>
  xs.length === 0 ? "–" : xs.length === 1 ? fmt(xs[0], d) : `${fmt(median(xs), d)} (${fmt(Math.min(...xs), d)}–${fmt(Math.max(...xs), d)})`;
const ms = (us) => us / 1000;

// CPU the machine spent outside the server's tree and wrk: neighbours (and kernel threads).
// Softirq time (loopback TCP) is NOT subtracted: with tick-based accounting the kernel charges
// it to the task it interrupted, i.e. mostly to the server or wrk; it is shown on its own only
// to tell how much of all the CPU was network stack.
const otherCpu = (r) => r.busy_cpu_s - r.server_cpu_s - r.wrk_cpu_s;

const flags = [];
const find = (rep, size, target) => runs.find((r) => r.rep === rep && r.size === size && r.target === target);
for (const r of runs) {
  const id = `rep ${r.rep} ${r.size} ${LABEL[r.target]}`;
  if (!r.server_alive) flags.push(`${id}: server process gone after the run`);
  if (!r.wrk) {
    flags.push(`${id}: wrk produced no result (crashed or timed out)`);
    continue;
  }
  const e = r.wrk.errors;
  const nerr = e.connect + e.read + e.write + e.status + e.timeout;
  if (nerr > 0) {
    flags.push(`${id}: ERRORS connect=${e.connect} read=${e.read} write=${e.write} status>=400=${e.status} timeout=${e.timeout} (of ${r.wrk.requests} requests)`);
  }
  if (r.wrk.requests === 0) flags.push(`${id}: zero completed requests`);
  // wrk's byte count includes headers and the partial bodies in flight at the end, so it can only
  // be short of (answers with status < 400) x body when bodies were short.
  else if (r.wrk.bytes < (r.wrk.requests - e.status) * r.body_bytes) {
    flags.push(`${id}: SHORT BODIES: ${r.wrk.bytes} bytes read for ${r.wrk.requests - e.status} x ${r.body_bytes}`);
  }
  const other = otherCpu(r) / r.wall_s;
  if (other > OTHER_CPU_LIMIT) {
    flags.push(`${id}: noisy: other processes used ${other.toFixed(2)} cores` +
      (r.steal_cpu_s > 0.05 * r.wall_s ? ` (of which steal ${(r.steal_cpu_s / r.wall_s).toFixed(2)})` : ""));
  }
}
if (+badFetches > 0) flags.push(`${badFetches} warm-up fetches returned a non-200 status or a body whose sha256 differs (see objects-run/warm.log)`);

const lines = [
  "| size | target | req/s | GB/s | p50 ms | p99 ms | ÷ nginx (req/s, per rep) | CPU cores: server / wrk / other (all softirq) | GB per server CPU-s | errors |",
  "|---|---|---:|---:|---:|---:|---:|---|---:|---:|",
];
for (const size of SIZES) {
  for (const target of TARGETS) {
    const rs = runs.filter((r) => r.size === size && r.target === target && r.wrk);
    if (rs.length === 0) continue;
    const rps = rs.map((r) => r.wrk.rps);
    const gbs = rs.map((r) => (r.wrk.rps * r.body_bytes) / 1e9);
    const p50 = rs.map((r) => ms(r.wrk.lat_us.p50));
    const p99 = rs.map((r) => ms(r.wrk.lat_us.p99));
    const ratios = target === "nginx" ? [] : rs
      .map((r) => [r, find(r.rep, size, "nginx")])
      .filter(([, n]) => n?.wrk?.rps > 0)
      .map(([r, n]) => r.wrk.rps / n.wrk.rps);
    const cpu = (f) => median(rs.map((r) => f(r) / r.wall_s)).toFixed(2);
    const eff = median(rs.map((r) => (r.wrk.requests * r.body_bytes) / 1e9 / r.server_cpu_s));
    const errs = rs.reduce((a, r) => a + Object.values(r.wrk.errors).reduce((x, y) => x + y, 0), 0);
    lines.push(`| ${size} | ${LABEL[target]} | ${spread(rps, 0)} | ${spread(gbs, 2)} | ${spread(p50, 2)} | ${spread(p99, 2)} | ${target === "nginx" ? "1" : spread(ratios, 2)} | ${cpu((r) => r.server_cpu_s)} / ${cpu((r) => r.wrk_cpu_s)} / ${cpu(otherCpu)} (${cpu((r) => r.softirq_cpu_s ?? 0)}) | ${eff.toFixed(2)} | ${errs ? `**${errs}**` : 0} |`);
  }
}
console.log(lines.join("\n"));
console.log();
console.log(`Values: median over ${new Set(runs.map((r) => r.rep)).size} reps (min–max). CPU: median cores used during the run;`);
console.log("other: CPU used by neither the server nor wrk (neighbours); all softirq: the machine's softirq time (loopback");
console.log("TCP), already counted mostly in the server's and wrk's columns.");
console.log("GB per server CPU-s: body bytes served per CPU-second of the server's process tree — its efficiency,");
console.log("which still holds when wrk, not the server, is the bottleneck (wrk near 1+ cores, server well under 1).");
console.log("req/s counts every answer, errors included (wrk counts status >= 400 as errors).");
if (flags.length) {
  console.log("\n**Flagged runs:**\n");
  for (const f of flags) console.log(`- ${f}`);
} else {
  console.log("No run flagged (no socket errors, no status >= 400, no short bodies, servers alive, quiet neighbours).");
}
const hardFail = flags.some((f) => !f.includes("noisy"));
process.exit(hardFail ? 1 : 0);
