// Regenerates the configuration table in README.md from src/config/defaults.ts.
import { readFileSync, writeFileSync } from "node:fs";
import { withTunablesTable } from "../src/config/tunables-doc.ts";

const path = new URL("../README.md", import.meta.url);
writeFileSync(path, withTunablesTable(readFileSync(path, "utf8")));
console.log("README.md: configuration table regenerated");
