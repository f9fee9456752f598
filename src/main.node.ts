/** @module Node entry: `npm start -- <command> ...` (run through tsx). */

import { runCli } from "./cli/run-cli.ts";
import { nodeHost } from "./runtime/node.ts";

process.exitCode = await runCli(nodeHost());
