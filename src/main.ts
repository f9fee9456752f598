/** @module Deno entry: `deno run -A src/main.ts <command> ...`. */

import { runCli } from "./cli/run-cli.ts";
import { denoHost } from "./runtime/deno.ts";

Deno.exit(await runCli(denoHost()));
