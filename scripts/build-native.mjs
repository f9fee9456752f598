// Builds native/build/librackfeed.so (the batch gather, native/gather.c) with the system's C
// compiler when it is missing or older than its source. Without a compiler rackfeed still runs:
// the runtimes then copy batches in JavaScript, at about half the speed (README, "Native gather").
// Run by scripts/ensure-deps.mjs before `npm start` and `npm test`; by hand: node scripts/build-native.mjs
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, renameSync, statSync } from "node:fs";

const source = new URL("../native/gather.c", import.meta.url).pathname;
const dir = new URL("../native/build/", import.meta.url).pathname;
const lib = `${dir}librackfeed.so`;

if (!existsSync(lib) || statSync(lib).mtimeMs < statSync(source).mtimeMs) {
  const cc = process.env.CC ?? "cc";
  mkdirSync(dir, { recursive: true });
  try {
    // Written under another name and renamed: a server loading the library never sees half a file.
    execFileSync(cc, ["-O2", "-shared", "-fPIC", "-o", `${lib}.tmp`, source], { stdio: ["ignore", "inherit", "inherit"] });
    renameSync(`${lib}.tmp`, lib);
  } catch (e) {
    console.error(`rackfeed: could not build ${lib} with ${cc} (${e.code ?? e.status ?? e.message}); batches will be copied in JavaScript`);
  }
}
