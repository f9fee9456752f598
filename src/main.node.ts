/** @module Node entry: `npm start -- <command> ...` (run through tsx). */

import { runCli } from "./cli/run-cli.ts";
import { nodeHost } from "./runtime/node.ts";

const code = await runCli(nodeHost());
process.exitCode = code;
// Handles of work abandoned at shutdown (a socket to an origin that stopped answering) would
// keep Node running: exit once output has had a moment to drain. Unref'd: a clean exit is not delayed.
setTimeout(() => process.exit(code), 1000).unref();
