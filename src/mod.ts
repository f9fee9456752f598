/** @module rackfeed's public library surface: build a server, or its parts, in your own process. Side-effect free. */

export { createApp, type AppDeps } from "./app.ts";
export { createServer, type RackfeedServer, type ServerEnv } from "./server.ts";
export { type Config, ConfigError, loadConfig } from "./config/load.ts";
export { TUNABLES } from "./config/defaults.ts";
export { CacheServerError, type ErrorCode, isCacheServerError, OriginError } from "./errors.ts";
export type { ObjectInfo, Origin } from "./origin/origin.ts";
export { FsOrigin } from "./origin/fs-origin.ts";
