// Runs `npm install` when node_modules is missing or older than package-lock.json, so that
// `npm start` and `npm test` work as the first commands on a fresh clone.
import { execSync } from "node:child_process";
import { existsSync, statSync } from "node:fs";

const marker = new URL("../node_modules/.package-lock.json", import.meta.url);
const lock = new URL("../package-lock.json", import.meta.url);
const stale = !existsSync(marker) || (existsSync(lock) && statSync(lock).mtimeMs > statSync(marker).mtimeMs + 1000);
if (stale) {
  console.error("rackfeed: installing dependencies (npm install) ...");
  execSync("npm install --no-audit --no-fund", { stdio: "inherit", cwd: new URL("..", import.meta.url) });
}

await import("./build-native.mjs");
