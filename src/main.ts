/**
 * @module Deno entry: `deno run -A src/main.ts <command> ...`. The command line is
 * `cli/run-cli.ts` (`serve`: the configuration, then `createServer` in `server.ts`, which wires
 * every part, then the runtime's listener); `runtime/deno.ts` is what it needs of Deno.
 */

import { runCli } from "./cli/run-cli.ts";
import { denoHost } from "./runtime/deno.ts";

Deno.exit(await runCli(denoHost()));
