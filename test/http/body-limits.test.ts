import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";

const ADMIN = "admin-token-for-tests";
let ws: Workspace;
let rf: RunningServer | undefined;

beforeEach(async () => {
  ws = await makeWorkspace();
});
afterEach(async () => {
  await rf?.close();
  rf = undefined;
  await ws.remove();
});

const headers = { authorization: `Bearer ${ADMIN}`, "content-type": "application/json" };
/** A JSON body of just over `bytes`: a string padded to size. */
const jsonOver = (bytes: number) => JSON.stringify({ pad: "x".repeat(bytes) });

describe("request body bounds", () => {
  it.each([
    ["PUT", "/v1/datasets/d", 1 << 20, /Dataset registration too large: at most 1048576 bytes/],
    ["POST", "/prefetch", 1 << 20, /Prefetch request too large: at most 1 MiB/],
    ["POST", "/v1/telemetry", 2 << 20, /Telemetry report too large: at most 2 MiB/],
  ] as const)("%s %s over its bound answers 413 with the bound", async (method, path, bound, message) => {
    rf = await startServer(ws, ["--admin-token", ADMIN]);
    const res = await fetch(`${rf.url}${path}`, { method, headers, body: jsonOver(bound) });
    expect(res.status).toBe(413);
    const body = await res.json();
    expect(body.error).toBe("PAYLOAD_TOO_LARGE");
    expect(body.message).toMatch(message);
    // A body within the bound reaches the route (and fails there for its content, not its size).
    const small = await fetch(`${rf.url}${path}`, { method, headers, body: JSON.stringify({ pad: "x" }) });
    expect(small.status).toBe(400);
  });
});
