/**
 * The test fault proxy (test/helpers/fault-proxy.ts) as a process of its own, with named fault
 * phases switched by lines on stdin, and an origin that can go fully down (connections refused)
 * and come back on the same port. Used by bench/soak/s3-origin-faults.ts; standalone:
 *
 *   set -a; . /tmp/rackfeed-rgw.env; set +a
 *   node --import tsx bench/soak/fault-proxy-standalone.ts "$S3_ENDPOINT" [PORT] [SEED]
 *   # prints "fault proxy listening on http://127.0.0.1:PORT"; then type a phase name per line:
 *   #   clean | latency | faults | throttle | refuse | blackhole | stats
 *
 * clean: pass everything. latency: 5-60 ms before each request, a quarter capped at 20-80 MB/s.
 * faults: a random mix of latency, stalls, resets mid-body, 503 SlowDown, 500 and trickles.
 * throttle: half the requests get 503 SlowDown. refuse: the port refuses connections (listener
 * closed, open connections reset). blackhole: connections are accepted, requests never answered.
 * stats: prints the proxy's counters as one JSON line.
 */
import { createServer as netServer, type Server, type Socket, connect } from "node:net";
import { createInterface } from "node:readline";
import { type Fault, type FaultRule, startFaultProxy } from "../../test/helpers/fault-proxy.ts";

const [upstream, portArg = "0", seedArg = "1"] = process.argv.slice(2);
if (!upstream) {
  console.error("usage: fault-proxy-standalone.ts UPSTREAM_URL [PORT] [SEED]");
  process.exit(2);
}

let seed = Number(seedArg) >>> 0 || 1;
/** xorshift32: a reproducible fault sequence per seed. */
const rnd = () => {
  seed ^= seed << 13;
  seed >>>= 0;
  seed ^= seed >>> 17;
  seed ^= seed << 5;
  seed >>>= 0;
  return seed / 2 ** 32;
};
const between = (a: number, b: number) => Math.floor(a + rnd() * (b - a));

const RULES: Record<string, FaultRule> = {
  clean: () => ({ kind: "pass" }),
  latency: () => rnd() < 0.25 ? { kind: "delay", ms: between(5, 60), bytesPerSec: between(20, 80) * 1e6 } : { kind: "delay", ms: between(5, 60) },
  faults: (): Fault => {
    const x = rnd();
    if (x < 0.55) return { kind: "pass" };
    if (x < 0.70) return { kind: "delay", ms: between(0, 300) };
    if (x < 0.76) return { kind: "stall", afterBytes: between(0, 200_000) };
    if (x < 0.84) return { kind: "reset", afterBytes: between(0, 200_000) };
    if (x < 0.93) return { kind: "slowdown" };
    if (x < 0.97) return { kind: "error500" };
    return { kind: "trickle", bytes: 4096, everyMs: between(30, 120) };
  },
  throttle: () => (rnd() < 0.5 ? { kind: "slowdown" } : { kind: "pass" }),
  // Accepted, never answered (the proxy drops the forward if the client leaves first).
  blackhole: () => ({ kind: "delay", ms: 3_600_000 }),
};

const inner = await startFaultProxy(upstream, RULES.clean);
const innerPort = Number(new URL(inner.url).port);

// A TCP front on the advertised port, so that "refuse" can close the port for real and reopen it.
const fronts = new Set<Socket>();
let front: Server | undefined;
let port = Number(portArg);
const openFront = () =>
  new Promise<void>((resolve, reject) => {
    const srv = netServer((c) => {
      fronts.add(c);
      const up = connect(innerPort, "127.0.0.1");
      fronts.add(up);
      c.pipe(up).pipe(c);
      const drop = () => {
        c.destroy();
        up.destroy();
      };
      c.on("error", drop).on("close", () => (fronts.delete(c), drop()));
      up.on("error", drop).on("close", () => (fronts.delete(up), drop()));
    });
    srv.once("error", reject);
    srv.listen(port, "127.0.0.1", () => {
      port = (srv.address() as { port: number }).port;
      front = srv;
      resolve();
    });
  });
const closeFront = () =>
  new Promise<void>((resolve) => {
    const srv = front;
    front = undefined;
    for (const s of fronts) s.resetAndDestroy();
    fronts.clear();
    if (!srv) return resolve();
    srv.close(() => resolve());
  });

await openFront();
console.log(`fault proxy listening on http://127.0.0.1:${port}`);

let phase = "clean";
async function setPhase(name: string): Promise<void> {
  if (name === "stats") {
    console.log(`stats ${JSON.stringify({ phase, ...inner.counts })}`);
    return;
  }
  if (name !== "refuse" && !(name in RULES)) {
    console.log(`unknown phase "${name}" (clean, latency, faults, throttle, refuse, blackhole, stats)`);
    return;
  }
  if (name === "refuse") await closeFront();
  else {
    // Leaving the blackhole: connections holding never-answered requests are dropped too, as a restarted origin would.
    if (phase === "blackhole") await closeFront();
    if (!front) {
      // The port may be briefly taken by nothing else on loopback; retry a few times.
      for (let i = 0;; i++) {
        try {
          await openFront();
          break;
        } catch (e) {
          if (i >= 50) throw e;
          await new Promise((r) => setTimeout(r, 100));
        }
      }
    }
    inner.setRule(RULES[name]);
  }
  phase = name;
  console.log(`phase ${name}`);
}

const rl = createInterface({ input: process.stdin });
let chain = Promise.resolve();
rl.on("line", (line) => {
  const name = line.trim();
  if (name) chain = chain.then(() => setPhase(name));
});
rl.on("close", () => void chain.then(async () => {
  await closeFront();
  await inner.close();
  process.exit(0);
}));
process.on("SIGTERM", () => process.exit(0));
