import { readFileSync } from "node:fs";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";

let ws: Workspace;
let rf: RunningServer;
let spec: { openapi: string; paths: Record<string, Record<string, { summary?: string; parameters?: unknown[]; responses?: Record<string, unknown> }>> };
const ADMIN = "admin-token-for-openapi-tests";
const READ = "read-token-for-openapi-tests";

beforeAll(async () => {
  ws = await makeWorkspace();
  rf = await startServer(ws, ["--admin-token", ADMIN, "--read-token", READ]);
  spec = await (await fetch(`${rf.url}/openapi.json`, { headers: { authorization: `Bearer ${READ}` } })).json();
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

/** hono path → OpenAPI path: `:name{regex}` and `:name` become `{name}`. */
const toOpenApiPath = (p: string) => p.replace(/:(\w+)(\{[^}]*\})?/g, "{$1}");

/** Every concrete route the app serves, as `METHOD /path`. */
function servedRoutes(): string[] {
  return rf.server.app.routes
    .filter((r) => r.method !== "ALL" && !r.path.includes("*"))
    .map((r) => `${r.method} ${toOpenApiPath(r.path)}`);
}

describe("GET /openapi.json", () => {
  it("is an OpenAPI 3.1 document generated from the routes: every route the app serves is described", () => {
    expect(spec.openapi).toBe("3.1.0");
    const described = Object.entries(spec.paths).flatMap(([p, ops]) => Object.keys(ops).map((m) => `${m.toUpperCase()} ${p}`));
    const served = [...new Set(servedRoutes())];
    expect(served.length).toBeGreaterThan(12);
    expect(served.filter((r) => !described.includes(r))).toEqual([]);
    for (const [p, ops] of Object.entries(spec.paths)) {
      for (const [m, op] of Object.entries(ops)) expect(op.summary, `${m} ${p}`).toBeTruthy();
    }
  });

  it("describes path and query parameters", () => {
    const batches = spec.paths["/v1/datasets/{name}/batches/{step}"].get;
    const names = (batches.parameters as { name: string }[]).map((p) => p.name);
    expect(names).toEqual(expect.arrayContaining(["name", "step", "rank", "world", "micro_batch"]));
  });

  it("is kept in step with the README's API section", () => {
    const readme = readFileSync(new URL("../../README.md", import.meta.url), "utf8");
    const listed = new Set<string>();
    for (const m of readme.matchAll(/`((?:GET|PUT|POST|DELETE|HEAD)(?:\\?\|(?:GET|PUT|POST|DELETE|HEAD))*) (\/[^`?\s]*)/g)) {
      for (const method of m[1].split(/\\?\|/)) listed.add(`${method} ${m[2]}`);
    }
    const described = Object.entries(spec.paths).flatMap(([p, ops]) => Object.keys(ops).map((m) => `${m.toUpperCase()} ${p}`));
    expect(described.filter((r) => !listed.has(r))).toEqual([]);
  });

  it("lists the statuses the routes really answer with", async () => {
    const documented = (path: string, method: string) => Object.keys(spec.paths[path][method].responses ?? {}).map(Number);
    const status = async (path: string, init: RequestInit = {}) => (await fetch(`${rf.url}${path}`, init)).status;
    const read = { headers: { authorization: `Bearer ${READ}` } };
    const admin = { headers: { authorization: `Bearer ${ADMIN}` } };
    const seen: [string, string, number][] = [
      ["/v1/datasets/{name}", "get", await status("/v1/datasets/nope", read)],
      ["/v1/datasets/{name}", "get", await status("/v1/datasets/nope")],
      ["/v1/datasets/{name}/batches/{step}", "get", await status("/v1/datasets/nope/batches/0?micro_batch=1", read)],
      ["/v1/shm", "get", await status("/v1/shm", read)], // the shm path is off here
      ["/v1/objects/{origin}/{key}", "get", await status("/v1/objects/data/missing.bin")],
      ["/prefetch/{id}", "get", await status("/prefetch/nope", admin)],
      ["/prefetch/{id}", "delete", await status("/prefetch/nope", { ...admin, method: "DELETE" })],
    ];
    expect(seen.map(([, , s]) => s)).toEqual([404, 401, 404, 404, 401, 404, 404]);
    for (const [path, method, s] of seen) expect(documented(path, method), `${method} ${path} answered ${s}`).toContain(s);
    for (const s of [502, 503, 504]) expect(documented("/v1/objects/{origin}/{key}", "get")).toContain(s);
  });
});
