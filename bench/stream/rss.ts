// bench/stream: stream a 10 GiB object (a sparse file) through rackfeed on Deno and on Node with
// a 256 MiB memory tier, sampling the server's RSS every 512 MiB; prints RSS at each point, the
// growth over the second half (flat = ~0), and throughput beside `cat` of the same file into
// /dev/null (the baseline: the page cache / filesystem's own speed).
//
// Run: node --import tsx bench/stream/rss.ts      Knobs: BENCH_GIB=10

import { execFileSync } from "node:child_process";
import { open } from "node:fs/promises";
import { makeWorkspace } from "../../test/helpers/rackfeed.ts";
import { DENO, NODE, NODE_TS, ROOT, startChild } from "../../test/helpers/spawn.ts";

const GIB = Number(process.env.BENCH_GIB ?? 10);
const SIZE = GIB * 2 ** 30;
const ws = await makeWorkspace();
try {
  const fh = await open(`${ws.origin}/huge.bin`, "w");
  await fh.truncate(SIZE);
  await fh.close();
  const t0 = performance.now();
  execFileSync("sh", ["-c", `cat ${ws.origin}/huge.bin > /dev/null`]);
  const catGBs = SIZE / ((performance.now() - t0) / 1000) / 1e9;
  console.log(`${GIB} GiB sparse object; baseline cat > /dev/null: ${catGBs.toFixed(2)} GB/s\n`);
  console.log("| runtime | GB/s | vs cat | RSS at start MiB | peak RSS MiB | 2nd-half growth MiB | RSS every 512 MiB streamed (MiB) |");
  console.log("|---|---|---|---|---|---|---|");
  for (const [name, cmd, pre] of [
    ["deno", DENO, ["run", "-A", `${ROOT}src/main.ts`]],
    ["node", NODE, [...NODE_TS, `${ROOT}src/main.node.ts`]],
  ] as const) {
    const server = await startChild(cmd, [...pre, "serve", "--listen", "127.0.0.1:0", "--origin", `data=${ws.origin}`,
      "--cache-dir", `${ws.dir}/cache-${name}`, "--memory-bytes", "256MiB", "--disk-bytes", "1GiB"]);
    try {
      const start = server.rss();
      const samples: number[] = [];
      let next = 0;
      let bytes = 0;
      const t1 = performance.now();
      const res = await fetch(`${server.url}/v1/objects/data/huge.bin`);
      const reader = res.body!.getReader();
      for (;;) {
        const r = await reader.read();
        if (r.done) break;
        bytes += r.value.length;
        if (bytes >= next) {
          samples.push(server.rss());
          next += 512 * 2 ** 20;
        }
      }
      const gbs = bytes / ((performance.now() - t1) / 1000) / 1e9;
      if (bytes !== SIZE) throw new Error(`${name}: streamed ${bytes} bytes, expected ${SIZE}`);
      const half = Math.floor(samples.length / 2);
      const growth = Math.max(...samples.slice(half)) - Math.max(...samples.slice(0, half));
      const mib = (n: number) => (n / 2 ** 20).toFixed(0);
      console.log(`| ${name} | ${gbs.toFixed(2)} | ${(gbs / catGBs).toFixed(2)}× | ${mib(start)} | ${mib(Math.max(...samples))} | ${mib(growth)} | ${samples.map(mib).join(" ")} |`);
    } finally {
      await server.stop();
    }
  }
} finally {
  await ws.remove();
}
