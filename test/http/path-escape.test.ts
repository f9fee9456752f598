import { symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { makeWorkspace, rawGet, type RunningServer, startServer, type Workspace } from "../helpers/rackfeed.ts";

const SECRET = "TOP-SECRET-OUTSIDE-THE-ORIGIN";

let ws: Workspace;
let rf: RunningServer;

beforeAll(async () => {
  ws = await makeWorkspace();
  await writeFile(join(ws.dir, "secret.txt"), SECRET); // a sibling of the origin root
  await ws.put("sub/inside.txt", "inside");
  await ws.put("line\u2028sep\u2029para.txt", "separators");
  await symlink(join(ws.dir, "secret.txt"), join(ws.origin, "link-out.txt"));
  await symlink(ws.dir, join(ws.origin, "dir-out"));
  rf = await startServer(ws);
});
afterAll(async () => {
  await rf.close();
  await ws.remove();
});

describe("object keys cannot escape their origin", () => {
  it("serves a key inside the origin (the raw client works)", async () => {
    const res = await rawGet(rf.url, "/v1/objects/data/sub/inside.txt");
    expect(res.status).toBe(200);
    expect(res.text).toContain("inside");
  });

  const attempts = [
    "/v1/objects/data/../secret.txt",
    "/v1/objects/data/sub/../../secret.txt",
    "/v1/objects/data/%2e%2e/secret.txt",
    "/v1/objects/data/%2E%2E/secret.txt",
    "/v1/objects/data/.%2e/secret.txt",
    "/v1/objects/data/sub/%2e%2e%2f%2e%2e%2fsecret.txt",
    "/v1/objects/data/..%2fsecret.txt",
    "/v1/objects/data/%2fetc%2fpasswd",
    "/v1/objects/data//etc/passwd",
    "/v1/objects/data/sub%5c..%5c..%5csecret.txt",
    "/v1/objects/data/secret.txt%00.bin",
    "/v1/objects/data/./sub/inside.txt",
    "/v1/objects/data/%252e%252e/secret.txt",
  ];
  for (const target of attempts) {
    it(`refuses ${target} with a 4xx and never sends the outside file`, async () => {
      const res = await rawGet(rf.url, target);
      expect(res.status, res.text).toBeGreaterThanOrEqual(400);
      expect(res.status, res.text).toBeLessThan(500);
      expect(res.text).not.toContain(SECRET);
    });
  }

  it("answers dot segments and encoded separators with 400 and a message naming the segment", async () => {
    const res = await rawGet(rf.url, "/v1/objects/data/%2e%2e/secret.txt");
    expect(res.status).toBe(400);
    expect(res.text).toContain("%2e%2e");
  });

  it("serves an absolute-form request target (RFC 9112 3.2.2) like its path, and refuses its escapes too", async () => {
    const ok = await rawGet(rf.url, `${rf.url}/v1/objects/data/sub/inside.txt`);
    expect(ok.status, ok.text).toBe(200);
    expect(ok.text.endsWith("inside")).toBe(true);
    const escape = await rawGet(rf.url, `${rf.url}/v1/objects/data/%2e%2e/secret.txt`);
    expect(escape.status).toBe(400);
    expect(escape.text).not.toContain(SECRET);
  });

  it("answers an origin name whose percent-escape is not UTF-8 with 400, not 500", async () => {
    for (const target of ["/v1/objects/%ZZ/inside.txt", "/v1/objects/%FF/inside.txt"]) {
      const res = await rawGet(rf.url, target);
      expect(res.status, target).toBe(400);
      expect(res.text).toMatch(/Invalid origin name/);
    }
  });

  it("answers a key with a name too long, or a symlink loop, with 404 (no object), not 502 (origin failure)", async () => {
    await symlink(join(ws.origin, "loop-b"), join(ws.origin, "loop-a"));
    await symlink(join(ws.origin, "loop-a"), join(ws.origin, "loop-b"));
    for (const target of [`/v1/objects/data/${"x".repeat(300)}`, "/v1/objects/data/loop-a"]) {
      const res = await rawGet(rf.url, target);
      expect(res.status, target).toBe(404);
    }
  });

  it("names the missing key when a GET has none, instead of calling objects read-only", async () => {
    for (const target of ["/v1/objects/data", "/v1/objects/data/"]) {
      const res = await rawGet(rf.url, target);
      expect(res.status, target).toBe(400);
      expect(res.text, target).toMatch(/No object key in \/v1\/objects\/data\/?: expected \/v1\/objects\/\{origin\}\/\{key\}/);
    }
  });

  it("serves a key holding U+2028 or U+2029 (legal key characters) with its bytes", async () => {
    const res = await fetch(`${rf.url}/v1/objects/data/line%E2%80%A8sep%E2%80%A9para.txt`);
    expect(res.status).toBe(200);
    expect(await res.text()).toBe("separators");
  });

  it("refuses a key holding CR or LF with the control-character 400 naming the segment, not \"No object key\"", async () => {
    // The message names the segment as encodeURIComponent writes it (upper-case escapes).
    for (const [seg, named] of [["a%0ab", "a%0Ab"], ["a%0db", "a%0Db"], ["a%0d%0ab", "a%0D%0Ab"]]) {
      const res = await rawGet(rf.url, `/v1/objects/data/sub/${seg}`);
      expect(res.status, seg).toBe(400);
      expect(res.text, seg).toContain(`Invalid object key segment \\"${named}\\": control characters are not allowed`);
    }
  });

  it("does not follow a symlink that leads outside the origin root", async () => {
    for (const target of ["/v1/objects/data/link-out.txt", "/v1/objects/data/dir-out/secret.txt"]) {
      const res = await rawGet(rf.url, target);
      expect(res.status, target).toBe(404);
      expect(res.text).not.toContain(SECRET);
    }
  });
});
