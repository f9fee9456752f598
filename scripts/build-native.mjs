// Builds native/build/librackfeed.so (the batch gather, native/gather.c, and the TCP options of
// Deno's HTTP listener, native/tcp.c) with the system's C compiler when it is missing or older than
// a source. Without a compiler rackfeed still runs: the runtimes then copy batches in JavaScript,
// at about half the speed (README, "Native gather"), and Deno's listener goes without its TCP options.
// Run by scripts/ensure-deps.mjs before `npm start` and `npm test`; by hand: node scripts/build-native.mjs
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, renameSync, rmSync, statSync } from "node:fs";
import { fileURLToPath } from "node:url";

const sources = ["gather.c", "tcp.c"].map((f) => fileURLToPath(new URL(`../native/${f}`, import.meta.url)));
const dir = fileURLToPath(new URL("../native/build/", import.meta.url));
const lib = `${dir}librackfeed.so`;

if (!existsSync(lib) || sources.some((source) => statSync(lib).mtimeMs < statSync(source).mtimeMs)) {
  const cc = process.env.CC ?? "cc";
  mkdirSync(dir, { recursive: true });
  // Written under a name of its own and renamed: a server loading the library never sees half a
  // file, and two builds at once (npm install and npm test) do not write into each other's.
  const tmp = `${lib}.${process.pid}.tmp`;
  try {
    execFileSync(cc, ["-O2", "-shared", "-fPIC", "-o", tmp, ...sources], { stdio: ["ignore", "inherit", "inherit"] });
    renameSync(tmp, lib);
  } catch (e) {
    rmSync(tmp, { force: true });
    console.error(`rackfeed: could not build ${lib} with ${cc} (${e.code ?? e.status ?? e.message}); batches will be copied in JavaScript`);
  }
}
