import { describe, expect, it } from "vitest";
import { DENO, NODE, NODE_TS, ROOT, runToExit } from "../helpers/spawn.ts";

/** Under the test's own timeout, so that a hung import is killed and reported with its output. */
const CHILD_MS = 20_000;

// What a trainer imports: the package's own export names (package.json "exports"), resolved as a
// dependent resolves them (here through the package's self-reference, from its root).
const NODE_IMPORTS = `
  const client = await import("rackfeed/client");
  const node = await import("rackfeed/client/node");
  const server = await import("rackfeed");
  console.log(JSON.stringify([typeof client.RackfeedClient, typeof node.createClient, typeof node.localTransport, typeof node.http2Fetch, typeof server.createApp]));
`;
const DENO_IMPORTS = `
  const client = await import("rackfeed/client");
  const deno = await import("rackfeed/client/deno");
  const server = await import("rackfeed");
  console.log(JSON.stringify([typeof client.RackfeedClient, typeof deno.createClient, typeof deno.localTransport, typeof server.createApp]));
`;

describe("package exports", () => {
  it("resolves rackfeed, rackfeed/client and rackfeed/client/node on Node", async () => {
    const { code, out } = await runToExit(NODE, [...NODE_TS, "--input-type=module", "-e", NODE_IMPORTS], ROOT, CHILD_MS);
    expect(code, out).toBe(0);
    expect(JSON.parse(out.trim().split("\n").at(-1)!)).toEqual(["function", "function", "function", "function", "function"]);
  });

  it("resolves rackfeed, rackfeed/client and rackfeed/client/deno on Deno", async () => {
    const { code, out } = await runToExit(DENO, ["eval", DENO_IMPORTS], ROOT, CHILD_MS);
    expect(code, out).toBe(0);
    expect(JSON.parse(out.trim().split("\n").at(-1)!)).toEqual(["function", "function", "function", "function"]);
  });
});
