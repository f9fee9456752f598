// The fault proxy of bench/fill in a process of its own, so that BENCH_PIN can put it on the
// origin's core: prints its URL on stdout, runs until killed.
// Usage: node --import tsx bench/fill/proxy.ts UPSTREAM LATENCY_MS CONN_MBPS(0 = no cap) [LINK_MBPS(0 = no cap)]
import { latency, startFaultProxy } from "../../test/helpers/fault-proxy.ts";

const [upstream, ms, mbps, link = "0"] = process.argv.slice(2);
const proxy = await startFaultProxy(
  upstream,
  latency(Number(ms), Number(mbps) > 0 ? Number(mbps) * 1e6 : undefined),
  Number(link) > 0 ? { linkBytesPerSec: Number(link) * 1e6 } : {},
);
console.log(proxy.url);
